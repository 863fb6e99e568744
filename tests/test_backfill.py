"""Partial backfilling curves: hand-computed cases, exact agreement with the evaluation core, orderings, errors."""
import numpy as np
import pytest

from engine.metrics.backfill import backfill_counts, backfill_curve, backfill_curves, curve_area, fraction_to_reach
from engine.metrics.backfill_kernels import segment_maxima, segment_of_columns
from engine.metrics.backfill_orders import ORDERINGS, backfill_order
from engine.metrics.retrieval import retrieval_metrics
from engine.metrics.retrieval import cell_stats, metrics_from_stats

ALL = ("recall@1", "recall@5", "map", "map@10")


def _pair(n=300, d=12, classes=10, seed=0):
    """Old and new embeddings of the same gallery items (new is tighter around the class centres)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, d))
    y = rng.integers(0, classes, n)
    old = (centres[y] + 1.3 * rng.normal(size=(n, d))).astype(np.float32)
    new = (centres[y] + 0.8 * rng.normal(size=(n, d))).astype(np.float32)
    query = (centres[y] + 0.8 * rng.normal(size=(n, d))).astype(np.float32)
    return query, old, new, y


def _mixed(old, new, order, k):
    g = old.copy()
    g[order[:k]] = new[order[:k]]
    return g


def _hand_case():
    # q = [1, 0] of class 0. Cosines to q -- old: g0 0 (pos), g1 0.981 (neg), g2 -1 (pos);
    # new: g0 1 (pos), g1 0 (neg), g2 0.995 (pos). Backfilled in the order g1, g2, g0.
    q = np.array([[1.0, 0.0]], np.float32)
    old = np.array([[0.0, 1.0], [1.0, 0.2], [-1.0, 0.0]], np.float32)
    new = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1]], np.float32)
    return q, np.array([0]), old, new, np.array([0, 1, 0]), np.array([1, 2, 0])


def test_hand_computed_curve_and_area():
    q, ql, old, new, gl, order = _hand_case()
    fr = np.array([0.0, 1 / 3, 2 / 3, 1.0])
    out = backfill_curves(q, ql, old, new, gl, order=order, fractions=fr, metrics=("recall@1", "map"))
    assert out["n_backfilled"].tolist() == [0, 1, 2, 3]
    # beta 0: g1 (neg) first -> miss; positives at ranks 2, 3 -> AP (1/2 + 2/3) / 2
    # beta 1/3: g1 new ties g0 at 0 -> miss (pessimistic); same AP
    # beta 2/3: g2 new 0.995 first -> hit; g0 (0) ties g1 (0): precision 2/3 -> AP (1 + 2/3) / 2
    # beta 1: g0 1, g2 0.995, g1 0 -> hit, AP 1
    assert out["recall@1"].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert out["map"] == pytest.approx([7 / 12, 7 / 12, 5 / 6, 1.0])
    assert curve_area(fr, out["recall@1"]) == pytest.approx(1 / 2)  # (0 + 1/2 + 1) / 3
    assert curve_area(fr, out["map"]) == pytest.approx(53 / 72)  # (7/12 + 17/24 + 11/12) / 3
    _, optimistic = backfill_curve(q, ql, old, new, gl, order=order, fractions=fr, rank_ties="optimistic")
    assert optimistic.tolist() == [0.0, 1.0, 1.0, 1.0]  # the tie at beta 1/3 now counts as a hit
    assert fraction_to_reach(fr, out["recall@1"], 1.0) == pytest.approx(2 / 3)
    assert fraction_to_reach(fr, out["map"], 0.7) == pytest.approx(1 / 3 + (0.7 - 7 / 12) / (5 / 6 - 7 / 12) / 3)


@pytest.mark.parametrize("same_set", [False, True])
@pytest.mark.parametrize("metrics", [("recall@1",), ALL])
def test_endpoints_equal_cross_and_self_test_exactly(same_set, metrics):
    query, old, new, y = _pair()
    if same_set:
        query = new  # the new model's embeddings of the gallery images themselves
    order = backfill_order("random", gallery_labels=y, seed=3)
    out = backfill_curves(query, y, old, new, y, order=order, metrics=metrics, same_set=same_set)
    cross = retrieval_metrics(query, y, old, y, ks=(1, 5), map_at=10, same_set=same_set)
    self_test = retrieval_metrics(query, y, new, y, ks=(1, 5), map_at=10, same_set=same_set)
    for m in metrics:
        assert out[m][0] == cross[m] and out[m][-1] == self_test[m]  # bit for bit
    assert (out["n_queries"], out["n_valid"], out["n_no_positive"]) == (cross["n_queries"], cross["n_valid"], cross["n_no_positive"])


@pytest.mark.parametrize("same_set", [False, True])
@pytest.mark.parametrize("rank_ties", ["pessimistic", "optimistic"])
def test_every_fraction_equals_a_naive_recompute(same_set, rank_ties):
    query, old, new, y = _pair(seed=1)
    if same_set:
        query = new
    order = backfill_order("distance_mse", old_gallery=old, gallery_labels=y)
    out = backfill_curves(query, y, old, new, y, order=order, metrics=ALL, same_set=same_set, rank_ties=rank_ties)
    _, fast_r1 = backfill_curve(query, y, old, new, y, order=order, same_set=same_set, rank_ties=rank_ties)  # kernel-free path
    assert len(set(out["recall@1"])) > 3  # the curve actually moves
    for i, k in enumerate(out["n_backfilled"]):
        naive = retrieval_metrics(query, y, _mixed(old, new, order, k), y, ks=(1, 5), map_at=10, same_set=same_set, rank_ties=rank_ties)
        assert [out[m][i] for m in ALL] == [naive[m] for m in ALL]
        assert fast_r1[i] == naive["recall@1"]


@pytest.mark.parametrize("metrics", [("recall@1",), ("recall@1", "map")])
def test_query_blocks_change_nothing(metrics):
    query, old, new, y = _pair(n=200, seed=2)
    order = backfill_order("random", gallery_labels=y, seed=0)
    fr = np.linspace(0, 1, 11)
    out = backfill_curves(query, y, old, new, y, order=order, fractions=fr, metrics=metrics, max_block=7 * 200)  # 7 rows a block
    for i, k in enumerate(out["n_backfilled"]):
        stats = cell_stats(query, y, _mixed(old, new, order, k), y, want_ap=True, max_block=7 * 200)
        naive = metrics_from_stats(stats, ks=(1,))
        assert [out[m][i] for m in metrics] == [naive[m] for m in metrics]


@pytest.mark.parametrize("metrics", [("recall@1",), ("recall@1", "map")])
def test_a_grid_that_does_not_span_0_to_1(metrics):
    query, old, new, y = _pair(n=150, seed=5)
    order = backfill_order("distance_cosine", old_gallery=old, gallery_labels=y)
    fr = [0.2, 0.5, 0.7]  # items before 20% are backfilled at every point, items after 70% never
    out = backfill_curves(query, y, old, new, y, order=order, fractions=fr, metrics=metrics)
    assert out["n_backfilled"].tolist() == [30, 75, 105]
    for i, k in enumerate(out["n_backfilled"]):
        naive = retrieval_metrics(query, y, _mixed(old, new, order, k), y, ks=(1,))
        assert [out[m][i] for m in metrics] == [naive[m] for m in metrics]


def test_segments_of_columns_by_hand():
    # columns in backfilling order 2, 0, 1; 0, 1 and 3 items backfilled at the three fractions
    assert segment_of_columns(np.array([2, 0, 1]), np.array([0, 1, 3])).tolist() == [2, 2, 1]
    # a grid stopping at 1 item: columns 0 and 1 are never backfilled (segment 2 = past the grid)
    assert segment_of_columns(np.array([2, 0, 1]), np.array([0, 1])).tolist() == [2, 2, 1]


def test_segment_maxima_compiled_and_torch_agree():
    import torch

    rng = np.random.default_rng(6)
    s_old, s_new = (torch.as_tensor(rng.normal(size=(40, 90)).astype(np.float32)) for _ in range(2))
    s_old[3, 5] = s_new[3, 5] = -np.inf  # an excluded item
    starts = rng.integers(0, 80, 40)
    ends = starts + rng.integers(0, 10, 40)
    segment = rng.integers(0, 6, 90)
    a = segment_maxima(s_old, s_new, segment, starts, ends, 6, engine="numba")
    b = segment_maxima(s_old, s_new, segment, starts, ends, 6, engine="torch")
    assert a.shape == (4, 40, 6) and np.array_equal(a, b)
    r = int(np.flatnonzero(ends > starts)[0])
    s = segment[starts[r]]  # hand check: one query's best positive of one segment
    cols = [j for j in range(starts[r], ends[r]) if segment[j] == s]
    assert a[0, r, s] == s_old[r, cols].max().item()


def test_queries_without_positive_are_counted_at_every_fraction():
    _, old, new, y = _pair(n=60, seed=4)
    y = y.copy()
    y[0] = 99  # a class with one image: under same_set it has no positive
    out = backfill_curves(new, y, old, new, y, order=np.arange(60), same_set=True)
    assert out["n_no_positive"] == 1 and out["n_valid"] == 59
    assert out["recall@1"][-1] == retrieval_metrics(new, y, new, y, ks=(1,), same_set=True)["recall@1"]


def test_rounding_of_backfilled_counts():
    assert backfill_counts([0.0, 0.15, 0.5, 1.0], 20).tolist() == [0, 3, 10, 20]
    assert backfill_counts([0.29], 100).tolist() == [29]  # 0.29 * 100 = 28.999999999999996; flooring gives 28
    assert backfill_counts([0.1, 0.5, 0.9], 3).tolist() == [0, 2, 3]  # 0.3 -> 0, 1.5 -> 2 (halves up), 2.7 -> 3


def test_default_grid_has_21_points():
    q, ql, old, new, gl, order = _hand_case()
    fr, values = backfill_curve(q, ql, old, new, gl, order=order)
    assert np.allclose(fr, np.arange(21) / 20) and values.shape == (21,)


def test_area_of_a_constant_curve_is_the_constant():
    fr = np.linspace(0, 1, 21)
    assert curve_area(fr, np.full(21, 0.37)) == pytest.approx(0.37, abs=1e-12)
    assert curve_area([0.0, 0.1, 1.0], [0.5, 0.5, 0.5]) == pytest.approx(0.5, abs=1e-12)  # uneven grid


def test_fraction_to_reach_interpolates_linearly():
    fr, v = [0.0, 0.5, 1.0], [0.2, 0.6, 0.8]
    assert fraction_to_reach(fr, v, 0.4) == pytest.approx(0.25)
    assert fraction_to_reach(fr, v, 0.8) == 1.0
    assert fraction_to_reach(fr, v, 0.1) == 0.0  # already reached at the first point
    assert fraction_to_reach(fr, v, 0.9) is None
    # a non-monotone curve: the first crossing counts
    assert fraction_to_reach([0, 1 / 3, 2 / 3, 1], [0.2, 0.7, 0.5, 0.9], 0.6) == pytest.approx(0.4 / 0.5 / 3)


# ---------------------------------------------------------------------------------------------- orderings

def test_random_order_is_a_seeded_permutation():
    a = backfill_order("random", gallery_labels=np.zeros(50), seed=7)
    assert sorted(a.tolist()) == list(range(50))
    assert np.array_equal(a, backfill_order("random", old_gallery=np.ones((50, 3)), seed=7))
    assert not np.array_equal(a, backfill_order("random", gallery_labels=np.zeros(50), seed=8))


def test_distance_mse_order_by_hand():
    # class 0: 0, 1, 5 (mean 2 -> distances 2, 1, 3); class 1: 10, 12 (mean 11 -> distances 1, 1)
    x = np.array([[0.0], [10.0], [1.0], [12.0], [5.0]])
    y = np.array([0, 1, 0, 1, 0])
    far = backfill_order("distance_mse", old_gallery=x, gallery_labels=y)
    assert far.tolist() == [4, 0, 1, 2, 3]  # distance 3, 2, then the three 1s by row
    assert backfill_order("distance_mse_reverse", old_gallery=x, gallery_labels=y).tolist() == far[::-1].tolist()


def test_distance_cosine_order_by_hand():
    # class 0 mean [4/3, 1]: cosine distances a 0.2, b 0.4, c 1 - 5 / (sqrt(10) * 5/3) = 0.051;
    # the single class-1 item is its own mean: distance 0, so it goes last
    x = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0], [-1.0, 5.0]])
    y = np.array([0, 0, 0, 1])
    far = backfill_order("distance_cosine", old_gallery=x, gallery_labels=y)
    assert far.tolist() == [1, 0, 2, 3]
    assert backfill_order("distance_cosine_reverse", old_gallery=x, gallery_labels=y).tolist() == [3, 2, 0, 1]


def test_confidence_order_puts_least_confident_first():
    logits = np.array([[5.0, 0.0, 0.0], [1.0, 1.0, 1.0], [2.0, 0.0, 0.0]])  # max softmax 0.987, 1/3, 0.787
    assert backfill_order("confidence", new_logits=logits).tolist() == [1, 2, 0]


def test_unknown_ordering_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown backfilling order 'fastfill'.*distance_cosine_reverse"):
        backfill_order("fastfill", gallery_labels=np.zeros(3))
    assert set(ORDERINGS) == {"random", "distance_mse", "distance_cosine", "distance_mse_reverse",
                              "distance_cosine_reverse", "confidence", "adapter_residual"}


@pytest.mark.parametrize("name, kwargs, message", [
    ("distance_mse", {"gallery_labels": np.zeros(3)}, "needs old_gallery"),
    ("distance_cosine", {"old_gallery": np.ones((3, 2))}, "needs gallery_labels"),
    ("confidence", {"gallery_labels": np.zeros(3)}, "needs new_logits"),
    ("random", {}, "needs the gallery"),
    ("random", {"old_gallery": np.ones((3, 2)), "gallery_labels": np.zeros(4)}, "disagree on the gallery size"),
    ("distance_mse", {"old_gallery": np.array([[1.0], [np.nan]]), "gallery_labels": np.zeros(2)}, "NaN/inf"),
    ("confidence", {"new_logits": np.ones((3, 1))}, "at least 2 classes"),
])
def test_ordering_input_errors(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        backfill_order(name, **kwargs)


# ---------------------------------------------------------------------------------------------- bad inputs

def _call(**change):
    q, ql, old, new, gl, order = _hand_case()
    args = dict(query=q, query_labels=ql, old_gallery=old, new_gallery=new, gallery_labels=gl, order=order)
    args.update(change)
    return backfill_curves(args.pop("query"), args.pop("query_labels"), args.pop("old_gallery"), args.pop("new_gallery"),
                           args.pop("gallery_labels"), **args)


@pytest.mark.parametrize("change, message", [
    ({"new_gallery": np.ones((4, 2), np.float32)}, "old gallery has 3 rows but the new gallery has 4"),
    ({"new_gallery": np.ones((3, 5), np.float32)}, "old gallery features are 2-d but new gallery features are 5-d"),
    ({"order": [0, 1]}, "order has 2 entries but the gallery has 3"),
    ({"order": [0, 1, 3]}, "out-of-range indices \\(first: 3\\)"),
    ({"order": [-1, 1, 0]}, "out-of-range indices \\(first: -1\\)"),
    ({"order": [0, 1, 1]}, "order has duplicates.*first: 1"),
    ({"order": [0.0, 1.0, 2.0]}, "integer gallery row indices"),
    ({"query": np.array([[np.nan, 0.0]], np.float32)}, "query features has NaN/inf"),
    ({"old_gallery": np.array([[0, 1], [1, np.inf], [1, 0]], np.float32)}, "old gallery features has NaN/inf"),
    ({"new_gallery": np.array([[0, 1], [1, 0], [np.nan, 0]], np.float32)}, "new gallery features has NaN/inf"),
    ({"fractions": [0.0, 0.5, 1.2]}, "must lie in \\[0, 1\\]"),
    ({"fractions": [0.0, 0.5, 0.5, 1.0]}, "strictly increasing; 0.5 is followed by 0.5"),
    ({"metrics": ("recall@1", "ndcg")}, "unknown metric 'ndcg'"),
    ({"metrics": ("map@5", "map@10")}, "one mAP@k at a time"),
    ({"rank_ties": "random"}, "unknown rank-tie rule"),
    ({"gallery_labels": np.array([0, 1])}, "gallery labels has 2 labels for 3 feature rows"),
    ({"same_set": True}, "same_set=True needs one query per gallery item"),
])
def test_bad_inputs_raise_one_line_errors(change, message):
    with pytest.raises(ValueError, match=message):
        _call(**change)


def test_backfill_curve_rejects_a_metric_list():
    q, ql, old, new, gl, order = _hand_case()
    with pytest.raises(ValueError, match="one name"):
        backfill_curve(q, ql, old, new, gl, order=order, metric=("recall@1", "map"))


@pytest.mark.parametrize("fractions, values, message", [
    ([0.0, 0.5], [0.1, 0.2, 0.3], "one value per fraction"),
    ([0.1, 1.0], [0.1, 0.2], "averages over beta in \\[0, 1\\]"),
    ([0.0, 0.9], [0.1, 0.2], "averages over beta in \\[0, 1\\]"),
    ([0.0, 1.0, 0.5], [0.1, 0.2, 0.3], "strictly increasing"),
])
def test_curve_area_input_errors(fractions, values, message):
    with pytest.raises(ValueError, match=message):
        curve_area(fractions, values)
