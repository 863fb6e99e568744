"""The redesigned reduced claims (issue 38): what each tests, its readings beside its own convention (eval classes,
the pair-type split, both tie rules), each model's training accuracy, all checked on tiny stored runs against
numpy recomputations by hand."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.metrics.verification import pair_verification, sample_pairs
from engine.reproduce.claims import CLAIMS, CONTROL, GROUPS, Claim, PaperCell, Reading
from engine.reproduce.outcomes import items_from_cells, part_mask, same_image_cosines, seed_items, training_accuracy
from engine.reproduce.plan import SCALE_SETTINGS, study_config
from engine.reproduce.table import Row, claim_rows, render, row_convention, why_lines
from engine.metrics.compatibility import CellFeatures, compatibility_matrices
from engine.results.record import NewVersion, record_experiment
from storage import get_engine, init_db


def test_p0_tests_the_2_step_column_at_5_classes_and_the_papers_temperature():
    claim = CLAIMS["P0-Tab1a"]
    cfg = study_config(claim, "reduced")
    assert cfg.scenario.initial_classes >= 5 and cfg.scenario.num_steps == 2
    assert {c.method: c.value for c in claim.cells} == {"psp": 1.0, "lsp": 1.0, "bct": 1.0, "cores": 0.0}
    for m in ("psp", "lsp"):  # paper 000 A.9: temperature 12, and the deviation (the stored softmax's) said
        assert cfg.method_params[m] == {"temperature": 12.0, "extraction_temperature": "training"}
    assert any("temperature 12" in d for d in claim.differs)
    assert {(r.eval_classes, r.rank_ties) for r in claim.readings} == {("all", "optimistic"), ("seen", "pessimistic"),
                                                                  ("seen", "optimistic")}
    assert any("tie" in n for n in claim.notes)


def test_p2_tab2_reads_seen_and_splits_all_by_pair_type():
    claim = CLAIMS["P2-Tab2"]
    assert claim.our_convention["eval_classes"] == "seen" == study_config(claim, "reduced").eval.eval_classes
    assert [(r.eval_classes, r.part) for r in claim.readings] == [("all", None), ("all", "trained"), ("all", "untrained")]


def test_p1_has_the_papers_lambda_rho_an_open_set_and_er_beside_hoc():
    claim = CLAIMS["P1-TabII"]
    cfg = study_config(claim, "reduced")
    assert cfg.method_params["dsimplex_hoc"] == {"lam": 0.1, "rho": 5.0}  # paper 001 Sec. 6, CIFAR-100/10
    assert cfg.scenario.initial_classes >= 4 and cfg.scenario.held_out_classes > 0 and cfg.eval.protocol == "open-set"
    assert {"dsimplex_hoc", "er", CONTROL} <= set(claim.methods)
    assert any("ER" in n for n in claim.notes)
    assert set(GROUPS["demo"]) == {"P2-Tab2", "P2-Tab2-open", "P0-Tab1a", "P1-TabII"}


def test_the_reduced_scale_uses_a_backbone_that_fits():
    for name in GROUPS["demo"]:
        cfg = study_config(CLAIMS[name], "reduced")
        assert (cfg.model.backbone, cfg.model.width, cfg.training.epochs) == ("small_fc_cnn", 128, 30)
        assert cfg.eval.train_features_per_class > 0  # the training images whose accuracy the table shows
    assert SCALE_SETTINGS["smoke"]["backbone"] == "small_cnn"  # seconds, for tests


def test_reading_labels_and_bad_values():
    assert Reading("all").label == "all"
    assert Reading("all", "trained").label == "all, items of classes both models trained"
    assert Reading("seen", rank_ties="optimistic").label == "seen, ties optimistic"
    for bad in (dict(eval_classes="some"), dict(eval_classes="all", part="half"), dict(eval_classes="all", rank_ties="x")):
        with pytest.raises(ValueError, match="unknown"):
            Reading(**bad)


def test_part_mask_by_hand():
    q, g = np.array([0, 1, 2, 3]), np.array([1, 3, 0, 2])
    np.testing.assert_array_equal(part_mask("trained", 2, q), [True, True, False, False])
    np.testing.assert_array_equal(part_mask("trained", 3, q, g), [True, False, True, False])  # (0, 1) and (2, 0)
    np.testing.assert_array_equal(part_mask("untrained", 3, q, g), [False, True, False, True])


# Two models, 3 classes of 2 test images each (closed set, own image left out); model 0 learned 2 classes, model 1 all 3.
LABELS = np.array([0, 0, 1, 1, 2, 2])
OLD = np.array([[1, 0], [1, .1], [0, 1], [.1, 1], [1, .05], [.05, 1]], np.float64)  # class 2 falls on 0 and 1
NEW = np.array([[1, 0], [1, .2], [0, 1], [.2, 1], [-1, -1], [-1, -.9]], np.float64)


def _hits(q: np.ndarray, g: np.ndarray, labels: np.ndarray = LABELS) -> np.ndarray:
    qn, gn = q / np.linalg.norm(q, axis=1, keepdims=True), g / np.linalg.norm(g, axis=1, keepdims=True)
    s = qn @ gn.T
    np.fill_diagonal(s, -np.inf)
    return (labels[s.argmax(1)] == labels).astype(float)


def test_recall_items_split_by_the_classes_both_models_learned():
    feats = [OLD, NEW]
    cell = lambda t, k: CellFeatures(feats[t], LABELS, feats[k], LABELS)  # noqa: E731
    full, C = items_from_cells(2, cell, metric="recall@1")
    # each cell's hits by brute force in numpy
    cells = [(0, 0), (1, 0), (1, 1)]
    for col, (t, k) in enumerate(cells):
        np.testing.assert_array_equal(full.outcomes[:, col], _hits(feats[t], feats[k]))
    for part, rows in (("trained", LABELS < 2), ("untrained", LABELS >= 2)):
        items, Cp = items_from_cells(2, cell, metric="recall@1", part=part, classes=[2, 3])
        for col, (t, k) in enumerate(cells):
            keep = rows if k == 0 else (np.ones(6, bool) if part == "trained" else np.zeros(6, bool))
            want = np.where(keep, _hits(feats[t], feats[k]), np.nan)
            np.testing.assert_array_equal(items.outcomes[:, col], want)
            assert np.isnan(Cp[t, k]) if not keep.any() else Cp[t, k] == pytest.approx(np.mean(want[keep]))
    with pytest.raises(ValueError, match="classes each"):
        items_from_cells(2, cell, metric="recall@1", part="trained")


def test_verification_pairs_split_by_pair_type(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 8)
    feats = [rng.normal(size=(32, 5)) + 2 * np.eye(5)[labels] for _ in range(2)]
    cell = lambda t, k: CellFeatures(feats[t], labels, feats[k], labels)  # noqa: E731
    qi, gi, _ = sample_pairs(labels, labels, same_set=True)
    both = (labels[qi] < 2) & (labels[gi] < 2)  # model 0 learned classes 0 and 1
    items, C = items_from_cells(2, cell, metric="verification", part="trained", classes=[2, 4])
    _, cross = pair_verification(feats[1], labels, feats[0], labels, same_set=True)
    np.testing.assert_array_equal(items.outcomes[:, 1], np.where(both, cross, np.nan))
    assert C[1, 0] == pytest.approx(cross[both].mean())
    _, other = items_from_cells(2, cell, metric="verification", part="untrained", classes=[2, 4])
    assert other[1, 0] == pytest.approx(cross[~both].mean())


def _store(db, method: str, feats: list[np.ndarray], train_logits: list[np.ndarray], train_labels: np.ndarray,
           learned: list[int]) -> int:
    versions = [NewVersion(architecture="external", method=method, classes=list(range(c)), num_outputs=lg.shape[1],
                           feature_dim=f.shape[1],
                           outputs={"query": {"encoder": f}, "gallery": {"encoder": f}, "train": {"logits": lg}},
                           labels={"query": LABELS, "gallery": LABELS, "train": train_labels})
                for f, lg, c in zip(feats, train_logits, learned)]
    sets = [{"query_features": f, "query_labels": LABELS, "gallery_features": f, "gallery_labels": LABELS} for f in feats]
    result = compatibility_matrices(sets, metrics=("recall@1",), same_set=True)
    return record_experiment(db, name=method, method=method, config={"name": method, "eval": {"protocol": "closed-set"}},
                             versions=versions, results={"encoder": result}, gallery_kind="instance")


def test_training_accuracy_and_reading_rows_from_stored_runs(tmp_path):
    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(db)
    train_labels = np.array([0, 1, 2, 0])
    old_logits = np.array([[2, 1], [0, 3], [5, 0], [1, 2]], np.float32)  # classes 0, 1: hit, hit, (class 2 left out), miss
    new_logits = np.array([[2, 1, 0], [0, 3, 4], [0, 0, 1], [3, 2, 1]], np.float32)  # hit, miss, hit, hit
    runs = {}
    for seed in range(2):
        for method in ("cores", CONTROL):
            runs[(seed, method)] = _store(db, method, [OLD, NEW], [old_logits, new_logits], train_labels, [2, 3])
    assert training_accuracy(db, runs[(0, "cores")]) == pytest.approx([2 / 3, 3 / 4])
    conv = {"protocol": "closed-set", "eval_classes": "all", "gallery": "instance", "metric": "recall@1"}
    claim = Claim(name="SYN", source="synthetic", paper_convention=conv, our_convention=conv, differs=(),
                  cells=(PaperCell("cores", "(phi2, phi1) margin", 0.01, (1, 0)), PaperCell("cores", "AC", 1.0)),
                  scenario={}, readings=(Reading("all", "trained"), Reading("seen")))
    rows = claim_rows(db, claim, runs, resamples=50)
    assert [r.reading for r in rows] == [None] * 4 + [Reading("all", "trained")] * 4 + [Reading("seen")] * 4
    assert all(r.training == pytest.approx({"mean": (2 / 3 + 3 / 4) / 2, "min": 2 / 3, "n": 4}) for r in rows)
    hits = {c: _hits(f, g) for c, (f, g) in {(1, 0): (NEW, OLD), (0, 0): (OLD, OLD)}.items()}
    margin = {r.reading: r.values for r in rows if r.label == "(phi2, phi1) margin" and r.method == "cores"}
    trained = LABELS < 2
    assert margin[None] == pytest.approx([hits[(1, 0)].mean() - hits[(0, 0)].mean()] * 2)
    assert margin[Reading("all", "trained")] == pytest.approx([hits[(1, 0)][trained].mean()
                                                               - hits[(0, 0)][trained].mean()] * 2)
    seen, _ = seed_items(db, runs[(0, "cores")], view="encoder", metric="recall@1", gallery="instance",
                         eval_classes="seen")
    assert margin[Reading("seen")] == pytest.approx([np.nanmean(seen.outcomes[:, 1]) - np.nanmean(seen.outcomes[:, 0])] * 2)
    # the upgrade's own gain behind the margin: the new model's self-test minus the old one's, on the same items
    gain = {r.reading: r.gain for r in rows if r.label == "(phi2, phi1) margin" and r.method == "cores"}
    own = {"old": _hits(OLD, OLD), "new": _hits(NEW, NEW)}
    assert gain[None]["mean"] == pytest.approx(own["new"].mean() - own["old"].mean()) and gain[None]["n"] == 2
    assert gain[Reading("all", "trained")]["mean"] == pytest.approx(own["new"][trained].mean() - own["old"][trained].mean())
    seen_own = {m: _hits(f[trained], f[trained], LABELS[trained]) for m, f in (("old", OLD), ("new", NEW))}
    assert gain[Reading("seen")]["mean"] == pytest.approx(seen_own["new"].mean() - seen_own["old"].mean())
    # two models make one cross-test: an AC row carries that cross-test's own gain
    assert all(r.gain == gain[r.reading] for r in rows if r.label == "AC" and r.method == "cores")
    assert all(r.paper_gain is None for r in rows)
    # how far one image moves: the cosine of its old and new feature, by hand (no train features stored: "-")
    cos = np.sum(OLD * NEW, 1) / np.linalg.norm(OLD, axis=1) / np.linalg.norm(NEW, axis=1)
    assert same_image_cosines(db, runs[(0, "cores")])["test"] == pytest.approx(cos.mean())
    assert np.isnan(same_image_cosines(db, runs[(0, "cores")])["trained"])
    assert all(r.drift == pytest.approx({"test": cos.mean(), "trained": None, "n": 2, "view": "encoder"}) for r in rows)
    text = render(claim, rows)
    assert f"{cos.mean():.2f} / -" in text
    assert "under eval_classes all, items of classes both models trained:" in text and "70.8 % (min 66.7)" in text
    md = render(claim, rows, markdown=True).splitlines()
    assert len(md) == len(rows) and md[4].split(" | ")[2] == "closed-set / all, items of classes both models trained / " \
                                                              "instance / recall@1"
    assert row_convention(claim, rows[0]) == conv and md[0].endswith("| 70.8 % (min 66.7) |")


def test_why_names_a_newer_model_that_is_itself_worse():
    iv = {"mean": -0.08, "lo": -0.1, "hi": -0.06, "n": 10}
    worse = Row("C", "cores", "(phi2, phi1) margin", 0.02, (), iv, "outside", "does not",
                gain={"mean": -0.059, "lo": -0.08, "hi": -0.038, "n": 10}, paper_gain=0.04)
    lines = why_lines([worse])
    assert lines == ["why cores (phi2, phi1) margin (our convention): the newer model is itself worse than the old one on "
                     "these items (own gain -5.9 [-8.0, -3.8]; paper +4.0 points), so no cross-test can be expected to "
                     "beat the old self-test"]
    better = Row("C", "cores", "(phi2, phi1) margin", 0.02, (), iv, "outside", "does not",
                 gain={"mean": 0.1, "lo": 0.09, "hi": 0.11, "n": 10}, paper_gain=0.04)
    unsure = Row("C", "cores", "(phi2, phi1) margin", 0.02, (), iv, "outside", "does not",
                 gain={"mean": -0.01, "lo": -0.03, "hi": 0.01, "n": 10}, paper_gain=0.04)
    passed = Row("C", "cores", "(phi2, phi1) margin", 0.02, (), iv, "inside", "reproduces",
                 gain={"mean": -0.059, "lo": -0.08, "hi": -0.038, "n": 10}, paper_gain=0.04)
    assert why_lines([better, unsure, passed]) == []  # a real gain, an unsure one, or a margin that reproduces


def test_why_names_how_far_the_features_move_when_the_upgrade_is_better():
    iv = {"mean": -0.12, "lo": -0.16, "hi": -0.08, "n": 10}
    moved = Row("C", "cores", "(phi2, phi1) margin", 0.02, (), iv, "outside", "does not",
                gain={"mean": 0.154, "lo": 0.111, "hi": 0.197, "n": 10}, paper_gain=0.04,
                drift={"test": 0.566, "trained": 0.925, "n": 10})
    ac = Row("C", "er", "AC", 1.0, (), {"mean": 0.0, "lo": 0.0, "hi": 0.0, "n": 10}, "outside", "does not",
             drift={"test": 0.558, "trained": None, "n": 10})
    assert why_lines([moved, ac]) == [
        "why cores (phi2, phi1) margin (our convention): the features move: the same test image's old and new features "
        "have cosine 0.57; 0.93 on the old classes' training images (1 = unmoved)",
        "why er AC (our convention): the features move: the same test image's old and new features have cosine 0.56 "
        "(1 = unmoved)"]
    seen = dataclasses.replace(ac, reading=Reading("seen"))  # the same reason under another reading: one line
    assert why_lines([ac, seen])[0].startswith("why er AC (our convention; seen): the features move")
    assert len(why_lines([ac, seen])) == 1
    paper_zero = Row("C", "cores", "AC", 0.0, (), iv, "outside", "does not", drift={"test": 0.5, "trained": 0.9, "n": 1})
    assert why_lines([paper_zero]) == []  # a paper AC of 0 claims no compatibility to explain


def test_same_image_cosines_in_a_derived_view_keep_the_old_models_columns(tmp_path):
    """LSP (paper 000): the first C^1 logits of both models, centred per row, compared by cosine; by hand."""
    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(db)
    rng = np.random.default_rng(3)
    old_logits, new_logits = rng.normal(size=(6, 2)), rng.normal(size=(6, 3))  # C^1 = 2, C^2 = 3
    versions = [NewVersion(architecture="external", method="lsp", classes=list(range(lg.shape[1])),
                           num_outputs=lg.shape[1], feature_dim=2,
                           outputs={"query": {"encoder": f, "logits": lg}, "gallery": {"encoder": f, "logits": lg}},
                           labels={"query": LABELS, "gallery": LABELS})
                for f, lg in ((OLD, old_logits), (NEW, new_logits))]
    sets = [{"query_features": f, "query_labels": LABELS, "gallery_features": f, "gallery_labels": LABELS}
            for f in (OLD, NEW)]
    exp = record_experiment(db, name="lsp", method="lsp", config={"name": "lsp", "eval": {"protocol": "closed-set"}},
                            versions=versions, results={"encoder": compatibility_matrices(sets, metrics=("recall@1",),
                                                                                          same_set=True)},
                            gallery_kind="instance")
    a = old_logits - old_logits.mean(axis=1, keepdims=True)
    b = new_logits[:, :2] - new_logits[:, :2].mean(axis=1, keepdims=True)  # the new model's first C^1 outputs
    want = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    got = same_image_cosines(db, exp, "lsp")
    assert got["test"] == pytest.approx(want.mean(), abs=1e-6)  # float32 storage of the logits
    assert np.isnan(got["trained"])  # no train split stored
