"""Ties in Recall@k: the tie share and the three readings on galleries with exact ties, counted by hand.

The galleries hold duplicated unit vectors (1-bit features: every score is exactly 0 or 1), so each query's tie group
is known on paper; the expected reading is checked against an enumeration of every order of the tie group.
"""
import itertools
import math

import numpy as np
import pytest

from engine.core.vocab import RANK_TIE_TOLERANCE
from engine.metrics.compatibility import CellFeatures, compatibility_matrices, stored_summary
from engine.metrics.paired import PairedOptions
from engine.metrics.retrieval import cell_stats, metrics_from_stats
from engine.metrics.sharded import Shard, sharded_cell_stats
from engine.metrics.ties import expected_hits, reading_verdicts, tie_outcomes, ties_decide

E0, E1 = [1.0, 0.0], [0.0, 1.0]


def _one_bit():
    """Query 0 (class 0, e0) meets e0 in items 0 (class 0), 1 (class 1), 3 (class 2): one positive, two negatives tied.
    Query 1 (class 1, e1) meets e1 in items 2 (class 1) and 4 (class 2): one positive, one negative tied; item 1
    (class 1, e0) is a positive at 0. Query 2 (class 2, e1): positive item 4 ties negative item 2, and item 3 (class
    2, e0) scores 0."""
    g = np.array([E0, E0, E1, E0, E1], np.float32)
    return np.array([E0, E1, E1], np.float32), np.array([0, 1, 2]), g, np.array([0, 1, 1, 2, 2])


def _by_order(above: int, tied: int, positives: int, k: int) -> float:
    """The hit rate at k over every distinct order of the tie group (0 = negative, 1 = positive) after ``above``."""
    orders = set(itertools.permutations([0] * tied + [1] * positives))
    return sum(above + order.index(1) < k for order in orders) / len(orders)


@pytest.mark.parametrize("backend", ["numpy", "torch", "faiss"])
@pytest.mark.parametrize("want_ap", [True, False])
def test_duplicated_vectors_give_the_hand_counted_readings(backend, want_ap):
    if backend == "faiss":
        pytest.importorskip("faiss")
    if backend == "faiss" and want_ap:
        pytest.skip("faiss serves Recall-only requests")
    stats = cell_stats(*_one_bit(), backend=backend, want_ap=want_ap, top_k=2)
    assert stats.neg_above.tolist() == [0, 0, 0] and stats.neg_tied.tolist() == [2, 1, 1]
    assert stats.pos_tied.tolist() == [1, 1, 1]
    at1, at2 = tie_outcomes(stats, 1), tie_outcomes(stats, 2)
    assert at1.tied.tolist() == [True, True, True]
    assert at1.readings["pessimistic"].tolist() == [0, 0, 0] and at1.readings["optimistic"].tolist() == [1, 1, 1]
    np.testing.assert_allclose(at1.readings["expected"], [1 / 3, 1 / 2, 1 / 2], atol=1e-12)
    # at k = 2: query 0 still misses pessimistically (two tied negatives), queries 1 and 2 hit whatever the order
    assert at2.readings["pessimistic"].tolist() == [0, 1, 1]
    np.testing.assert_allclose(at2.readings["expected"], [2 / 3, 1, 1], atol=1e-12)
    s = at1.summary()
    assert (s["tied"], s["share"], s["pessimistic"], s["optimistic"]) == (3, 1.0, 0.0, 1.0)
    assert s["expected"] == pytest.approx((1 / 3 + 1 / 2 + 1 / 2) / 3, abs=1e-12)
    # the stored value is the pessimistic rule on exact ties: here every tie is exact, so it is the pessimistic reading
    assert metrics_from_stats(stats, ks=(1,), want_map=False)["recall@1"] == 0.0


def test_several_tied_positives_share_the_group():
    # query e0 (class 0): two class-0 items and three negatives all at e0, one negative above nothing
    g = np.array([E0, E0, E0, E0, E0, E1], np.float32)
    stats = cell_stats(np.array([E0], np.float32), np.array([0]), g, np.array([0, 0, 1, 1, 2, 0]), want_ap=False)
    assert (stats.neg_above[0], stats.neg_tied[0], stats.pos_tied[0]) == (0, 3, 2)
    got = tie_outcomes(stats, 1).readings["expected"][0]
    assert got == pytest.approx(1 - 3 / 5, abs=1e-12)  # the first of 5 in random order is a positive: 2 / 5


@pytest.mark.parametrize("above, tied, positives, k", [(a, t, p, k) for a in range(3) for t in range(5)
                                                       for p in range(1, 4) for k in range(1, 6)])
def test_expected_reading_is_the_mean_over_every_order(above, tied, positives, k):
    got = expected_hits(np.array([above]), np.array([tied]), np.array([positives]), k)[0]
    assert got == pytest.approx(_by_order(above, tied, positives, k), abs=1e-12)


def _angle_row(gap: float) -> list[float]:
    """A unit row whose cosine to e0 is 1 - gap."""
    c = 1.0 - gap
    return [c, math.sqrt(1.0 - c * c)]


@pytest.mark.parametrize("gap, tied", [(RANK_TIE_TOLERANCE / 2, True), (RANK_TIE_TOLERANCE * 5, False)])
def test_a_near_tie_counts_within_the_tolerance_only(gap, tied):
    # the positive scores 1, the negative 1 - gap: below it, so the exact rule counts a hit either way
    g = np.array([E0, _angle_row(gap)], np.float32)
    stats = cell_stats(np.array([E0], np.float32), np.array([0]), g, np.array([0, 1]), want_ap=False)
    got = tie_outcomes(stats, 1)
    assert bool(got.tied[0]) is tied
    assert got.readings["pessimistic"][0] == (0.0 if tied else 1.0) and got.readings["optimistic"][0] == 1.0
    assert metrics_from_stats(stats, ks=(1,), want_map=False)["recall@1"] == 1.0  # the value: between the readings


def test_sharded_passes_count_the_same_ties():
    rng = np.random.default_rng(3)
    g = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 90)]  # three distinct vectors: ties everywhere
    gl = rng.integers(0, 5, 90)
    q, ql = g[:30], gl[:30]
    whole = cell_stats(q, ql, g, gl, same_set=False, want_ap=True)
    for want_ap in (True, False):
        parts = sharded_cell_stats(q, ql, [Shard(g[a:b], gl[a:b], np.arange(a, b)) for a, b in ((0, 7), (7, 50), (50, 90))],
                                   want_ap=want_ap)
        for field in ("neg_above", "neg_tied", "pos_tied"):
            assert getattr(parts, field).tolist() == getattr(whole, field).tolist()


def test_reading_verdicts_say_when_ties_decide():
    iv = lambda d, lo, hi: {"diff": d, "lo": lo, "hi": hi, "interval": "queries"}  # noqa: E731
    split = reading_verdicts({"pessimistic": iv(-0.1, -0.2, -0.05), "optimistic": iv(0.1, 0.05, 0.2)})
    assert split == {"pessimistic": "fail", "optimistic": "pass"} and ties_decide(split)
    same = reading_verdicts({"pessimistic": iv(0.1, 0.04, 0.2), "optimistic": iv(0.2, 0.1, 0.3)})
    assert same == {"pessimistic": "pass", "optimistic": "pass"} and not ties_decide(same)
    assert reading_verdicts(None) is None and not ties_decide(None)


def test_a_matrix_cell_stores_its_ties_and_says_when_they_decide_the_verdict():
    # gallery: 4 one-hot items per class. Old queries: half on their class (hits), half on the next class (clean
    # misses): old/old 0.5, no tie. New queries halfway between their class and the next: 4 positives tie 4 negatives
    eye = np.eye(3, dtype=np.float32)
    labels = np.repeat(np.arange(3), 4)
    gallery = eye[labels]
    old = eye[np.where(np.arange(12) % 4 < 2, labels, (labels + 1) % 3)]
    new = (eye[labels] + eye[(labels + 1) % 3]) / np.float32(math.sqrt(2))
    sets = [CellFeatures(old, labels, gallery, labels), CellFeatures(new, labels, gallery, labels)]
    result = compatibility_matrices(sets, metrics=("recall@1", "map"), paired=PairedOptions(resamples=500))
    ties = stored_summary(result, "recall@1")["tie_readings"]
    assert ties["tolerance"] == RANK_TIE_TOLERANCE and "tie_readings" not in stored_summary(result, "map")
    assert ties["tied"][0][0] == 0 and ties["share"][0][0] == 0.0
    assert ties["pessimistic"][0][0] == ties["expected"][0][0] == ties["optimistic"][0][0] == 0.5
    assert ties["tied"][1][0] == 12 and ties["share"][1][0] == 1.0
    assert (ties["pessimistic"][1][0], ties["optimistic"][1][0]) == (0.0, 1.0)
    assert ties["expected"][1][0] == pytest.approx(4 / 8, abs=1e-12)  # the first of 4 + 4 in random order
    assert result.values["recall@1"][1, 0] == 0.0  # the value: the engine's pessimistic rule on exact ties
    # pessimistic: 0 against 0.5 on every pair of queries (fail); optimistic: 1 against 0.5 (pass)
    assert ties["verdicts"][1][0] == {"pessimistic": "fail", "optimistic": "pass"}
    assert ties["decide"][1][0] is True
    assert ties["paired"]["pessimistic"]["diff"][1][0] == pytest.approx(-0.5)
    assert ties["paired"]["optimistic"]["diff"][1][0] == pytest.approx(0.5)


def test_a_cross_test_without_tied_queries_is_not_decided_by_ties():
    eye = np.eye(3, dtype=np.float32)
    labels = np.repeat(np.arange(3), 4)
    sets = [CellFeatures(eye[labels], labels, eye[labels], labels)] * 2
    ties = stored_summary(compatibility_matrices(sets, metrics=("recall@1",), paired=PairedOptions(resamples=50)),
                          "recall@1")["tie_readings"]
    assert ties["tied"] == [[0, None], [0, 0]] and ties["decide"][1][0] is False and ties["verdicts"][1][0] is None


def test_check_upgrade_says_when_ties_decide_its_verdict():
    from engine.upgrade.verdict import check_upgrade
    from engine.upgrade.words import tie_line

    eye = np.eye(3, dtype=np.float32)
    labels = np.repeat(np.arange(3), 4)
    old = eye[np.where(np.arange(12) % 4 < 2, labels, (labels + 1) % 3)]
    new = (eye[labels] + eye[(labels + 1) % 3]) / np.float32(math.sqrt(2))
    report = check_upgrade(CellFeatures(old, labels, eye[labels], labels), CellFeatures(new, labels, eye[labels], labels),
                           metric="recall@1", resamples=300, orderings=())
    ties = report.to_json()["tie_readings"]
    assert ties["cells"]["new/old"]["tied"] == 12 and ties["cells"]["old/old"]["tied"] == 0
    assert [ties["cells"]["new/old"][r] for r in ("pessimistic", "expected", "optimistic")] == [0.0, 0.5, 1.0]
    assert ties["verdicts"] == {"pessimistic": "fail", "optimistic": "pass"} and ties["decide"] is True
    assert "Ties decide it: new is not compatible when tied negatives rank first and compatible when they rank after" \
        in report.sentence()
    assert "new/old 100.0% tied, Recall@1 0.0 / 50.0 / 100.0%" in tie_line(report.to_json())
    plain = check_upgrade(CellFeatures(old, labels, eye[labels], labels), CellFeatures(old, labels, eye[labels], labels),
                          metric="recall@1", resamples=50, orderings=())
    assert plain.tie_readings["decide"] is False and tie_line(plain.to_json()) is None
    assert "Ties decide" not in plain.sentence()
    assert check_upgrade(CellFeatures(old, labels, eye[labels], labels), CellFeatures(new, labels, eye[labels], labels),
                         metric="map", resamples=50, orderings=()).tie_readings is None


@pytest.mark.parametrize("want_ap", [True, False])
def test_every_kernel_counts_near_ties_as_a_plain_loop_does(want_ap):
    import torch

    from engine.metrics.ranking import stats_numba, stats_torch

    rng = np.random.default_rng(5)
    base = rng.integers(-3, 4, size=(60, 25)).astype(np.float64) / 3  # many exact ties
    jitter = rng.choice([0.0, 4e-7, -4e-7, 3e-6, -3e-6], size=base.shape)  # within and beyond the tolerance
    sims = (base + jitter).astype(np.float32)
    sims[rng.random(sims.shape) < 0.1] = -np.inf  # excluded items
    starts = rng.integers(0, 18, 60)
    ends = starts + rng.integers(0, 8, 60)
    got = [stats_numba(sims, starts, ends, want_ap=want_ap),
           stats_torch(torch.tensor(sims), torch.tensor(starts), torch.tensor(ends), want_ap=want_ap)]
    cols = np.arange(25)
    for r in range(60):
        keep = sims[r] != -np.inf
        inside = (cols >= starts[r]) & (cols < ends[r])
        pos, neg = keep & inside, keep & ~inside
        v = sims[r].astype(np.float64)
        best = v[pos].max() if pos.any() else None
        want = (0, 0, 0) if best is None else (
            (v[neg] > best + RANK_TIE_TOLERANCE).sum(), (np.abs(v[neg] - best) <= RANK_TIE_TOLERANCE).sum(),
            (v[pos] >= best - RANK_TIE_TOLERANCE).sum())
        for stats in got:
            assert (stats.neg_above[r], stats.neg_tied[r], stats.pos_tied[r]) == want, r
