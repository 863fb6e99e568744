"""The migration plan of a check read from sources (engine.upgrade.source_remedies): adapters fitted on a bounded,
streamed sample of the galleries' pairs and judged as the check judges new/old, rank-merge roll-outs from the check's
top-D lists and the threshold from its own lists, each against an independent numpy computation on the whole arrays
(and the in-memory plan on the same vectors); the command line and the page's job."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.backfill_sources import hand_ndcg
from support.sources import fixed_list
from support.upgrade_plan_cli import same_decision

import engine.upgrade.source_remedies as remedies
from engine.adapters.posthoc import fit_map
from engine.cli import main
from engine.metrics.backfill import backfill_counts
from engine.metrics.backfill_orders import backfill_order
from engine.metrics.compatibility import CellFeatures
from engine.metrics.topk import array_blocks
from engine.upgrade.from_sources import SourceSpecs, check_sources
from engine.upgrade.migration import plan_inputs, threshold_row
from engine.upgrade.plan import DEFAULT_ADAPTERS
from engine.upgrade.source_remedies import adapted_outcomes, plan_from_sources, rank_merge_needs
from engine.upgrade.verdict import check_upgrade

NG, NQ, D, CLASSES = 300, 80, 12, 6
RESAMPLES = 200
SIDES = ("old_gallery", "new_gallery", "old_queries", "new_queries")
SHARE, SEED = 0.5, 0


def unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def pair(seed: int = 11, *, new: str = "better"):
    """Old and new embeddings; the new gallery is an exact rotation of the old one. ``better``: the new queries are a
    rotation of cleaner queries (the old ones plus noise), so new/new beats old/old and new/old fails; ``rotation``:
    the new queries are the old ones rotated (new/new equals old/old)."""
    rng = np.random.default_rng(seed)
    centres = 1.2 * rng.normal(size=(CLASSES, D))
    g_labels, q_labels = rng.integers(0, CLASSES, NG), rng.integers(0, CLASSES, NQ)
    rot, _ = np.linalg.qr(rng.normal(size=(D, D)))
    old_g = (centres[g_labels] + rng.normal(size=(NG, D))).astype(np.float32)
    clean = centres[q_labels] + 0.6 * rng.normal(size=(NQ, D))
    old_q = (clean + 1.4 * rng.normal(size=(NQ, D))).astype(np.float32) if new == "better" else clean.astype(np.float32)
    new_q = (clean @ rot).astype(np.float32)
    return {"old_gallery": old_g, "new_gallery": (old_g.astype(np.float64) @ rot).astype(np.float32),
            "old_queries": old_q, "new_queries": new_q, "g_labels": g_labels, "q_labels": q_labels}


def write(folder, e) -> SourceSpecs:
    """Parquet files, the galleries in row groups of 64 (read block by block); the new gallery in reverse order (its
    items are numbered by id as the old gallery's rows)."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = {}
    for side in SIDES:
        n = NG if "gallery" in side else NQ
        at = np.arange(n)[::-1] if side == "new_gallery" else np.arange(n)
        labels = e["g_labels"] if "gallery" in side else e["q_labels"]
        ids = np.array([f"{side[4]}{i:04d}" for i in range(n)])[at]
        pq.write_table(pa.table({"doc": ids, "emb": fixed_list(e[side][at]), "cls": labels[at]}),
                       folder / f"{side}.parquet", row_group_size=64)
        texts[side] = f"parquet:{folder / f'{side}.parquet'}#id=doc&vector=emb&label=cls"
    return SourceSpecs(texts["old_gallery"], texts["old_queries"], texts["new_queries"], texts["new_gallery"])


def write_qrels(path, e, seed: int = 5):
    """Graded judgements (query row -> gallery row -> grade): 1..4 items of the query's class, grades 1..3, every
    seventh query judged none; written with the files' ids."""
    rng = np.random.default_rng(seed)
    judged = {}
    for q in range(NQ):
        if q % 7 == 3:
            continue
        same = np.flatnonzero(e["g_labels"] == e["q_labels"][q])
        picked = rng.choice(same, size=min(len(same), int(rng.integers(1, 5))), replace=False)
        judged[q] = {int(i): int(rng.integers(1, 4)) for i in picked}
    lines = ["query-id\tcorpus-id\tscore"] + [f"q{q:04d}\tg{i:04d}\t{g}" for q, items in judged.items()
                                              for i, g in items.items()]
    path.write_text("\n".join(lines) + "\n")
    return judged


def sample_rows(n: int = NG, share: float = SHARE, seed: int = SEED, cap: int | None = None):
    """The sample the plan fits on, by hand: the first round(share n) (at most cap) of a seeded permutation, sorted."""
    m = int(round(share * n))
    return np.sort(np.random.default_rng(seed).permutation(n)[: m if cap is None else min(m, cap)])


def fitted(e, kind: str, rows):
    return fit_map(kind, e["new_gallery"][rows], e["old_gallery"][rows])


def old_blocks(e):
    """The old gallery as the check numbers it (the file's order: row i is item i), in blocks of 64."""
    return array_blocks(np.arange(NG), e["old_gallery"], 64)


def top1_hits(queries, gallery, q_labels, g_labels):
    """Recall@1 per query by brute force (numpy float64 cosine)."""
    best = np.argmax(unit(queries) @ unit(gallery).T, axis=1)
    return (g_labels[best] == q_labels).astype(np.float64)


@pytest.fixture(scope="module")
def better():
    return pair()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The folder of the module's shared sources."""
    return tmp_path_factory.mktemp("better")


@pytest.fixture(autouse=True)
def roots(tmp_path, shared, monkeypatch):
    """Each test's folder and the shared one are data roots."""
    monkeypatch.setenv("COMPATLAB_DATA_ROOTS", os.pathsep.join([str(tmp_path), str(shared)]))


@pytest.fixture(scope="module")
def better_specs(better, shared):
    return write(shared, better)


@pytest.fixture(scope="module")
def better_check(better_specs, shared):
    with pytest.MonkeyPatch.context() as mp:  # set up before the tests' own roots
        mp.setenv("COMPATLAB_DATA_ROOTS", str(shared))
        return check_sources(better_specs, metric="recall@1", resamples=RESAMPLES, seed=SEED, block_rows=64, backfill_depth=NG,
                             rollout=True)


@pytest.fixture(scope="module")
def better_plan(better_check, better_specs, shared):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMPATLAB_DATA_ROOTS", str(shared))
        return plan_from_sources(better_check, better_specs)


def test_a_rotated_gallery_ships_with_the_procrustes_adapter(better, better_check, better_plan):
    """new/old fails, new/new is better; Procrustes fitted on the streamed sample undoes the rotation: adapted/old is
    new/new query for query (a numpy search on the whole arrays) and the plan ships with it."""
    report = better_check.report
    assert report.verdict == "not compatible" and report.better.verdict == "better"
    plan = better_plan.plan
    assert plan.decision == "ship with adapter" and plan.headline() == "ship with adapter procrustes"
    assert [a["name"] for a in better_plan.adapters] == list(DEFAULT_ADAPTERS)
    m = fitted(better, "procrustes", sample_rows())
    (got,) = adapted_outcomes(better_check.lists, [m], old_blocks(better))
    new_new = top1_hits(better["new_queries"], better["new_gallery"], better["q_labels"], better["g_labels"])
    np.testing.assert_allclose(got.values, new_new, atol=1e-9)
    row = better_plan.adapters[0]
    assert row["source"] == "fitted here" and row["pairs"] == len(sample_rows()) and row["interval"] == "two-way"
    assert row["new_new"] == pytest.approx(report.new_new, abs=1e-12) and row["old_old"] == pytest.approx(report.old_old)
    assert row["label_free"] == pytest.approx(1.0, abs=1e-9)  # the rotation undone: the new/new neighbours exactly
    assert row["compatibility"]["verdict"] == "compatible" and row["n_queries"] == NQ and row["n_gallery"] == NG
    assert any("never fitted on" in n and "stay in the searched gallery" in n for n in plan.notes)


def test_the_corpus_transform_from_sources_is_numpy_on_the_transformed_gallery(better, better_plan):
    """Each transform row's mean is the numpy Recall@1 of the new queries on the old gallery mapped old -> new by that
    kind fitted on the same sample; Procrustes undoes the rotation, so it is new/new and passes the rule."""
    from engine.upgrade.remedies import fit_transform

    rows = sample_rows()
    assert [t["kind"] for t in better_plan.transforms] == list(DEFAULT_ADAPTERS)
    for t in better_plan.transforms:
        m = fit_transform(t["kind"], better["old_gallery"][rows], better["new_gallery"][rows])
        want = top1_hits(better["new_queries"], m.apply(better["old_gallery"]), better["q_labels"], better["g_labels"])
        assert t["transformed"] == pytest.approx(want.mean(), abs=1e-9), t["kind"]
        assert t["direction"] == "old->new" and t["vectors"] == NG and t["pairs"] == len(rows)
    procrustes = better_plan.transforms[0]
    assert procrustes["compatibility"]["verdict"] == "compatible"
    assert procrustes["transformed"] == pytest.approx(procrustes["new_new"], abs=1e-9)  # the rotation undone
    assert {o["remedy"] for o in better_plan.plan.options} >= {"query-side adapter", "corpus transform",
                                                               "full re-embedding"}


def test_every_adapter_mean_equals_numpy_on_the_whole_arrays(better, better_plan):
    """Each adapter row's adapted/old is the numpy Recall@1 of that kind fitted on the same sample, searched on the whole
    old gallery; label_free its neighbour recall@10 against the whole-array new/new top-10."""
    rows = sample_rows()
    for row in better_plan.adapters:
        adapted = fitted(better, row["kind"], rows).apply(better["new_queries"])
        want = top1_hits(adapted, better["old_gallery"], better["q_labels"], better["g_labels"])
        assert row["adapted_old"] == pytest.approx(want.mean(), abs=1e-9), row["kind"]
        mine = np.argsort(-(unit(adapted) @ unit(better["old_gallery"]).T), axis=1, kind="stable")[:, :10]
        ref = np.argsort(-(unit(better["new_queries"]) @ unit(better["new_gallery"]).T), axis=1, kind="stable")[:, :10]
        free = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(mine.tolist(), ref.tolist())])
        assert row["label_free"] == pytest.approx(free, abs=1e-9), row["kind"]


def test_the_adapter_rows_equal_the_in_memory_plan_on_the_same_vectors(better, better_check, better_plan):
    """check-upgrade --features on the same vectors (the rows in the same order) fits the same sample and gives the same
    adapted/old and the same two-way interval (the walk of the streamed top-D lists) at the same simultaneous level,
    and the same verdict (one seeded draw, cell (1, 0))."""
    old = CellFeatures(better["old_queries"], better["q_labels"], better["old_gallery"], better["g_labels"])
    new = CellFeatures(better["new_queries"], better["q_labels"], better["new_gallery"], better["g_labels"])
    report = check_upgrade(old, new, resamples=RESAMPLES, seed=SEED, metric="recall@1")
    memory = plan_inputs(old, new, report)
    assert better_check.report.interval == report.interval == "two-way"
    for got, want in zip(better_plan.adapters, memory.adapters, strict=True):
        assert got["name"] == want["name"] and got["pairs"] == want["pairs"] and got["interval"] == want["interval"]
        assert got["level"] == pytest.approx(want["level"], abs=1e-12) and 0.95 <= got["level"] <= 0.975
        assert got["adapted_old"] == pytest.approx(want["adapted_old"], abs=1e-9)
        for key in ("diff", "lo", "hi"):
            assert got["compatibility"][key] == pytest.approx(want["compatibility"][key], abs=1e-9)
        assert got["compatibility"]["verdict"] == want["compatibility"]["verdict"]
    assert better_plan.plan.decision == memory.plan.decision and better_plan.plan.adapter == memory.plan.adapter


def test_the_forecast_from_sources_equals_the_in_memory_forecast_on_an_exact_rotation(better, better_check, better_plan):
    """The forecast's small Procrustes fit (on its own seeded sample of the adapters' pairs) undoes the rotation exactly
    on either path, so both read the same per-query outcomes: the same forecast to float error (float32 streamed
    search against float64 in memory: 1e-6), and the adapted queries score new/new: a share of new/new of
    (new/new / old/old + bias x residual) x old/old / new/new = 1 + bias x residual x ceiling."""
    from engine.upgrade.forecast import CALIBRATION

    old = CellFeatures(better["old_queries"], better["q_labels"], better["old_gallery"], better["g_labels"])
    new = CellFeatures(better["new_queries"], better["q_labels"], better["new_gallery"], better["g_labels"])
    report = check_upgrade(old, new, resamples=RESAMPLES, seed=SEED, metric="recall@1")
    memory = plan_inputs(old, new, report).plan.forecast
    got = better_plan.plan.forecast
    for key in ("share_of_new", "new_lo", "new_hi", "share_of_old", "old_lo", "old_hi", "ceiling", "residual"):
        assert got[key] == pytest.approx(memory[key], abs=1e-6), key
    want = 1 + CALIBRATION.bias * got["residual"] * got["ceiling"]
    assert got["share_of_new"] == pytest.approx(want, abs=1e-9) and got["n_queries"] == NQ


def test_an_exact_rotation_adapted_equals_old_old_per_query(tmp_path):
    """The whole new model a rotation of the old: the Procrustes adapter's adapted/old is old/old query for query."""
    e = pair(new="rotation")
    specs = write(tmp_path / "r", e)
    check = check_sources(specs, metric="recall@1", resamples=RESAMPLES, seed=SEED, block_rows=64)
    (got,) = adapted_outcomes(check.lists, [fitted(e, "procrustes", sample_rows())], old_blocks(e))
    np.testing.assert_allclose(got.values, check.lists.oo, atol=1e-9)
    row = plan_from_sources(check, specs, kinds=("procrustes",)).adapters[0]
    assert row["adapted_old"] == pytest.approx(row["old_old"], abs=1e-9) and row["compatibility"]["diff"] == 0


def test_qrels_relevance_judges_the_adapters_as_the_check(tmp_path, better):
    """With qrels (nDCG@10 by default) the adapter's mean equals nDCG@10 by hand on the whole arrays."""
    specs = write(tmp_path / "q", better)
    judged = write_qrels(tmp_path / "qrels.tsv", better)
    specs = SourceSpecs(specs.old_gallery, specs.old_queries, specs.new_queries, specs.new_gallery,
                        str(tmp_path / "qrels.tsv"))
    check = check_sources(specs, resamples=RESAMPLES, seed=SEED, block_rows=64)
    assert check.relevance == "qrels" and check.report.metric == "ndcg@10"
    s_old = unit(better["old_queries"]) @ unit(better["old_gallery"]).T
    s_new = unit(better["new_queries"]) @ unit(better["new_gallery"]).T
    t_old = float(np.median(np.sort(s_old, axis=1)[:, -10:]))
    got = plan_from_sources(check, specs, kinds=("procrustes", "affine"), t_old=t_old)
    rows = sample_rows()
    for row in got.adapters:
        adapted = fitted(better, row["kind"], rows).apply(better["new_queries"])
        top = np.argsort(-(unit(adapted) @ unit(better["old_gallery"]).T), axis=1, kind="stable")[:, :10]
        want = np.nanmean([hand_ndcg(top[q], judged.get(q, {}), 10) for q in range(NQ)])
        assert row["adapted_old"] == pytest.approx(want, abs=1e-9), row["kind"]
    t = got.plan.threshold  # each model's top-10 candidates, relevant when judged with a grade above 0
    assert t is not None and t["n_old"] == t["n_new"] == NQ * 10 and t["t_old"] == t_old
    for sims, at, precision, recall in ((s_old, t_old, t["precision"], t["recall_old"]),
                                        (s_new, t["t_new"], t["precision_new"], t["recall_new"])):
        top = np.argsort(-sims, axis=1, kind="stable")[:, :10]
        scores = np.take_along_axis(sims, top, 1)
        flags = np.array([[judged.get(q, {}).get(int(i), 0) > 0 for i in top[q]] for q in range(NQ)])
        kept = scores >= at - 1e-6
        assert precision == pytest.approx(flags[kept].mean(), abs=1e-9)
        assert recall == pytest.approx(flags[kept].sum() / flags.sum(), abs=1e-9)
    assert t["precision_new"] >= t["precision"] - 1e-12
    assert any("the qrels grade them above 0" in n for n in got.plan.notes)


def test_a_rank_merge_point_equals_a_numpy_merge(better, better_check, better_plan):
    """Every point of the random rank-merge curve: the old queries on the old index (items not yet re-embedded) and the
    new queries on the re-embedded part, merged by score, top-1 hit (numpy on the whole arrays)."""
    needs, note = rank_merge_needs(better_check.lists, better_check.report.old_old)
    curve = next(n for n in needs if n.ordering == "rank_merge:random")
    order = backfill_order("random", gallery_labels=np.zeros(NG, np.int8), seed=SEED)
    s_old = unit(better["old_queries"]) @ unit(better["old_gallery"]).T
    s_new = unit(better["new_queries"]) @ unit(better["new_gallery"]).T
    for count, value in zip(backfill_counts(np.asarray(curve.fractions), NG), curve.values, strict=True):
        in_new = np.zeros(NG, bool)
        in_new[order[:count]] = True
        merged = np.where(in_new, s_new, s_old)
        want = (better["g_labels"][np.argmax(merged, axis=1)] == better["q_labels"]).mean()
        assert value == pytest.approx(want, abs=1e-9)
    assert "every query decided at every point" in note
    rows = {r["ordering"]: r for r in better_plan.rollouts}
    got = rows["rank_merge:random"]
    above = next((f for f, v in zip(curve.fractions, curve.values) if v > better_check.report.old_old), None)
    assert got["to_old_self"] == above and got["reaches_at"] == curve.to_old_self
    assert {"random", "distance_mse", "rank_merge:random", "rank_merge:adapter_residual"} <= set(rows)


def test_the_threshold_equals_the_in_memory_threshold_on_the_same_vectors(better, better_plan):
    old = CellFeatures(better["old_queries"], better["q_labels"], better["old_gallery"], better["g_labels"])
    new = CellFeatures(better["new_queries"], better["q_labels"], better["new_gallery"], better["g_labels"])
    want, _ = threshold_row(old, new, same_set=False)
    got = better_plan.plan.threshold
    assert want is not None and got is not None and set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-6), key


def test_label_free_has_no_threshold_and_says_why(tmp_path, better):
    specs = write(tmp_path / "n", better)
    check = check_sources(specs, relevance="none", resamples=RESAMPLES, seed=SEED, block_rows=64)
    got = plan_from_sources(check, specs, kinds=("procrustes",))
    assert got.plan.threshold is None and any("label-free" in n and "no threshold" in n for n in got.plan.notes)
    row = got.adapters[0]
    assert row["new_new"] is None and row["label_free"] == pytest.approx(row["adapted_old"], abs=1e-12)


def test_the_fit_sample_is_bounded(better, better_check, better_specs, monkeypatch):
    """max_pairs caps the pairs read and fitted on (a prefix of the same seeded order), and the note says so."""
    seen = []
    real = remedies.fit_map
    monkeypatch.setattr(remedies, "fit_map", lambda kind, new, old, **kw: seen.append((len(new), len(old))) or
                        real(kind, new, old, **kw))
    got = plan_from_sources(better_check, better_specs, kinds=("procrustes",), max_pairs=24)
    assert seen == [(24, 24), (24, 24)] and got.adapters[0]["pairs"] == 24  # the forecast's small fit, then the adapter
    assert any("capped at 24 pairs" in n for n in got.plan.notes)
    rows = sample_rows(cap=24)
    assert set(rows) <= set(sample_rows())
    adapted = fitted(better, "procrustes", rows).apply(better["new_queries"])
    want = top1_hits(adapted, better["old_gallery"], better["q_labels"], better["g_labels"]).mean()
    assert got.adapters[0]["adapted_old"] == pytest.approx(want, abs=1e-9)


def test_the_pair_reader_keeps_only_the_sample():
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    rows = np.array([1, 7, 8, 19])
    old, new = remedies.read_pairs(array_blocks(np.arange(20), x, 3), array_blocks(np.arange(20)[::-1], x[::-1], 6), rows)
    np.testing.assert_array_equal(old, x[rows])
    np.testing.assert_array_equal(new, x[rows])
    with pytest.raises(ValueError, match="gave 3 of the 4 sampled items"):
        remedies.read_pairs(array_blocks(np.arange(19), x[:19], 5), [], rows)


def test_a_check_without_the_new_gallery_cannot_plan_remedies(tmp_path, better):
    specs = write(tmp_path / "w", better)
    alone = SourceSpecs(specs.old_gallery, specs.old_queries, specs.new_queries)
    check = check_sources(alone, metric="recall@1", resamples=RESAMPLES, block_rows=64)
    with pytest.raises(ValueError, match="need the new gallery"):
        plan_from_sources(check, alone)


# ---- the command line and the job ----------------------------------------------------------------------------------

def cli_args(specs, *extra):
    args = ["check-upgrade", "--old-gallery", specs.old_gallery, "--old-queries", specs.old_queries, "--new-queries",
            specs.new_queries, "--resamples", str(RESAMPLES), "--seed", str(SEED)]
    args += [] if "--metric" in extra or "--qrels" in extra else ["--metric", "recall@1"]  # the pairs' hits, by hand
    return args + (["--new-gallery", specs.new_gallery] if specs.new_gallery else []) + list(extra)


@pytest.mark.parametrize("extra", [["--adapters", "procrustes"], ["--threshold", "0.5"], ["--fit-share", "0.3"],
                                   ["--rollout"]])
def test_without_the_new_gallery_the_plan_options_are_refused_in_one_line(tmp_path, capsys, better, extra):
    specs = write(tmp_path / "s", better)
    alone = SourceSpecs(specs.old_gallery, specs.old_queries, specs.new_queries)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(cli_args(alone, "--plan", str(tmp_path / "plan"), *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {extra[0]}: ") and "need the new gallery" in err and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_rollout_from_sources_decides_without_writing_a_plan(tmp_path, capsys, better_specs):
    """Every check prints the one decision: --rollout from sources needs no --plan (it only writes the files)."""
    assert main(cli_args(better_specs, "--rollout")) == 1
    assert "  decision: ship with adapter procrustes: " in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_command_line_writes_the_plan_from_sources(tmp_path, capsys, better_specs, better_plan):
    code = main(cli_args(better_specs, "--backfill-depth", str(NG), "--rollout", "--plan", str(tmp_path / "plan")))
    assert code == 1
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["headline"] == "ship with adapter procrustes" and "written to plan.json" in capsys.readouterr().out
    assert [a["name"] for a in plan["adapters"]] == [a["name"] for a in better_plan.adapters]
    for got, want in zip(plan["adapters"], better_plan.adapters):
        assert got["compatibility"] == pytest.approx(want["compatibility"]) and got["adapted_old"] == want["adapted_old"]
    assert any(r["ordering"] == "rank_merge:random" for r in plan["rollouts"])
    assert plan["threshold"] == pytest.approx(better_plan.plan.threshold)
    same_decision((tmp_path / "plan.md").read_text(), plan)


def test_the_sources_job_stores_a_plan_with_adapters(tmp_path, better, better_plan):
    from engine.core.contract import sources_check_payload
    from engine.jobs.job_handlers import JobContext, sources_check_job
    from storage import get_engine, init_db, load_source_check, payload_hash, session_scope

    specs = write(tmp_path / "j", better)
    db = get_engine(f"sqlite:///{tmp_path / 'j.db'}")
    init_db(db)
    payload = sources_check_payload({"old_gallery": specs.old_gallery, "new_gallery": specs.new_gallery,
                                     "old_queries": specs.old_queries, "new_queries": specs.new_queries},
                                    relevance="labels")
    seen = []
    sources_check_job(db, payload, JobContext(lambda f, m: seen.append(f), lambda: False, None))
    with session_scope(db) as s:
        stored = load_source_check(s, payload_hash("sources_check", payload))
    plan = stored["plan"]
    assert [a["name"] for a in plan["adapters"]] == list(DEFAULT_ADAPTERS)
    assert plan["threshold"] is not None and not any("decided from the verdicts alone" in n for n in plan["notes"])
    assert seen == sorted(seen) and seen[-1] == pytest.approx(1.0)


# ---- adapter fit / curve judged with the check's qrels -------------------------------------------------------------

def test_adapter_curve_judges_with_the_checks_qrels(tmp_path, capsys, better):
    """``adapter curve --qrels``: nDCG@10 under the same judgements as the check; its old/old and new/new baselines are
    the check's cells and adapted/old at every pair count is nDCG@10 by hand on the whole arrays."""
    from engine.adapters.recovery import split_items
    from engine.sources import join_by_id, open_source

    specs = write(tmp_path / "a", better)
    judged = write_qrels(tmp_path / "qrels.tsv", better)
    check = check_sources(SourceSpecs(specs.old_gallery, specs.old_queries, specs.new_queries, specs.new_gallery,
                                      str(tmp_path / "qrels.tsv")), resamples=RESAMPLES, block_rows=64)
    args = ["adapter", "curve", "--old", specs.old_gallery, "--new", specs.new_gallery, "--query-old", specs.old_queries,
            "--query-new", specs.new_queries, "--qrels", str(tmp_path / "qrels.tsv"), "--kind", "procrustes",
            "--pairs", "40,150", "--resamples", "50", "--json", str(tmp_path / "c.json")]
    assert main(args) == 0, capsys.readouterr().err
    curve = json.loads((tmp_path / "c.json").read_text())
    assert curve["relevance"] == "qrels" and curve["metric"] == "ndcg@10" and "qrels" in curve["fitted_on"]
    assert curve["baselines"]["old/old"] == pytest.approx(check.means["old/old"]["ndcg@10"], abs=1e-9)
    assert curve["baselines"]["new/new"] == pytest.approx(check.means["new/new"]["ndcg@10"], abs=1e-9)
    assert curve["baselines"]["n_no_relevant"] == check.report.n_no_positive
    opened = [open_source(t, what=w) for t, w in ((specs.old_gallery, "old"), (specs.new_gallery, "new"),
                                                  (specs.old_queries, "old q"), (specs.new_queries, "new q"))]
    split = split_items(join_by_id(*opened[:2]), queries=join_by_id(*opened[2:]), seed=0)
    for source in opened:
        source.close()
    for row in curve["rows"]:
        rows = np.sort(split.fit_order[: row["pairs"]])
        adapted = fitted(better, "procrustes", rows).apply(better["new_queries"])
        top = np.argsort(-(unit(adapted) @ unit(better["old_gallery"]).T), axis=1, kind="stable")[:, :10]
        want = np.nanmean([hand_ndcg(top[q], judged.get(q, {}), 10) for q in range(NQ)])
        assert row["adapted/old"] == pytest.approx(want, abs=1e-9), row["pairs"]


@pytest.mark.parametrize("extra, message", [
    ([], "--qrels judges named queries: give them as --query-old/--query-new"),
    (["--relevance", "none"], "--qrels goes with --relevance qrels"),
])
def test_adapter_qrels_refusals_are_one_line(tmp_path, capsys, better, extra, message):
    specs = write(tmp_path / "b", better)
    write_qrels(tmp_path / "qrels.tsv", better)
    args = ["adapter", "curve", "--old", specs.old_gallery, "--new", specs.new_gallery, "--qrels",
            str(tmp_path / "qrels.tsv"), *extra]
    if extra:
        args += ["--query-old", specs.old_queries, "--query-new", specs.new_queries]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_the_sources_job_runs_where_the_workers_setting_says(tmp_path, better, monkeypatch):
    """A worker's $COMPATLAB_DASK_SCHEDULER is where a sources check searches (a bad one: one line, nothing stored)."""
    from engine.core.contract import sources_check_payload
    from engine.jobs.job_handlers import JobContext, sources_check_job
    from storage import get_engine, init_db, load_source_check, payload_hash, session_scope

    specs = write(tmp_path / "j", better)
    db = get_engine(f"sqlite:///{tmp_path / 'j.db'}")
    init_db(db)
    payload = sources_check_payload({"old_gallery": specs.old_gallery, "old_queries": specs.old_queries,
                                     "new_queries": specs.new_queries}, relevance="labels")
    monkeypatch.setenv("COMPATLAB_DASK_SCHEDULER", "nowhere")
    with pytest.raises(ValueError, match=r"^\$COMPATLAB_DASK_SCHEDULER 'nowhere' is not a cluster") as exc:
        sources_check_job(db, payload, JobContext(lambda f, m: None, lambda: False, None))
    assert "\n" not in str(exc.value)
    with session_scope(db) as s:
        assert load_source_check(s, payload_hash("sources_check", payload)) is None


def test_the_cascade_from_sources_is_a_numpy_rescoring_of_the_old_top_n(better, better_plan):
    """Each cascade point's mean is, by hand: the Procrustes-adapted queries' full old-space cosines -> top N -> the new
    gallery's cosines of those N -> the best of them relevant (Recall@1)."""
    m = fitted(better, "procrustes", sample_rows())
    first = unit(m.apply(better["new_queries"]))
    s_old = first @ unit(better["old_gallery"]).T
    s_new = unit(better["new_queries"]) @ unit(better["new_gallery"]).T
    cascade = better_plan.cascade
    assert cascade["first_stage"] == "the procrustes adapter's queries" and [p["n"] for p in cascade["curve"]] == sorted(
        {min(n, NG) for n in (10, 20, 50, 100, 200, 500, 1000)})
    for point in cascade["curve"]:
        head = np.argsort(-s_old, axis=1, kind="stable")[:, :point["n"]]
        best = head[np.arange(NQ), np.argmax(np.take_along_axis(s_new, head, 1), axis=1)]
        want = (better["g_labels"][best] == better["q_labels"]).mean()
        assert point["value"] == pytest.approx(want, abs=1e-9), point["n"]
        c = point["compatibility"]
        assert c["lo"] <= c["diff"] <= c["hi"]
    assert {o["remedy"] for o in better_plan.plan.options} == {"query-side adapter", "corpus transform", "cascade",
                                                               "backfill", "full re-embedding"}
