"""Retrieval metrics on cells small enough to check on paper, plus independent cross-checks."""
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from engine.metrics.retrieval import retrieval_metrics
from engine.metrics.ranking import stats_numba, stats_torch


def _hand_cell():
    # cosine to q=[1,0]: g0 0.995 (neg), g1 0.894 (pos), g2 0 (pos), g3 -1 (neg)
    q = np.array([[1.0, 0.0]], np.float32)
    g = np.array([[1.0, 0.1], [1.0, 0.5], [0.0, 1.0], [-1.0, 0.0]], np.float32)
    return q, np.array([0]), g, np.array([1, 0, 0, 1])


def test_hand_computed_ranking():
    q, ql, g, gl = _hand_cell()
    m = retrieval_metrics(q, ql, g, gl, ks=(1, 2, 3), map_at=2)
    assert m["recall@1"] == 0.0 and m["recall@2"] == 1.0 and m["recall@3"] == 1.0
    assert m["map"] == pytest.approx((1 / 2 + 2 / 3) / 2)  # positives at ranks 2 and 3
    assert m["map@2"] == pytest.approx((1 / 2) / 2)  # only the rank-2 positive is within k, / P (= 2 = min(P, k) here)
    assert (m["n_queries"], m["n_valid"], m["n_no_positive"]) == (1, 1, 0)


def test_features_are_compared_by_cosine_not_by_norm():
    q, ql, g, gl = _hand_cell()
    scaled = g * np.array([[100.0], [0.01], [3.0], [7.0]], np.float32)
    assert retrieval_metrics(q * 5, ql, scaled, gl, ks=(1, 2)) == retrieval_metrics(q, ql, g, gl, ks=(1, 2))


def test_tie_between_positive_and_negative():
    q = np.array([[1.0, 0.0]], np.float32)
    g = np.array([[0.0, 1.0], [0.0, -1.0]], np.float32)  # both at cosine 0
    gl = np.array([0, 1])
    assert retrieval_metrics(q, [0], g, gl, ks=(1,))["recall@1"] == 0.0
    assert retrieval_metrics(q, [0], g, gl, ks=(1,), rank_ties="optimistic")["recall@1"] == 1.0
    # mAP puts tied items at one threshold (as scikit-learn): precision 1/2
    assert retrieval_metrics(q, [0], g, gl)["map"] == pytest.approx(0.5)
    assert average_precision_score([1, 0], [0.0, 0.0]) == pytest.approx(0.5)


def test_tied_positives_do_not_hurt_recall():
    q = np.array([[1.0, 0.0]], np.float32)
    g = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], np.float32)
    m = retrieval_metrics(q, [3], g, [3, 3, 5], ks=(1,))
    assert m["recall@1"] == 1.0 and m["map"] == pytest.approx(1.0)


def test_same_set_excludes_own_image_by_index():
    # x0 and x1 are identical vectors of different classes: exclusion must use the index, not the values
    x = np.array([[1.0, 0.0], [1.0, 0.0], [0.6, 0.8], [0.0, 1.0]], np.float32)
    y = np.array([0, 1, 0, 2])
    m = retrieval_metrics(x, y, x, y, ks=(1,), same_set=True)
    # q0: x1 (neg, cos 1) first, x2 (pos, 0.6) second -> miss, AP 1/2
    # q1: class 1 has no other image -> no positive
    # q2: x0 and x1 tie at 0.6 (pos and neg), x3 at 0.8 (neg) first -> miss, AP = 1/3 (1 pos among 3 items >= 0.6)
    # q3: class 2 has no other image -> no positive
    assert m["n_no_positive"] == 2 and m["n_valid"] == 2
    assert m["recall@1"] == 0.0
    assert m["map"] == pytest.approx((1 / 2 + 1 / 3) / 2)


def test_same_set_without_exclusion_would_find_itself():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.1, 1.0]], np.float32)
    y = np.array([0, 1, 0])
    assert retrieval_metrics(x, y, x, y, ks=(1,), same_set=False)["recall@1"] == 1.0
    m = retrieval_metrics(x, y, x, y, ks=(1,), same_set=True)
    # q0: x2 (pos, cos 0.0995) beats x1 (cos 0) -> hit; q1: no other class-1 image; q2: x1 (neg, 0.995) -> miss
    assert (m["recall@1"], m["n_no_positive"]) == (0.5, 1)


def test_template_gallery_uses_class_means():
    # class 0 images at 0 and 90 degrees -> template at 45 degrees; class 1 single image at 20 degrees
    g = np.array([[1.0, 0.0], [0.0, 1.0], [math.cos(0.35), math.sin(0.35)]], np.float32)
    gl = np.array([0, 0, 1])
    q = np.array([[math.cos(0.7), math.sin(0.7)]], np.float32)  # 40 degrees: 5 from template 0, 20 from class 1
    assert retrieval_metrics(q, [0], g, gl, ks=(1,), gallery_kind="template")["recall@1"] == 1.0
    # as instances, the class-1 image (20 deg away) beats both class-0 images (40 and 50 deg away)
    assert retrieval_metrics(q, [0], g, gl, ks=(1,), gallery_kind="instance")["recall@1"] == 0.0


def test_template_same_set_leaves_own_image_out():
    # q0 = x0 at 0 deg (class 0); other class-0 image at 80 deg; class-1 image at 30 deg
    ang = np.array([0.0, 80.0, 30.0]) * np.pi / 180
    x = np.stack([np.cos(ang), np.sin(ang)], 1).astype(np.float32)
    y = np.array([0, 0, 1])
    m = retrieval_metrics(x, y, x, y, ks=(1,), gallery_kind="template", same_set=True)
    # q0: its leave-one-out template is x1 (80 deg) vs class-1 template (30 deg) -> miss
    # q1: leave-one-out template is x0 (80 deg away) vs class 1 (50 deg away) -> miss
    # q2: class 1 without its own image is empty -> no positive
    assert m["n_no_positive"] == 1 and m["recall@1"] == 0.0
    # without same_set the full class-0 template (40 deg) beats class 1 for q0 (30 deg)? 40 > 30 -> miss; q1: 40 vs 50 -> hit
    m2 = retrieval_metrics(x, y, x, y, ks=(1,), gallery_kind="template")
    assert m2["recall@1"] == pytest.approx(2 / 3)  # q0 miss, q1 hit, q2 hit (its own template)


def test_queries_without_positive_are_counted_not_dropped_silently():
    g = np.eye(3, dtype=np.float32)
    m = retrieval_metrics(np.eye(3, dtype=np.float32), [0, 1, 7], g, [0, 1, 2], ks=(1,))
    assert m["n_no_positive"] == 1 and m["n_valid"] == 2 and m["recall@1"] == 1.0


def test_no_valid_query_gives_nan_not_zero():
    m = retrieval_metrics(np.eye(2, dtype=np.float32), [5, 6], np.eye(2, dtype=np.float32), [0, 1], ks=(1,))
    assert math.isnan(m["recall@1"]) and math.isnan(m["map"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_cells_match_independent_implementations(seed):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(120, 8)).astype(np.float32)
    g = rng.normal(size=(150, 8)).astype(np.float32)
    ql, gl = rng.integers(0, 6, 120), rng.integers(0, 6, 150)
    m = retrieval_metrics(q, ql, g, gl, ks=(1, 5))
    sims = torch.nn.functional.cosine_similarity(torch.tensor(q)[:, None], torch.tensor(g)[None], dim=2).numpy()
    assert m["map"] == pytest.approx(np.mean([average_precision_score(gl == ql[i], sims[i]) for i in range(120)]), abs=1e-6)
    order = np.argsort(-sims, axis=1)
    assert m["recall@1"] == pytest.approx(np.mean(gl[order[:, 0]] == ql))
    assert m["recall@5"] == pytest.approx(np.mean([(gl[order[i, :5]] == ql[i]).any() for i in range(120)]))


def test_numba_and_torch_statistics_agree_with_ties_and_exclusions():
    rng = np.random.default_rng(3)
    sims = rng.integers(-3, 4, size=(40, 30)).astype(np.float32) / 3  # many ties
    sims[rng.random(sims.shape) < 0.1] = -np.inf  # excluded items
    starts = rng.integers(0, 20, 40)
    ends = starts + rng.integers(0, 10, 40)
    a = stats_numba(sims, starts, ends, map_k=4)
    b = stats_torch(torch.tensor(sims), torch.tensor(starts), torch.tensor(ends), map_k=4)
    for f in ("n_positives", "neg_ge_best", "neg_gt_best"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    np.testing.assert_allclose(a.ap, b.ap, equal_nan=True)
    np.testing.assert_allclose(a.ap_at_k, b.ap_at_k, equal_nan=True)
    for r in range(40):  # and the AP of every row against scikit-learn
        cols = np.arange(30)
        keep = sims[r] != -np.inf
        pos = (cols >= starts[r]) & (cols < ends[r])
        if (pos & keep).any():
            assert a.ap[r] == pytest.approx(average_precision_score(pos[keep], sims[r][keep]))


@pytest.mark.parametrize("row, n_pos", [
    ([0.0, 1e-40, 0.0, 5e-41, -1.0, 1e-40], 2),  # positives a subnormal apart (bucket scale overflows)
    ([0.5, 0.5, 0.5, 0.7, 0.2, 0.5], 2),  # all positives equal, negatives tied with them
    ([0.9, 0.1, 0.5, 0.3, 0.1, 0.9, 0.0, 0.5], 3),  # negatives on positives' values, inside the range
])
def test_ranking_kernel_edge_values_match_scikit_learn(row, n_pos):
    sims = np.array([row], np.float32)
    stats = stats_numba(sims, np.array([0]), np.array([n_pos]), map_k=2)
    labels = np.arange(len(row)) < n_pos
    assert stats.ap[0] == pytest.approx(average_precision_score(labels, sims[0]))
    best = sims[0, :n_pos].max()
    assert stats.neg_ge_best[0] == (sims[0, n_pos:] >= best).sum() and stats.neg_gt_best[0] == (sims[0, n_pos:] > best).sum()


def test_counting_kernel_without_ap_matches_brute_force_with_ties_and_exclusions():
    rng = np.random.default_rng(4)
    sims = rng.integers(-3, 4, size=(60, 25)).astype(np.float32) / 3  # many ties with the best positive
    sims[rng.random(sims.shape) < 0.15] = -np.inf
    starts = rng.integers(0, 18, 60)
    ends = starts + rng.integers(0, 8, 60)
    fast = stats_numba(sims, starts, ends, want_ap=False)
    on_torch = stats_torch(torch.tensor(sims), torch.tensor(starts), torch.tensor(ends), want_ap=False)
    for r in range(60):  # a plain loop over the row
        cols = np.arange(25)
        keep = sims[r] != -np.inf
        pos = keep & (cols >= starts[r]) & (cols < ends[r])
        neg = keep & ~((cols >= starts[r]) & (cols < ends[r]))
        best = sims[r][pos].max() if pos.any() else None
        assert fast.n_positives[r] == pos.sum()
        assert fast.neg_ge_best[r] == (0 if best is None else (sims[r][neg] >= best).sum())
        assert fast.neg_gt_best[r] == (0 if best is None else (sims[r][neg] > best).sum())
    for f in ("n_positives", "neg_ge_best", "neg_gt_best"):
        np.testing.assert_array_equal(getattr(fast, f), getattr(on_torch, f))
    assert np.isnan(fast.ap).all() and np.isnan(on_torch.ap).all()


def test_auto_backend_is_numpy_unless_a_loaded_torch_sees_a_gpu(monkeypatch):
    import torch

    from engine.metrics import search

    monkeypatch.setattr(search, "_faiss_gpus", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for need_ranking in (False, True):
        assert isinstance(search.pick_backend(None, need_ranking=need_ranking), search.NumpyBackend)
    assert isinstance(search.pick_backend("torch", need_ranking=True), search.TorchBackend)
    assert search.pick_backend("faiss", need_ranking=False).name == "faiss"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # torch is loaded here: it would search on its GPU
    picked = search.pick_backend("auto", need_ranking=True)
    assert isinstance(picked, search.TorchBackend) and picked.device.type == "cuda"


def _four_signs(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """Rows with four entries +-1, the rest 0: norm 2 exactly, so unit rows and their dot products are exact in float32
    whatever order a library sums in (many exact ties)."""
    x = np.zeros((n, d), np.float32)
    for row in x:
        row[rng.choice(d, 4, replace=False)] = rng.choice([-1.0, 1.0], 4)
    return x


@pytest.mark.parametrize("same_set", [False, True])
def test_numpy_and_torch_backends_give_the_same_statistics(same_set):
    """Exact similarities: the two backends' statistics agree exactly, ties included; on random features, where the two
    BLAS libraries' summation orders differ by float32 ulps, every metric agrees to 1e-12 (no score pair that close)."""
    from engine.metrics.retrieval import cell_stats

    rng = np.random.default_rng(11)
    g, gl = _four_signs(rng, 120, 8), rng.integers(0, 6, 120)
    q, ql = (g, gl) if same_set else (_four_signs(rng, 90, 8), rng.integers(0, 7, 90))
    kw = dict(same_set=same_set, map_k=5)
    on_numpy, on_torch = cell_stats(q, ql, g, gl, backend="numpy", **kw), cell_stats(q, ql, g, gl, backend="torch", **kw)
    for f in ("n_positives", "neg_ge_best", "neg_gt_best", "ap", "ap_at_k"):
        np.testing.assert_array_equal(getattr(on_numpy, f), getattr(on_torch, f))
    qr, gr = rng.normal(size=(200, 32)).astype(np.float32), rng.normal(size=(300, 32)).astype(np.float32)
    qrl, grl = rng.integers(0, 9, 200), rng.integers(0, 9, 300)
    for kind in ("instance", "template"):
        mk = dict(ks=(1, 5), map_at=10, gallery_kind=kind)
        a, b = retrieval_metrics(qr, qrl, gr, grl, backend="numpy", **mk), retrieval_metrics(qr, qrl, gr, grl, backend="torch", **mk)
        assert a.keys() == b.keys() and all(a[key] == pytest.approx(b[key], abs=1e-12) for key in a)


@pytest.mark.parametrize("gallery_kind", ["instance", "template"])
@pytest.mark.parametrize("same_set", [False, True])
def test_faiss_and_exact_backends_give_identical_results(gallery_kind, same_set):
    rng = np.random.default_rng(5)
    g = rng.normal(size=(300, 12)).astype(np.float32)
    gl = rng.integers(0, 8, 300)
    q, ql = (g, gl) if same_set else (rng.normal(size=(200, 12)).astype(np.float32), rng.integers(0, 9, 200))
    kw = dict(ks=(1, 3, 10), gallery_kind=gallery_kind, same_set=same_set, compute_map=False)
    faiss = retrieval_metrics(q, ql, g, gl, backend="faiss", **kw)
    assert faiss == retrieval_metrics(q, ql, g, gl, backend="numpy", **kw)
    assert faiss == retrieval_metrics(q, ql, g, gl, backend="torch", **kw)


def test_faiss_backend_resolves_boundary_ties_exactly():
    # every gallery item ties with the positive: the top-1 list cannot tell, the fallback must
    q = np.array([[1.0, 0.0]], np.float32)
    g = np.array([[0.0, 1.0]] * 5 + [[0.0, -1.0]], np.float32)
    gl = np.array([1, 1, 1, 1, 1, 0])
    for rank_ties in ("pessimistic", "optimistic"):
        kw = dict(ks=(1, 5, 6), compute_map=False, rank_ties=rank_ties)
        assert retrieval_metrics(q, [0], g, gl, backend="faiss", **kw) == retrieval_metrics(q, [0], g, gl, backend="torch", **kw)


def test_chunking_does_not_change_results():
    from engine.metrics.retrieval import cell_stats

    rng = np.random.default_rng(7)
    q, g = rng.normal(size=(50, 4)).astype(np.float32), rng.normal(size=(60, 4)).astype(np.float32)
    ql, gl = rng.integers(0, 3, 50), rng.integers(0, 3, 60)
    whole = cell_stats(q, ql, g, gl, backend="torch")
    tiny = cell_stats(q, ql, g, gl, backend="torch", max_block=60 * 7)
    np.testing.assert_array_equal(whole.ap, tiny.ap)
    np.testing.assert_array_equal(whole.neg_ge_best, tiny.neg_ge_best)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(query=np.ones((2, 3)), gallery=np.ones((2, 4))), "3-d but gallery features are 4-d"),
        (dict(query=np.array([[np.nan, 1.0]])), "NaN/inf"),
        (dict(query=np.ones(3)), "2-D"),
        (dict(query_labels=np.array([0, 1, 2])), "3 labels for 2 feature rows"),
        (dict(same_set=True, gallery=np.ones((3, 2)), gallery_labels=np.array([0, 1, 1])), "one query per gallery item"),
        (dict(gallery_kind="nearest"), "unknown gallery kind"),
        (dict(ks=(0,)), "k must be >= 1"),
    ],
)
def test_bad_inputs_get_clear_messages(kwargs, message):
    args = dict(query=np.eye(2), query_labels=np.array([0, 1]), gallery=np.eye(2), gallery_labels=np.array([0, 1]))
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        retrieval_metrics(args.pop("query"), args.pop("query_labels"), args.pop("gallery"), args.pop("gallery_labels"), **args)
