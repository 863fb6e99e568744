"""The reproduce table's hierarchical interval (seeds, then queries; pairs clustered by image) on small synthetic
stored runs, against an independent numpy recomputation: per-query hits by brute force, a bootstrap written as
plain loops with its own random stream; and docs/results.md's table laid out as ``reproduce --table`` prints it."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from engine.metrics.compatibility import compatibility_matrices
from engine.metrics.verification import pair_verification, sample_pairs
from engine.reproduce.claims import CLAIMS, CONTROL, GROUPS, Claim, PaperCell
from engine.reproduce.outcomes import seed_items
from engine.reproduce.sensitivity import SENSITIVITY_COLUMNS, render_sensitivity, sensitivity_header
from engine.reproduce.table import MARKDOWN_COLUMNS, claim_rows, markdown_header, render
from engine.results.record import NewVersion, record_experiment
from storage import get_engine, init_db

ROOT = Path(__file__).resolve().parents[1]
T, CLASSES, PER_CLASS, DIM = 3, 4, 6, 6
LABELS = np.repeat(np.arange(CLASSES), PER_CLASS)


def _features(rng: np.random.Generator, method: str) -> list[np.ndarray]:
    """T models' features of the same test images: ``cores`` drifts slowly from one model to the next (often
    compatible), the control draws each model anew (incompatible)."""
    centres = rng.normal(size=(CLASSES, DIM))
    base = centres[LABELS] + rng.normal(scale=1.1, size=(len(LABELS), DIM))
    out, current = [], base
    for _ in range(T):
        out.append(current.astype(np.float32))
        current = (current + rng.normal(scale=0.4, size=current.shape) if method == "cores"
                   else rng.normal(size=(CLASSES, DIM))[LABELS] + rng.normal(scale=1.1, size=base.shape))
    return out


def _store(db, feats: list[np.ndarray], metric: str, name: str) -> int:
    versions = [NewVersion(architecture="external", method="x", classes=list(range(CLASSES)), num_outputs=0,
                           feature_dim=DIM, outputs={"query": {"encoder": f}, "gallery": {"encoder": f}},
                           labels={"query": LABELS, "gallery": LABELS}) for f in feats]
    sets = [{"query_features": f, "query_labels": LABELS, "gallery_features": f, "gallery_labels": LABELS} for f in feats]
    result = compatibility_matrices(sets, metrics=(metric,), same_set=True)
    return record_experiment(db, name=name, method="x", config={"name": name, "eval": {"protocol": "closed-set"}}, versions=versions,
                             results={"encoder": result}, gallery_kind="instance")


def _study(tmp_path, metric: str, seeds: int = 3) -> tuple[object, Claim, dict, dict]:
    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(db)
    rng = np.random.default_rng(7)
    runs, feats = {}, {}
    for seed in range(seeds):
        for method in ("cores", CONTROL):
            feats[(seed, method)] = _features(rng, method)
            runs[(seed, method)] = _store(db, feats[(seed, method)], metric, f"{method} {seed}")
    conv = {"protocol": "closed-set", "eval_classes": "all", "gallery": "pairs" if metric == "verification" else "instance",
            "metric": metric}
    claim = Claim(name="SYN", source="synthetic", paper_convention=conv, our_convention=conv, differs=(),
                  cells=(PaperCell("cores", "(phi2, phi1) margin", 0.01, (1, 0)),
                         PaperCell("cores", "(phi3, phi2) margin", 0.01, (2, 1)), PaperCell("cores", "AC", 1.0)),
                  scenario={})
    return db, claim, runs, feats


def _cells() -> list[tuple[int, int]]:
    return [(t, k) for t in range(T) for k in range(t + 1)]


def _hits(q: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Recall@1 per query by brute force: cosine, own image left out."""
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    gn = g / np.linalg.norm(g, axis=1, keepdims=True)
    s = qn.astype(np.float64) @ gn.T.astype(np.float64)
    np.fill_diagonal(s, -np.inf)
    return (LABELS[s.argmax(1)] == LABELS).astype(np.float64)


def _stat(m: np.ndarray, cell: tuple[int, int] | None) -> float:
    """A cell's margin, or AC (strict ECC), from one draw's per-cell means (``m[(t, k)]``)."""
    if cell is None:
        cross = [(t, k) for t in range(T) for k in range(t)]
        return float(np.mean([m[(t, k)] > m[(k, k)] for t, k in cross]))
    t, k = cell
    return m[(t, k)] - m[(k, k)]


def _loop_bootstrap(per_seed: list[dict], cell, *, images: list[np.ndarray] | None, draws: int, rng) -> np.ndarray:
    """Replicates of the mean over resampled seeds of each drawn seed's statistic over its resampled items (queries
    drawn with replacement; pairs: images drawn with replacement, a pair weighted by its two images' draw counts)."""
    S = len(per_seed)
    out = np.empty(draws)
    for r in range(draws):
        vals = []
        for s in rng.integers(0, S, S):
            outcomes = per_seed[s]
            if images is None:
                idx = rng.integers(0, len(LABELS), len(LABELS))
                m = {c: outcomes[c][idx].mean() for c in outcomes}
            else:
                im = images[s]
                used = np.unique(im)
                counts = np.zeros(im.max() + 1)
                np.add.at(counts, used[rng.integers(0, len(used), len(used))], 1)
                w = counts[im[:, 0]] * counts[im[:, 1]]
                m = {c: (w * outcomes[c]).sum() / w.sum() for c in outcomes}
            vals.append(_stat(m, cell))
        out[r] = np.mean(vals)
    return out


def test_hierarchical_rows_match_a_loop_bootstrap_over_seeds_then_queries(tmp_path):
    db, claim, runs, feats = _study(tmp_path, "recall@1")
    per_seed = {m: [{(t, k): _hits(feats[(s, m)][t], feats[(s, m)][k]) for t, k in _cells()} for s in range(3)]
                for m in ("cores", CONTROL)}
    # the outcomes the table bootstraps are the brute-force hits, one row per test image, one column per cell
    items, C = seed_items(db, runs[(1, "cores")], view="encoder", metric="recall@1", gallery="instance", eval_classes="all")
    assert items.images is None and items.outcomes.shape == (len(LABELS), len(_cells()))
    for col, cell in enumerate(_cells()):
        np.testing.assert_array_equal(items.outcomes[:, col], per_seed["cores"][1][cell])
        assert C[cell] == pytest.approx(per_seed["cores"][1][cell].mean())

    draws = 3000
    rows = {(r.method, r.label): r for r in claim_rows(db, claim, runs, resamples=draws)}
    rng = np.random.default_rng(123)  # another stream than the table's: the ends agree up to Monte-Carlo error
    for (method, label), cell in [(("cores", "(phi2, phi1) margin"), (1, 0)), (("cores", "(phi3, phi2) margin"), (2, 1)),
                                  (("cores", "AC"), None), ((f"{CONTROL} (control)", "(phi2, phi1) margin"), (1, 0))]:
        row = rows[(method, label)]
        assert row.interval_kind == "hierarchical" and row.note is None
        seeds = per_seed["cores" if method == "cores" else CONTROL]
        hand = [_stat({c: v.mean() for c, v in s.items()}, cell) for s in seeds]
        assert row.values == pytest.approx(hand) and row.interval["mean"] == pytest.approx(np.mean(hand))
        reps = _loop_bootstrap(seeds, cell, images=None, draws=draws, rng=rng)
        lo, hi = np.quantile(reps, [0.025, 0.975])
        tol = 0.25 * reps.std() + 1e-9
        assert row.interval["lo"] == pytest.approx(lo, abs=tol) and row.interval["hi"] == pytest.approx(hi, abs=tol)
    # seeds only: Student's t over the same per-seed values, by hand (t 0.975 with 2 df = 4.302653)
    t_row = next(r for r in claim_rows(db, claim, runs, interval="seeds") if r.label == "(phi2, phi1) margin")
    v = np.array(t_row.values)
    half = 4.302652730 * v.std(ddof=1) / np.sqrt(3)
    assert t_row.interval_kind == "seeds"
    assert (t_row.interval["lo"], t_row.interval["hi"]) == pytest.approx((v.mean() - half, v.mean() + half), abs=1e-8)


def test_verification_pairs_are_resampled_by_image(tmp_path):
    db, claim, runs, feats = _study(tmp_path, "verification", seeds=2)
    qi, gi, _ = sample_pairs(LABELS, LABELS, same_set=True)
    images = np.stack([qi, gi], 1)  # the same test images in every cell: one set of pairs, one column per cell
    per_seed = []
    for s in range(2):
        f = feats[(s, "cores")]
        per_seed.append({(t, k): pair_verification(f[t], LABELS, f[k], LABELS, same_set=True)[1].astype(float)
                         for t, k in _cells()})
    items, _ = seed_items(db, runs[(0, "cores")], view="encoder", metric="verification", gallery="instance",
                          eval_classes="all")
    np.testing.assert_array_equal(items.images, images)
    for col, cell in enumerate(_cells()):
        np.testing.assert_array_equal(items.outcomes[:, col], per_seed[0][cell])
    draws = 2000
    row = next(r for r in claim_rows(db, claim, runs, resamples=draws) if r.method == "cores" and r.label.startswith("(phi2"))
    reps = _loop_bootstrap(per_seed, (1, 0), images=[images, images], draws=draws, rng=np.random.default_rng(5))
    lo, hi = np.quantile(reps, [0.025, 0.975])
    tol = 0.25 * reps.std() + 1e-9
    assert row.interval_kind == "hierarchical"
    assert row.interval["lo"] == pytest.approx(lo, abs=tol) and row.interval["hi"] == pytest.approx(hi, abs=tol)


def test_sensitivity_rows_as_markdown(tmp_path):
    db, claim, runs, _ = _study(tmp_path, "recall@1", seeds=2)
    from engine.reproduce.sensitivity import conventions, sensitivity_rows

    rows = sensitivity_rows(db, claim, runs, ["cores"])
    text = render_sensitivity(claim, rows, markdown=True).splitlines()
    assert len(text) == len(conventions(claim))
    for line, r in zip(text, rows):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == len(SENSITIVITY_COLUMNS)
        assert cells[:5] == ["SYN", "cores", r["metric"], r["eval_classes"], r["gallery"]]
        assert cells[6] == "seeds, then items" and cells[5].startswith(f"{r['interval']['mean']:.2f}")
        assert (cells[7] == "yes") == ((r["metric"], r["eval_classes"], r["gallery"]) == ("recall@1", "all", "instance"))
    assert sensitivity_header().splitlines()[-2] == "| " + " | ".join(SENSITIVITY_COLUMNS) + " |"


def _readme_table() -> tuple[list[str], list[list[str]]]:
    text = (ROOT / "docs/results.md").read_text(encoding="utf-8")
    section = text[text.index("## What reproduces"):]
    end = section.find("\n## ", 5)
    section = section if end < 0 else section[:end]
    lines = section.splitlines()
    head = lines.index("| " + " | ".join(MARKDOWN_COLUMNS) + " |")  # ValueError: the page's table is not the command's
    rows = []
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return lines[:head], rows


def test_readme_table_is_laid_out_as_reproduce_demo_table_prints_it(tmp_path):
    """docs/results.md's "What reproduces" table has the header, the interval line and the rows (claims, conventions,
    row labels, paper values, in order) that ``reproduce demo --table`` prints; not its numbers."""
    db = get_engine(f"sqlite:///{tmp_path / 'empty.sqlite'}")
    init_db(db)
    above, rows = _readme_table()
    expected_head = markdown_header().splitlines()
    interval_line = next(line for line in expected_head if line.startswith("Interval:"))
    assert interval_line in above
    assert any(re.fullmatch(r"Regenerate: `python -m engine reproduce demo --scale \w+ --table`\.", line) for line in above)
    assert any(line.startswith("Made with: reader device ") and "thread(s)" in line and "torch" in line for line in above)
    expected = [line.strip().strip("|").split("|") for name in GROUPS["demo"]
                for line in render(CLAIMS[name], claim_rows(db, CLAIMS[name], {}), markdown=True).splitlines()]
    assert len(rows) == len(expected)
    for got, want in zip(rows, expected):
        assert len(got) == len(MARKDOWN_COLUMNS)
        assert got[:5] == [c.strip() for c in want[:5]]
        assert got[6] in ("seeds, then items", "t over seeds")
        assert re.match(r"(reproduces|unresolved|does not|fails \(as it must\)|does not fail)", got[7])


def test_the_arithmetic_record_names_the_device():
    from engine.models.arithmetic import arithmetic_record

    assert arithmetic_record(1, device="cpu")["device"] == "cpu" and "gpu" not in arithmetic_record(1, device="cpu")
    assert "device" not in arithmetic_record(1)


def test_rows_fall_back_to_seeds_and_say_why_when_the_features_are_gone(tmp_path):
    from sqlalchemy import delete, select

    from storage import FeatureSet, ModelVersion, session_scope

    db, claim, runs, _ = _study(tmp_path, "recall@1", seeds=2)
    with session_scope(db) as s:
        ids = s.scalars(select(ModelVersion.id).where(ModelVersion.experiment_id == runs[(1, "cores")])).all()
        s.execute(delete(FeatureSet).where(FeatureSet.model_version_id.in_(ids)))
    rows = claim_rows(db, claim, runs)
    cores = [r for r in rows if r.method == "cores"]
    assert {r.interval_kind for r in cores} == {"seeds"}
    assert all(f"experiment {runs[(1, 'cores')]}'s per-item outcomes cannot be recomputed" in r.note for r in cores)
    assert {r.interval_kind for r in rows if r.method != "cores"} == {"hierarchical"}  # the control's are all there
    text = render(claim, rows)
    assert "seeds only for cores: experiment" in text and "Student-t over the seeds' values" in text
    assert "| t over seeds |" in render(claim, rows, markdown=True)


@pytest.mark.parametrize("metric", ["recall@1", "verification"])
def test_open_set_runs_give_their_stored_matrix_and_pairs_name_query_and_gallery_images(tmp_path, metric):
    """An open-set run (queries: other images than the gallery's): outcomes without leaving out a 'same' image, and
    a pair's gallery image in its own id range after the queries'."""
    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(db)
    rng = np.random.default_rng(3)
    q_feats, g_feats = _features(rng, "cores"), _features(rng, "cores")
    versions = [NewVersion(architecture="external", method="x", classes=list(range(CLASSES)), num_outputs=0,
                           feature_dim=DIM, outputs={"query": {"encoder": q}, "gallery": {"encoder": g}},
                           labels={"query": LABELS, "gallery": LABELS}) for q, g in zip(q_feats, g_feats)]
    sets = [{"query_features": q, "query_labels": LABELS, "gallery_features": g, "gallery_labels": LABELS}
            for q, g in zip(q_feats, g_feats)]
    result = compatibility_matrices(sets, metrics=(metric,), same_set=False)
    exp = record_experiment(db, name="open", method="x", config={"name": "open", "eval": {"protocol": "open-set"}},
                            versions=versions, results={"encoder": result}, gallery_kind="instance")
    items, C = seed_items(db, exp, view="encoder", metric=metric, gallery="instance", eval_classes="all")
    np.testing.assert_allclose(C[np.tril_indices(T)], result.values[metric][np.tril_indices(T)])
    if metric == "recall@1":
        for col, (t, k) in enumerate(_cells()):  # brute force, nothing left out: the gallery holds other images
            qn = q_feats[t] / np.linalg.norm(q_feats[t], axis=1, keepdims=True)
            gn = g_feats[k] / np.linalg.norm(g_feats[k], axis=1, keepdims=True)
            np.testing.assert_array_equal(items.outcomes[:, col], (LABELS[(qn @ gn.T).argmax(1)] == LABELS).astype(float))
    else:
        qi, gi, _ = sample_pairs(LABELS, LABELS, same_set=False)
        np.testing.assert_array_equal(items.images, np.stack([qi, len(LABELS) + gi], 1))
        t, k = _cells()[1]
        np.testing.assert_array_equal(items.outcomes[:, 1], pair_verification(q_feats[t], LABELS, g_feats[k], LABELS,
                                                                              same_set=False)[1].astype(float))
