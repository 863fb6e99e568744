"""Per-query outcomes, the paired ECC test and pair-verification accuracy, on hand-built data."""
import numpy as np
import pytest

from engine.metrics.compatibility import compatibility_matrices
from engine.metrics.paired import PairedOptions, count_verdicts, paired_bootstrap, shared_items, verdict
from engine.metrics.ranking import QueryStats
from engine.metrics.retrieval import metrics_from_stats, parse_metric, per_query_from_stats
from engine.metrics.verification import THRESHOLDS, pair_verification, sample_pairs, verification_outcomes


def test_per_query_vectors_by_hand():
    # 4 queries: the last has no positive; negatives before the best positive: >= 0,1,3 / > 0,0,3
    stats = QueryStats(np.array([2, 1, 1, 0]), np.array([0, 1, 3, 0]), np.array([0, 0, 3, 0]),
                       np.array([1.0, 0.5, 0.25, np.nan]), np.full(4, np.nan))
    valid, v = per_query_from_stats(stats, ks=(1, 2), rank_ties="pessimistic")
    assert valid.tolist() == [True, True, True, False]
    assert v["recall@1"].tolist() == [True, False, False, False]
    assert v["recall@2"].tolist() == [True, True, False, False]
    assert v["recall@1"].dtype == bool
    assert np.allclose(v["map"][:3], [1.0, 0.5, 0.25]) and np.isnan(v["map"][3])
    _, opt = per_query_from_stats(stats, ks=(1,), rank_ties="optimistic")
    assert opt["recall@1"].tolist() == [True, True, False, False]
    m = metrics_from_stats(stats, ks=(1, 2))
    assert m["recall@1"] == pytest.approx(1 / 3) and m["recall@2"] == pytest.approx(2 / 3)
    assert m["map"] == pytest.approx(1.75 / 3) and m["n_no_positive"] == 1


def test_bootstrap_clear_pass_fail_and_straddle():
    ones, zeros = np.ones(200), np.zeros(200)
    d, lo, hi = paired_bootstrap(ones, zeros)
    assert (d, lo, hi) == (1.0, 1.0, 1.0) and verdict(lo, hi, True) == "pass"
    d, lo, hi = paired_bootstrap(zeros, ones)
    assert hi == -1.0 and verdict(lo, hi, False) == "fail"
    mixed = np.r_[np.ones(100), np.zeros(100)]
    d, lo, hi = paired_bootstrap(mixed, mixed[::-1])  # +1 on 100 items, -1 on 100: mean 0
    assert d == 0 and lo < 0 < hi and verdict(lo, hi, False) == "unresolved"
    # 60 wins, 40 losses of 200 (mean +0.1): se = sqrt((100*0.01 + 60*0.81 + 40*1.21) / 200 / 200) ~ 0.049 -> lo ~ 0.004
    cross = np.r_[np.ones(60), np.zeros(40), np.zeros(100)]
    selft = np.r_[np.zeros(60), np.ones(40), np.zeros(100)]
    d, lo, hi = paired_bootstrap(cross, selft, resamples=4000)
    assert d == pytest.approx(0.1) and lo == pytest.approx(0.1 - 1.96 * 0.0494, abs=0.02)
    assert hi == pytest.approx(0.1 + 1.96 * 0.0494, abs=0.02)


def test_bootstrap_deterministic_under_seed_and_nan_items_left_out():
    rng = np.random.default_rng(1)
    a, b = rng.random(300), rng.random(300)
    assert paired_bootstrap(a, b, seed=(3, 1, 0)) == paired_bootstrap(a, b, seed=(3, 1, 0))
    assert paired_bootstrap(a, b, seed=1)[1] != paired_bootstrap(a, b, seed=2)[1]
    a[:100] = np.nan
    assert paired_bootstrap(a, b)[0] == pytest.approx(np.mean(a[100:] - b[100:]))
    assert all(np.isnan(paired_bootstrap(np.full(3, np.nan), np.ones(3))))


def test_verdict_combines_with_strict_ecc():
    assert verdict(0.0, 0.0, False) == "fail"  # identical outcomes: strict ECC fails, no evidence otherwise
    assert verdict(0.0, 0.1, True) == "unresolved"
    assert verdict(0.01, 0.1, False) == "unresolved"  # never a pass without the strict ECC
    assert verdict(-0.2, -0.01, True) == "fail"
    assert verdict(np.nan, np.nan, True) is None
    assert count_verdicts([[None], ["pass", None], ["fail", "unresolved"]]) == {"pass": 1, "fail": 1, "unresolved": 1}
    # under the tie rule "pass" (ECC >=): identical outcomes pass; a straddling interval stays unresolved
    assert verdict(0.0, 0.0, True, ties="pass") == "pass"
    assert verdict(-0.01, 0.02, True, ties="pass") == "unresolved"
    assert verdict(-0.2, -0.01, False, ties="pass") == "fail"
    with pytest.raises(ValueError, match="resamples"):
        PairedOptions(resamples=0)


def test_shared_items_by_id_and_by_position():
    a, b = shared_items(np.array([5, 1, 7]), np.array([7, 5, 9]), 3, 3)
    assert sorted(zip([5, 1, 7][i] for i in a)) == [(5,), (7,)]
    assert [np.array([5, 1, 7])[i] for i in a] == [np.array([7, 5, 9])[j] for j in b]
    with pytest.raises(ValueError, match="without item ids"):
        shared_items(None, None, 3, 4)


def _sets(noise: list[float], seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(4), 25)
    centres = np.eye(4, 16) * 3
    out = []
    for s in noise:
        f = centres[labels] + rng.normal(scale=s, size=(100, 16))
        out.append(dict(query_features=f, query_labels=labels, gallery_features=f, gallery_labels=labels))
    return out


def test_matrix_paired_verdicts_and_determinism():
    sets = _sets([4.0, 0.05])  # model 1 noisy, model 2 clean: its queries against model 1's gallery do better
    opts = PairedOptions(resamples=500, seed=7)
    r = compatibility_matrices(sets, metrics=("recall@1", "map"), same_set=True, paired=opts)
    C = r.values["recall@1"]
    assert C[1, 0] > C[0, 0] + 0.2
    assert r.paired["recall@1"]["verdict"][1][0] == "pass" and r.paired["recall@1"]["lo"][1, 0] > 0
    assert r.paired["recall@1"]["diff"][1, 0] == pytest.approx(C[1, 0] - C[0, 0])
    assert r.paired["map"]["n"][1, 0] == 100 and r.paired["map"]["verdict"][0][0] is None
    again = compatibility_matrices(sets, metrics=("recall@1", "map"), same_set=True, paired=opts)
    assert np.array_equal(again.paired["map"]["lo"], r.paired["map"]["lo"], equal_nan=True)
    assert compatibility_matrices(sets, metrics=("recall@1",), same_set=True).paired is None


def test_parse_verification_and_backfill_rejects_it():
    assert parse_metric("Verification") == ("verification", None)
    with pytest.raises(ValueError, match="unknown metric"):
        parse_metric("verification", pairs=False)


def test_sample_pairs_seeded_balanced_no_self_pairs():
    labels = np.repeat(np.arange(3), 4)
    qi, gi, same = sample_pairs(labels, labels, n_pairs=50, seed=3, same_set=True)
    assert same.sum() == 50 and (~same).sum() == 50
    assert np.array_equal(labels[qi] == labels[gi], same) and not np.any(qi == gi)
    again = sample_pairs(labels, labels, n_pairs=50, seed=3, same_set=True)
    assert all(np.array_equal(x, y) for x, y in zip((qi, gi, same), again))
    assert not np.array_equal(sample_pairs(labels, labels, n_pairs=50, seed=4, same_set=True)[0], qi)
    with pytest.raises(ValueError, match="two images"):
        sample_pairs(np.arange(3), np.arange(3), same_set=True)
    with pytest.raises(ValueError, match="different classes"):
        sample_pairs(np.zeros(3, int), np.zeros(3, int))


def _reference_accuracy(dist: np.ndarray, same: np.ndarray) -> float:
    """The released code's loop (10 contiguous folds, grid thresholds, argmax) written out plainly."""
    n = len(dist)
    sizes = [n // 10 + (1 if f < n % 10 else 0) for f in range(10)]
    accs, start = [], 0
    for size in sizes:
        test = np.arange(start, start + size)
        train = np.setdiff1d(np.arange(n), test)
        train_acc = [np.mean((dist[train] < th) == same[train]) for th in THRESHOLDS]
        th = THRESHOLDS[int(np.argmax(train_acc))]
        accs.append(np.mean((dist[test] < th) == same[test]))
        start += size
    return float(np.mean(accs))


def test_verification_matches_the_reference_loop():
    rng = np.random.default_rng(0)
    n = 103
    same = rng.random(n) < 0.5
    q = rng.normal(size=(n, 6))
    g = np.where(same[:, None], q + rng.normal(scale=0.9, size=(n, 6)), rng.normal(size=(n, 6)))
    acc, correct = verification_outcomes(q, g, same)
    qn, gn = q / np.linalg.norm(q, axis=1, keepdims=True), g / np.linalg.norm(g, axis=1, keepdims=True)
    assert acc == pytest.approx(_reference_accuracy(np.sum((qn - gn) ** 2, 1), same))
    assert correct.dtype == bool and len(correct) == n


def test_verification_separable_and_chance():
    labels = np.repeat(np.arange(2), 10)
    feats = np.eye(2)[labels]  # each class on its own axis: same-class distance 0, other class 2
    acc, correct = pair_verification(feats, labels, feats, labels, same_set=True, n_pairs=100)
    assert acc == 1.0 and correct.all()
    other = np.eye(2)[1 - labels]  # gallery model maps every class onto the other's axis
    acc, _ = pair_verification(feats, labels, other, labels, same_set=True, n_pairs=100)
    # "different" pairs now look identical (distance 0) and "same" ones far (2): "closer = same" can at best call
    # every pair of a fold whatever kind is the majority of the other nine folds - about chance
    qi, gi, same = sample_pairs(labels, labels, n_pairs=100, same_set=True)
    assert acc == pytest.approx(_reference_accuracy(np.sum((feats[qi] - other[gi]) ** 2, 1), same))
    assert 0.35 < acc < 0.6


def test_cli_and_heatmap_show_verdicts_and_gain():
    from app.charts import matrix_frame
    from engine.metrics import ecc_pass, update_gain
    from engine.results.report import render_matrix

    C = np.array([[0.5, np.nan, np.nan], [0.6, 0.7, np.nan], [0.45, 0.71, 0.8]])
    paired = {"verdict": [[None] * 3, ["pass", None, None], ["fail", "unresolved", None]],
              "lo": [[None] * 3, [0.02, None, None], [-0.1, -0.02, None]], "hi": [[None] * 3, [0.2, None, None], [-0.01, 0.04, None]],
              "confidence": 0.95, "resamples": 1000, "seed": 0, "items": "queries"}
    text = render_matrix(C, paired=paired, gain=update_gain(C))
    assert "60.00 ✓" in text and "45.00* ✗" in text and "71.00 ?" in text
    assert "1 ✓ pass, 1 ✗ fail, 1 ? unresolved" in text
    assert "M2→M1 50.0" in text  # (0.6 - 0.5) / (0.7 - 0.5)
    frame = matrix_frame(C, ecc_pass(C), ["M1", "M2", "M3"], paired=paired, gain=update_gain(C).tolist())
    cell = frame[(frame["query"] == "M3") & (frame["gallery"] == "M2")].iloc[0]
    assert cell["verdict"] == "unresolved" and cell["label"] == "71.0 ?" and cell["interval"] == "[-2.0, +4.0] pts"
    assert cell["gain"] == pytest.approx((0.71 - 0.7) / (0.8 - 0.7))
