"""The evidence base in small (bench/bench_evidence.py on a toy corpus) and its bookkeeping (engine.upgrade.evidence):
agreement, false ship and false block counted by hand, Clopper-Pearson bounds against scipy, the quick decision
against the plan computed in full, and the recovery forecast's pieces against numpy."""
from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from engine.metrics.compatibility import CellFeatures
from engine.upgrade import evidence as ev
from engine.upgrade import forecast as fc
from engine.upgrade.migration import decide_in_memory
from engine.upgrade.plan import DECISIONS
from engine.upgrade.verdict import check_upgrade

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> dict:
    return runpy.run_path(str(ROOT / "bench" / "bench_evidence.py"))


@pytest.mark.parametrize("k,n", [(0, 1), (0, 97), (0, 272), (3, 40), (17, 480), (39, 40)])
def test_clopper_pearson_upper_matches_scipy(k, n):
    got = ev.clopper_pearson_upper(k, n)
    assert got == pytest.approx(stats.beta.ppf(0.95, k + 1, n - k), abs=1e-9)
    assert got == pytest.approx(stats.binomtest(k, n).proportion_ci(confidence_level=0.90, method="exact").high, abs=1e-9)
    assert ev.clopper_pearson_upper(n, n) == 1.0
    assert ev.clopper_pearson_upper(0, 272) == pytest.approx(1 - 0.05 ** (1 / 272), abs=1e-12)  # the 1.1 %


@pytest.mark.parametrize("k, n", [(0, 10), (3, 7), (242, 249), (249, 249)])
def test_clopper_pearson_lower_matches_scipy(k, n):
    """The lower one-sided bound is scipy's exact interval's lower end at twice the tail (binomtest, two-sided 90 %)."""
    want = stats.binomtest(k, n).proportion_ci(confidence_level=0.90, method="exact").low
    assert ev.clopper_pearson_lower(k, n) == pytest.approx(want, abs=1e-9)
    assert ev.rate(k, n)["lower"] == pytest.approx(want, abs=1e-9)


def test_bounds_refuse_counts_that_are_not_a_rate():
    for k, n in ((1, 0), (-1, 5), (6, 5), (0.5, 5), (True, 5)):
        for bound in (ev.clopper_pearson_upper, ev.clopper_pearson_lower):
            with pytest.raises(ValueError, match="whole counts"):
                bound(k, n)


def test_outcomes_and_rates_counted_by_hand():
    draws = [  # (run, truth, sampled) -> outcome by the module docstring's rules
        (0, "do not ship", "do not ship"),  # agree
        (0, "do not ship", "ship as is"),  # false ship
        (1, "ship with adapter", "ship as is"),  # false ship: the adapter is left out
        (1, "ship with adapter", "ship with adapter"),  # agree
        (2, "ship as is", "ship with adapter"),  # costlier (an adapter not needed)
        (2, "ship as is", "do not ship"),  # false block
        (3, "backfill", "do not ship yet"),  # too close
        (3, "backfill", "do not ship"),  # false block
        (4, "do not ship yet", "do not ship"),  # other: the whole corpus itself is too close
        (5, "ship with adapter", "backfill"),  # costlier (a backfill where the adapter does)
        (6, "backfill", "ship as is"),  # false ship
    ]
    want = ["agree", "false ship", "false ship", "agree", "costlier", "false block", "too close", "false block", "other",
            "costlier", "false ship"]
    assert [ev.outcome(t, s) for _, t, s in draws] == want
    records = [{"run": r, "truth": t, "decision": s} for r, t, s in draws]
    got = ev.decision_rates(records)
    assert (got["agree"]["k"], got["agree"]["n"]) == (2, 11)
    # false ship: over the draws whose truth is not "ship as is" (9 of them); false block: truth ships or backfills (8)
    assert (got["false_ship"]["k"], got["false_ship"]["n"]) == (3, 9)
    assert (got["false_block"]["k"], got["false_block"]["n"]) == (2, 8)
    assert (got["too_close"]["k"], got["costlier"]["k"], got["other"]["k"]) == (1, 2, 1)
    # both decide: neither says "do not ship yet" (drops the draws 6 and 8): 2 agree of 9, 4 with the costlier two
    assert (got["agree_when_both_decide"]["k"], got["agree_when_both_decide"]["n"]) == (2, 9)
    assert (got["agree_or_costlier_when_both_decide"]["k"], got["agree_or_costlier_when_both_decide"]["n"]) == (4, 9)
    assert got["false_ship"]["upper"] == pytest.approx(stats.beta.ppf(0.95, 4, 6), abs=1e-9)
    per_run = ev.run_rates(records)  # runs 0, 1 and 6 each hold a false ship; runs 2 and 3 a false block
    assert (per_run["false_ship"]["k"], per_run["false_ship"]["n"]) == (3, 6)  # all runs but 2 (ship as is)
    assert (per_run["false_block"]["k"], per_run["false_block"]["n"]) == (2, 5)  # runs 1, 2, 3, 5, 6
    assert per_run["all_agree"]["k"] == 0
    assert len(ev.disagreements([{**r, "true_gap": 0.0, "true_better": 0.0} for r in records])) == 8


def test_gap_bins_and_verdict_errors():
    assert [ev.gap_bin(g) for g in (0.0, -0.49, 0.5, -0.99, 1.0, 1.99, -2.0, 40.0)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [ev.bin_label(i) for i in range(4)] == ["< 0.5", "0.5-1", "1-2", ">= 2"]
    assert ev.verdict_error("compatible", 0.0, "guardrail")  # strict ECC: a gap of exactly 0 does not pass
    assert not ev.verdict_error("compatible", 0.1, "guardrail")
    assert ev.verdict_error("not better", 0.3, "success") and not ev.verdict_error("too close to call", 5.0, "success")
    draws = [{"verdict": v, "true_gap": g, "fraction": 0.01} for v, g in
             (("compatible", -0.2), ("too close to call", 0.3), ("not compatible", -3.0), ("not compatible", 2.5))]
    rows = ev.verdict_bins(draws, "guardrail")
    assert [(r["draws"], r["error"]["k"], r["too_close"]["k"]) for r in rows] == [(2, 1, 1), (0, 0, 0), (0, 0, 0),
                                                                                   (2, 1, 0)]
    curve = ev.operating_curve(draws)
    in_bin = {(r["verdict"], r["share"]) for r in curve if r["bin"] == 1}  # [-5, -2) points
    assert in_bin == {("not compatible", 1.0), ("compatible", 0.0), ("too close to call", 0.0)}


def _toy(seed: int = 0, n_q: int = 400, n_g: int = 800, classes: int = 20, dim: int = 16):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)) * 1.5
    ql, gl = rng.integers(classes, size=n_q), rng.integers(classes, size=n_g)
    base = {"query": centres[ql] + rng.normal(size=(n_q, dim)), "gallery": centres[gl] + rng.normal(size=(n_g, dim))}
    old = {k: (v + 0.6 * rng.normal(size=v.shape)).astype(np.float32) for k, v in base.items()}
    rot = np.linalg.qr(rng.normal(size=(dim, dim)))[0]
    versions = {"old": old, "fp16": {k: v.astype(np.float16).astype(np.float32) for k, v in old.items()},
                "rotated": {k: (v @ rot).astype(np.float32) for k, v in old.items()},
                "cleaner": {k: (v + 0.2 * rng.normal(size=v.shape)).astype(np.float32) for k, v in base.items()}}
    versions["rotated cleaner"] = {k: (v @ rot).astype(np.float32) for k, v in versions["cleaner"].items()}
    return ql, gl, versions


def test_a_few_runs_are_counted_as_the_bookkeeping_says(bench):
    ql, gl, versions = _toy()
    corpus = bench["Corpus"]("toy", "toy", ql, gl, False, "toy")
    runs = [bench["run_pair"](i, corpus, versions["old"], versions[new], ("old", new), 2, "map")
            for i, new in enumerate(("fp16", "rotated", "cleaner"))]
    draws = bench["flat_draws"](runs)
    assert len(draws) == 3 * len(bench["FRACTIONS"]) * 2  # every draw judged (no sample without a positive)
    assert all(d["decision"] in DECISIONS and d["truth"] in DECISIONS for d in draws)
    assert {d["n_queries"] for d in draws if d["fraction"] == 0.01} == {4}
    assert runs[1]["truth"]["decision"] == "do not ship"  # a rotated copy: not better on its own, nothing to pay for
    summary = bench["summarise"](runs, {"toy": True})
    agree = sum(d["decision"] == d["truth"] for d in draws)  # recounted here without the module
    ship = sum(d["decision"] in ("ship as is", "ship with adapter") and d["truth"] not in ("ship as is", "ship with adapter")
               or (d["decision"] == "ship as is" and d["truth"] == "ship with adapter") for d in draws)
    assert summary["overall"]["agree"]["k"] == agree and summary["overall"]["draws"] == len(draws)
    assert summary["overall"]["false_ship"]["k"] == ship
    assert summary["overall"]["agree"]["upper"] == pytest.approx(stats.beta.ppf(0.95, agree + 1, len(draws) - agree)
                                                                 if agree < len(draws) else 1.0, abs=1e-9)
    assert sum(r["draws"] for r in summary["per_fraction"].values()) == len(draws)
    assert len(summary["disagreements"]) == sum(d["decision"] != d["truth"] and d["decision"] != "do not ship yet"
                                                for d in draws)
    again = bench["run_pair"](1, corpus, versions["old"], versions["rotated"], ("old", "rotated"), 2, "map")
    assert [d["decision"] for d in again["draws"]] == [d["decision"] for d in runs[1]["draws"]]  # seeded draws


def test_the_quick_decision_is_the_full_plans(bench):
    ql, gl, versions = _toy(seed=1, n_q=200, n_g=400)
    full_path = []
    for new in ("fp16", "rotated", "cleaner", "rotated cleaner"):
        old_c = CellFeatures(versions["old"]["query"], ql, versions["old"]["gallery"], gl)
        new_c = CellFeatures(versions[new]["query"], ql, versions[new]["gallery"], gl)
        _, quick, _ = bench["decide"](old_c, new_c, ("old", new), "map")
        report = check_upgrade(old_c, new_c, names=("old", new), metric="map")
        full = decide_in_memory(old_c, new_c, report).plan
        assert (quick.decision, quick.headline()) == (full.decision, full.headline())
        full_path.append(not bench["verdicts_decide"](full))
    assert any(full_path)  # a better, incompatible model: adapters and backfill curves decide (rules 5-7)


def test_forecast_pieces_against_numpy():
    rng = np.random.default_rng(5)
    old = rng.normal(size=(300, 8))
    rot = np.linalg.qr(rng.normal(size=(8, 8)))[0]
    w = fc.procrustes_map(old @ rot.T, old)  # new = old rotated: the map undoes it
    assert np.allclose(w, rot, atol=1e-8)
    assert fc.procrustes_residual(old[:50] @ rot.T, old[:50], w) == pytest.approx(0.0, abs=1e-9)
    noisy = old + 0.3 * rng.normal(size=old.shape)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    assert fc.procrustes_residual(noisy, old, np.eye(8)) == pytest.approx(1 - np.mean(np.sum(unit(noisy) * unit(old), 1)))
    oo, nn = rng.uniform(0.2, 0.8, 500), rng.uniform(0.4, 1.0, 500)
    adapted = oo * rng.uniform(0.7, 1.0, 500)
    oo[3] = np.nan
    ratio, se, n = fc.paired_ratio(oo, nn)
    keep = ~np.isnan(oo)
    assert n == 499 and ratio == pytest.approx(oo[keep].mean() / nn[keep].mean())
    boot = np.random.default_rng(0).integers(n, size=(4000, n))  # the delta method's se against a bootstrap's
    ratios = oo[keep][boot].mean(1) / nn[keep][boot].mean(1)
    assert se == pytest.approx(ratios.std(), rel=0.1)
    cal = fc.Calibration(bias=0.2, tau_old=0.03, q_old=1.5, tau_new=0.04, q_new=2.0)
    f = fc.forecast_recovery(oo, nn, adapted, 0.1, calibration=cal)
    of_old = adapted[keep].mean() / oo[keep].mean()  # by hand: the paired ratio plus bias x residual, times the ceiling
    se_old = np.std((adapted[keep] - of_old * oo[keep]) / oo[keep].mean(), ddof=1) / np.sqrt(n)
    assert f.share_of_old == pytest.approx(of_old + 0.02) and f.share_of_new == pytest.approx((of_old + 0.02) * ratio)
    assert f.ceiling == pytest.approx(ratio) and f.n_queries == 499
    assert f.old_hi - f.share_of_old == pytest.approx(1.5 * np.hypot(0.03, se_old))
    with pytest.raises(ValueError, match="residual"):
        fc.forecast_recovery(oo, nn, adapted, -0.5)
    with pytest.raises(ValueError, match="paired"):
        fc.forecast_recovery(oo, nn[:10], adapted, 0.1)


def test_the_forecast_calibration_covers_where_its_model_holds():
    """Rows built so that the truth is the paired ratio plus 0.05 x residual plus a small error: the fit finds the
    bias, and held-out rows are covered about as often as the level says."""
    rng = np.random.default_rng(2)
    rows = []
    for run in range(60):
        residual = rng.uniform(0, 0.5)
        oo = rng.uniform(0.1, 0.9, 400)
        nn = np.clip(oo * rng.uniform(0.9, 1.3), 0, 1)
        adapted = oo * rng.uniform(0.7, 1.0)
        true_old = adapted.mean() / oo.mean() + 0.05 * residual + rng.normal(0, 0.005)
        rows.append({"run": run, "corpus": f"c{run % 3}", "fraction": "whole", "oo": oo, "nn": nn, "adapted": adapted,
                     "residual": residual, "share_of_old": true_old, "share_of_new": true_old * oo.mean() / nn.mean()})
    cal = fc.fit_calibration(rows)
    assert cal.bias == pytest.approx(0.05, abs=0.01)
    got = fc.validate(rows)
    assert got["leave_one_run_out"]["all"]["old"]["coverage"] >= 0.8
    assert got["leave_one_run_out"]["whole"]["n"] == 60 and got["calibration"]["bias"] == pytest.approx(cal.bias)


def test_trained_sequences_train_once_and_make_a_corpus(bench, tmp_path):
    """Two of the trained sequences at a tiny budget (16 images per class, one epoch: seconds; the bench's own budget
    takes minutes): a second call finds them trained, reads the same features, and a run on them is judged."""
    budget = {"train_per_class": 16, "test_per_class": 12, "epochs": 1, "width": 8}
    methods = ("independent", "bct_er")
    emb, corpus, timing = bench["train_sequences"](budget, tmp_path, lambda msg: None, methods)
    if corpus is None:
        pytest.skip("Fashion-MNIST is not on this machine (Debian's dataset-fashion-mnist)")
    steps = bench["TRAINED_SCENARIO"]["num_steps"]
    assert sorted(emb) == sorted(f"{m}-{k}" for m in methods for k in range(1, steps + 1))
    assert (timing["sequences"], timing["already_trained"], timing["images"]) == (2, 0, 120)
    counts = np.bincount(corpus.query_labels, minlength=10)
    assert counts.tolist() == [4] * 10 and np.bincount(corpus.gallery_labels).tolist() == [8] * 10  # 12 // 3 a class
    assert emb["independent-1"]["fashion-test"]["query"].shape == (40, 8)
    again, _, timing2 = bench["train_sequences"](budget, tmp_path, lambda msg: None, methods)
    assert timing2["already_trained"] == 2  # found by the config's hash: nothing trained again
    for name, splits in emb.items():
        for split, x in splits["fashion-test"].items():
            np.testing.assert_allclose(again[name]["fashion-test"][split], x, rtol=0, atol=1e-7)
    run = bench["run_pair"](0, corpus, emb["bct_er-1"]["fashion-test"], emb["bct_er-2"]["fashion-test"],
                            ("bct_er-1", "bct_er-2"), 1, "map")
    assert run["truth"]["decision"] in DECISIONS and run["truth"]["n_queries"] == 40


def test_the_query_split_is_each_class_first_third(bench):
    labels = np.array([2, 0, 2, 2, 0, 1, 2, 0, 0, 0, 0, 2])  # class 0: 6 items -> 2 queries; 1: 1 -> 0; 2: 5 -> 1
    got = bench["first_thirds"](labels)
    assert np.flatnonzero(got).tolist() == [0, 1, 4]
