"""The remedies beside the query-side adapter (issue 42): a corpus transform that undoes an exact rotation, a cascade
point against a brute-force numpy re-scoring, and the plan's choice among the five remedies by its stated cost rule."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from engine.adapters.artifact import load_adapter, save_adapter
from engine.adapters.batch_apply import apply_to_file
from engine.sources import open_source
from engine.upgrade.migration import fit_rows, plan_inputs
from engine.upgrade.plan import REMEDIES, REMEDY_DECISION, cheapest_passing, cost_key, horizon, migration_plan, remedy_options
from engine.adapters.posthoc import OLD_TO_NEW, map_direction
from engine.metrics.compatibility import CellFeatures
from engine.upgrade.remedies import cascade_outcomes, cascade_row, fit_transform, transform_rows
from engine.upgrade.verdict import check_upgrade
from support.upgrade_plan_cli import rotated_back_pair

TOL = 1e-5  # float32 map outputs against float64 unit rows


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_transform_fitted_on_rotated_pairs_undoes_the_rotation_and_passes_the_rule():
    old, new = rotated_back_pair()  # new gallery = old gallery @ R exactly; new queries better, in R's space
    m = fit_transform("procrustes", old.gallery, new.gallery)
    assert map_direction(m) == OLD_TO_NEW and m.fitted_on["direction"] == "old->new"
    np.testing.assert_allclose(m.apply(old.gallery), unit(new.gallery), atol=TOL)
    report = check_upgrade(old, new, resamples=200)
    assert report.verdict == "not compatible" and report.better.verdict == "better"
    rows = transform_rows(old, new, report, fitted=fit_rows(len(old.gallery), 0.5, report.seed), kinds=("procrustes",))
    (row,) = rows
    assert row["direction"] == "old->new" and row["vectors"] == len(old.gallery)
    assert row["compatibility"]["verdict"] == "compatible"  # new queries on the transformed gallery vs old/old
    assert row["transformed"] == pytest.approx(report.new_new, abs=1e-12)  # the transformed gallery is the new one
    assert row["vs_new_new"]["diff"] == pytest.approx(0.0, abs=1e-12)


def test_the_transform_is_exported_with_its_direction_and_streamed_over_the_old_gallery(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPATLAB_DATA_ROOTS", str(tmp_path))
    old, new = rotated_back_pair()
    m = fit_transform("affine", old.gallery, new.gallery, options={"ridge": 0.0})
    save_adapter(m, tmp_path / "transform", onnx=False)
    back = load_adapter(tmp_path / "transform")
    assert map_direction(back) == OLD_TO_NEW
    store = tmp_path / "old_gallery.npz"
    np.savez(store, ids=np.arange(len(old.gallery)), vectors=old.gallery.astype(np.float32), labels=old.gallery_labels)
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    source = open_source(str(store), what="old gallery", dim=back.new_dim)
    try:
        n = apply_to_file(back, source, tmp_path / "transformed.npy", block_rows=37)  # blocks of 37 rows
    finally:
        source.close()
    assert n == len(old.gallery) and hashlib.sha256(store.read_bytes()).hexdigest() == before  # the store untouched
    np.testing.assert_allclose(np.load(tmp_path / "transformed.npy"), unit(new.gallery), atol=1e-4)


def brute_cascade(first, query, q_labels, old_g, new_g, g_labels, n, k):
    """Full old-space cosine -> top N (ties by the lower row) -> new-space cosine of those N -> hit@k, a negative tied
    with the best positive first; NaN without a positive in the gallery."""
    out = []
    for i in range(len(first)):
        s_old = [float(np.dot(first[i], g) / np.linalg.norm(first[i]) / np.linalg.norm(g)) for g in old_g]
        head = sorted(range(len(old_g)), key=lambda j: (-s_old[j], j))[:n]
        s_new = {j: float(np.dot(query[i], new_g[j]) / np.linalg.norm(query[i]) / np.linalg.norm(new_g[j])) for j in head}
        if not (g_labels == q_labels[i]).any():
            out.append(np.nan)
            continue
        pos = [s_new[j] for j in head if g_labels[j] == q_labels[i]]
        if not pos:
            out.append(0.0)
            continue
        before = sum(1 for j in head if g_labels[j] != q_labels[i] and s_new[j] >= max(pos))
        out.append(float(before < k))
    return np.array(out)


@pytest.mark.parametrize("n,k", [(1, 1), (5, 1), (12, 3), (40, 1)])
def test_a_cascade_point_equals_a_brute_force_rescoring(n, k):
    rng = np.random.default_rng(5)
    q_labels, g_labels = rng.integers(0, 7, 25), rng.integers(0, 6, 40)  # class 6 has no gallery item: NaN
    first, query = rng.normal(size=(2, 25, 8))
    old_g, new_g = rng.normal(size=(2, 40, 8))
    got = cascade_outcomes(first, query, q_labels, old_g, new_g, g_labels, ns=[n], k=k)[n][0]
    want = brute_cascade(first, query, q_labels, old_g, new_g, g_labels, n, k)
    assert np.isnan(want).any() and np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, atol=1e-12, equal_nan=True)


def test_ties_in_the_old_scores_are_broken_by_the_lower_gallery_row_as_by_hand():
    rng = np.random.default_rng(8)
    base = rng.normal(size=(10, 6))
    old_g = np.repeat(base, 4, axis=0)  # every old vector four times: ties at every cut
    new_g = rng.normal(size=(40, 6))
    g_labels = rng.integers(0, 5, 40)
    first, query = rng.normal(size=(2, 30, 6))
    q_labels = rng.integers(0, 5, 30)
    for n in (2, 3, 6, 13):
        got = cascade_outcomes(first, query, q_labels, old_g, new_g, g_labels, ns=[n], k=1)[n][0]
        want = brute_cascade(first, query, q_labels, old_g, new_g, g_labels, n, 1)
        np.testing.assert_allclose(got, want, atol=1e-12, equal_nan=True)


def test_same_set_cascade_and_transforms_leave_the_fitted_items_out():
    old, new = rotated_back_pair()
    same = [CellFeatures(c.gallery, c.gallery_labels, c.gallery, c.gallery_labels) for c in (old, new)]
    report = check_upgrade(*same, resamples=100)
    assert report.same_set
    got = plan_inputs(*same, report)
    assert got.transforms[0]["vectors"] == len(old.gallery) - got.transforms[0]["pairs"]
    assert got.cascade["compatibility"]["n"] == len(old.gallery) - got.adapters[0]["pairs"]
    assert all(p["n"] <= len(old.gallery) - got.adapters[0]["pairs"] - 1 for p in got.cascade["curve"])


def test_the_cascade_curve_point_is_the_brute_force_mean_and_its_end_is_the_new_self_test():
    old, new = rotated_back_pair()
    report = check_upgrade(old, new, resamples=200, interval="queries")
    first = new.query @ np.linalg.qr(np.random.default_rng(1).normal(size=(16, 16)))[0]  # any first stage
    row = cascade_row(old, new, report, first=first, first_name="rotated queries", ns=(5, 20, len(old.gallery)))
    point = {p["n"]: p["value"] for p in row["curve"]}
    want = brute_cascade(first, new.query, new.query_labels, old.gallery, new.gallery, old.gallery_labels, 20, 1)
    assert point[20] == pytest.approx(np.nanmean(want), abs=1e-12)
    assert point[len(old.gallery)] == pytest.approx(report.new_new, abs=1e-12)  # every item re-scored: new/new
    assert row["per_query_rescorings"] == row["n"]
    assert row["smallest_passing"] == next((p["n"] for p in row["curve"]
                                            if p["compatibility"]["verdict"] == "compatible"), None)


def test_the_cascade_two_way_interval_reads_the_cascade_lists():
    old, new = rotated_back_pair()
    report = check_upgrade(old, new, resamples=200)
    assert report.interval == "two-way"
    row = cascade_row(old, new, report, first=new.query @ np.linalg.qr(new.gallery.T @ old.gallery)[0],
                      first_name="q", ns=(10, 50))
    for p in row["curve"]:
        c = p["compatibility"]
        assert c["lo"] <= c["diff"] <= c["hi"] and c["n"] == report.n_queries


def _v(verdict, diff=0.0, lo=0.0, hi=0.0):
    return {"diff": diff, "lo": lo, "hi": hi, "n": 500, "verdict": verdict, "tie": False, "needed": None}


def _report():
    return {"old_name": "v1", "new_name": "v2", "metric": "recall@1", "level": 0.95, "n_gallery": 1000,
            "old_old": 0.6, "new_old": 0.5, "new_new": 0.7, "compatibility": _v("not compatible", -0.1, -0.15, -0.05),
            "better": _v("better", 0.1, 0.05, 0.15), "backfill": []}


PASS = _v("compatible", 0.02, 0.01, 0.03)
ADAPTER = {"name": "procrustes", "compatibility": PASS}
TRANSFORM = {"name": "procrustes", "kind": "procrustes", "compatibility": PASS, "transformed": 0.7}
CASCADE = {"name": "at N = 200", "n": 200, "first_stage": "new queries", "compatibility": PASS, "value": 0.65}
ROLLOUT = {"ordering": "random", "to_old_self": 0.3, "area": 0.6}


@pytest.mark.parametrize("given,queries,decision", [
    ({"adapters": [ADAPTER], "transforms": [TRANSFORM], "cascade": CASCADE}, None, "ship with adapter"),
    ({"transforms": [TRANSFORM], "cascade": CASCADE}, None, "transform the gallery"),
    ({"cascade": CASCADE}, None, "backfill"),  # 200 re-scorings x 1,000 queries > 300 items embedded once
    ({"cascade": CASCADE}, 1, "serve a cascade"),  # one query served: 200 < 300
    ({}, None, "backfill"),
])
def test_the_plan_recommends_the_cheapest_passing_remedy_and_lists_all_five(given, queries, decision):
    plan = migration_plan(_report(), rollouts=[ROLLOUT], queries=queries, **given)
    assert plan.decision == decision
    assert plan.queries == (1000 if queries is None else queries)  # default horizon: the gallery's 1,000 items
    assert [o["remedy"] for o in plan.options][-1] == "full re-embedding"
    picked = cheapest_passing(plan.options, plan.queries)
    assert REMEDY_DECISION[picked["remedy"]] == plan.decision and picked["name"] == plan.remedy
    assert "<- recommended" in plan.to_markdown() and "## Remedies side by side" in plan.to_markdown()


def test_a_cascade_plan_says_after_how_many_queries_the_backfill_is_cheaper():
    plan = migration_plan(_report(), rollouts=[ROLLOUT], cascade=CASCADE, queries=1)
    assert plan.decision == "serve a cascade"
    # the backfill embeds ceil(0.3 x 1,000) = 300 items once; the cascade 200 per query: cheaper after 2 queries
    assert "exceed the 300 of backfill" in plan.reason and "after 2 queries" in plan.reason


def test_the_horizon_is_a_whole_number_of_queries():
    assert horizon(None, 1234) == 1234 and horizon(7, 1234) == 7
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="whole number >= 1"):
            horizon(bad, 10)


def test_the_cost_rule_orders_the_five_remedies_as_documented():
    options = remedy_options(_report(), adapters=[ADAPTER], transforms=[TRANSFORM],
                             cascade={**CASCADE, "first_stage": "the procrustes adapter's queries"}, rollouts=[ROLLOUT])

    def order(queries):
        return [o["remedy"] for o in sorted(options, key=lambda o: cost_key(o, queries))]

    assert order(1) == list(REMEDIES)  # one query: the cascade's 200 re-scorings beat 300 items embedded once
    # the default horizon (as many queries as items): 200 x 1,000 re-scorings cost more than re-embedding 1,000 items
    assert order(1000) == ["query-side adapter", "corpus transform", "backfill", "full re-embedding", "cascade"]
    backfill = next(o for o in options if o["remedy"] == "backfill")
    assert backfill["one_time"]["embeddings"] == 300 and backfill["lo"] is None
    full = options[-1]
    assert (full["one_time"]["embeddings"], full["passes"], full["lo"]) == (1000, True, 0.05)


def test_nothing_cheaper_passing_re_embeds_and_a_too_close_guardrail_waits():
    fails = {**_report(), "backfill": []}
    assert migration_plan(fails, rollouts=[{"ordering": "random", "to_old_self": None, "area": 0.3}]).decision \
        == "re-embed the gallery"
    close = {**fails, "compatibility": _v("too close to call", -0.01, -0.03, 0.01)}
    assert migration_plan(close, rollouts=[]).decision == "do not ship yet"


def test_plan_inputs_carry_the_transforms_and_the_cascade_and_the_plan_agrees():
    old, new = rotated_back_pair()
    report = check_upgrade(old, new, resamples=200)
    got = plan_inputs(old, new, report)
    assert [t["kind"] for t in got.transforms] == ["procrustes", "affine"] and got.cascade is not None
    again = migration_plan(report.to_json(), adapters=got.adapters, rollouts=got.rollouts, transforms=got.transforms,
                           cascade=got.cascade)
    assert again.decision == got.plan.decision == "ship with adapter"  # the exact rotation back: the adapter passes
    assert {o["remedy"] for o in got.plan.options} == set(REMEDIES)
    data = got.to_json()
    assert data["options"] and data["transforms"] and data["cascade"]["curve"]


def test_a_cascade_on_another_metric_is_left_out_with_a_note():
    old, new = rotated_back_pair()
    report = check_upgrade(old, new, resamples=100, metric="map")
    got = plan_inputs(old, new, report)
    assert got.cascade is None and any(n.startswith("no cascade: the cascade is judged on Recall@k") for n in got.plan.notes)


def test_a_cascade_refuses_a_depth_beyond_the_gallery():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 3))
    with pytest.raises(ValueError, match="a cascade re-scores from k = 1 to 4 candidates per query"):
        cascade_outcomes(x, x, np.zeros(4), x, x, np.zeros(4), ns=[5])


def test_adapter_fit_old_to_new_exports_a_transform_that_apply_streams_over_the_old_gallery(tmp_path, capsys):
    from engine.cli import main

    rng = np.random.default_rng(42)
    labels = rng.integers(0, 6, 300)
    old = (3 * rng.standard_normal((6, 12)))[labels] + rng.standard_normal((300, 12))
    rotation = np.linalg.qr(rng.standard_normal((12, 12)))[0]
    ids = np.arange(300) * 7
    np.savez(tmp_path / "old.npz", ids=ids, vectors=old.astype(np.float32), labels=labels)
    np.savez(tmp_path / "new.npz", ids=ids, vectors=(old @ rotation).astype(np.float32), labels=labels)
    code = main(["adapter", "fit", "--old", str(tmp_path / "old.npz"), "--new", str(tmp_path / "new.npz"),
                 "--kind", "procrustes", "--pairs", "100", "--held-out", "50", "--resamples", "50",
                 "--direction", "old-to-new", "--no-onnx", "--out", str(tmp_path / "t")])
    out = capsys.readouterr().out
    assert code == 0 and "procrustes corpus transform (old -> new, 12 -> 12 dims)" in out
    m = load_adapter(tmp_path / "t")
    assert map_direction(m) == OLD_TO_NEW and m.metrics["new/transformed"] == pytest.approx(m.metrics["new/new"])
    code = main(["adapter", "apply", "--adapter", str(tmp_path / "t"), "--in", str(tmp_path / "old.npz"),
                 "--out", str(tmp_path / "transformed.npz"), "--block-rows", "64"])
    assert code == 0 and "300 vectors mapped 12 -> 12 dims old -> new by the procrustes corpus transform" in \
        capsys.readouterr().out
    with np.load(tmp_path / "transformed.npz") as got:
        assert np.array_equal(got["ids"], ids)
        np.testing.assert_allclose(got["vectors"], unit(old @ rotation), atol=TOL)


def test_the_release_report_marks_the_transform_the_plan_took_and_lists_the_remedies():
    from engine.upgrade.release_report import report_data, report_markdown

    report = _report()
    plan = migration_plan(report, rollouts=[ROLLOUT], transforms=[{**TRANSFORM, "vectors": 1000}], cascade=CASCADE)
    data = report_data({**plan.to_json(), "headline": plan.headline(), "transforms": [{**TRANSFORM, "vectors": 1000}],
                        "cascade": CASCADE, "rollouts": [ROLLOUT]}, report, {})
    md = report_markdown(data)
    assert "→ transform the v1 gallery with procrustes (old -> new, no model) (the plan's choice)" in md
    assert "## Remedies side by side" in md and "- options" not in md and "- transforms" not in md
    assert md.count("<- recommended") == 1
