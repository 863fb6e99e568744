"""Roll-out backfill curves (adapter-residual order, rank merge, candidate re-scoring, summaries) and the one-pass AP path,
each checked against a brute-force numpy recomputation per grid point."""
import numpy as np
import pytest

from engine.metrics.backfill import backfill_counts, backfill_curves
from engine.metrics.backfill_orders import adapter_residual, backfill_order
from engine.metrics.backfill_rollout import (
    curve_summary,
    rank_merge_curves,
    rescoring_curves,
    rescoring_ks,
    rollout_curves,
)
from engine.metrics.retrieval import retrieval_metrics

FR = np.linspace(0.0, 1.0, 6)


def _unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _cos(q, g):
    return _unit(q) @ _unit(g).T


def _reference(keys, q_labels, g_labels, same_set):
    """Recall@1 (pessimistic ties) and mAP (scikit-learn ties) from per-(query, item) keys compared as tuples."""
    hits, aps = [], []
    for i, row in enumerate(keys):
        items = [j for j in range(len(g_labels)) if not (same_set and j == i)]
        pos = [j for j in items if g_labels[j] == q_labels[i]]
        if not pos:
            continue
        best = max(row[j] for j in pos)
        hits.append(not any(row[j] >= best for j in items if g_labels[j] != q_labels[i]))
        aps.append(np.mean([sum(row[k] >= row[p] for k in pos) / sum(row[k] >= row[p] for k in items) for p in pos]))
    return float(np.mean(hits)), float(np.mean(aps))


def _data(n=48, d=6, classes=4, seed=0, d_new=None):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, max(d, d_new or d)))
    y = rng.integers(0, classes, n)
    dn = d_new or d
    old_q = (centres[y, :d] + 1.2 * rng.normal(size=(n, d))).astype(np.float32)
    old_g = (centres[y, :d] + 1.2 * rng.normal(size=(n, d))).astype(np.float32)
    new_q = (centres[y, :dn] + 0.7 * rng.normal(size=(n, dn))).astype(np.float32)
    new_g = (centres[y, :dn] + 0.7 * rng.normal(size=(n, dn))).astype(np.float32)
    return old_q, new_q, y, old_g, new_g


def _cell(q, y, g, same_set=False):
    m = retrieval_metrics(q, y, g, y, ks=(1,), same_set=same_set)
    return m["recall@1"], m["map"]


# ---- the one-pass AP path ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank_ties", ["pessimistic", "optimistic"])
@pytest.mark.parametrize("same_set", [False, True])
def test_one_pass_curves_equal_recompute_with_ties(same_set, rank_ties):
    """Features drawn from a few distinct vectors, so similarities tie exactly; every metric, every fraction."""
    rng = np.random.default_rng(5)
    atoms = rng.normal(size=(7, 5)).astype(np.float32)
    n = 70
    y = rng.integers(0, 5, n)
    old, new = atoms[rng.integers(0, 7, n)], atoms[rng.integers(0, 7, n)]
    query = new if same_set else atoms[rng.integers(0, 7, n)]
    order = backfill_order("random", gallery_labels=y, seed=2)
    fr = np.linspace(0, 1, 11)
    metrics = ("recall@1", "recall@5", "map", "map@10")
    out = backfill_curves(query, y, old, new, y, order=order, fractions=fr, metrics=metrics, same_set=same_set, rank_ties=rank_ties)
    for i, k in enumerate(backfill_counts(fr, n)):
        mixed = old.copy()
        mixed[order[:k]] = new[order[:k]]
        ref = retrieval_metrics(query, y, mixed, y, ks=(1, 5), map_at=10, same_set=same_set, rank_ties=rank_ties)
        for m in metrics:
            assert out[m][i] == pytest.approx(ref[m], abs=1e-9), (m, i)


def test_one_pass_kernel_equals_the_per_fraction_kernel_on_raw_blocks():
    """all_fraction_stats (CPU) against mixed_stats (the path CUDA takes), field by field, on blocks with exact ties,
    -inf exclusions, an empty class and a fraction grid that stops before 1."""
    import torch

    from engine.metrics.backfill_kernels import all_fraction_stats, mixed_stats, segment_of_columns

    rng = np.random.default_rng(8)
    n, width = 25, 40
    s_old = rng.integers(-4, 5, (n, width)).astype(np.float32) / 4  # few distinct values: ties everywhere
    s_new = rng.integers(-4, 5, (n, width)).astype(np.float32) / 4
    s_old[np.arange(n), np.arange(n)] = s_new[np.arange(n), np.arange(n)] = -np.inf  # own items excluded
    starts = rng.integers(0, 30, n)
    ends = np.minimum(starts + rng.integers(0, 8, n), width)  # some rows without positives
    cols = rng.permutation(width)
    counts = backfill_counts(np.array([0.0, 0.1, 0.35, 0.6, 0.9]), width)
    fast = all_fraction_stats(torch.from_numpy(s_old), torch.from_numpy(s_new), starts, ends,
                              segment_of_columns(cols, counts), len(counts), map_k=5)
    slow = mixed_stats(torch.from_numpy(s_old.copy()), torch.from_numpy(s_new), starts, ends, cols, counts, map_k=5, want_ap=True)
    for a, b in zip(fast, slow):
        for field in ("n_positives", "neg_ge_best", "neg_gt_best", "ap", "ap_at_k"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


# ---- adapter-residual order -------------------------------------------------------------------------------------


def test_adapter_residual_hand_case_and_forms_of_the_map():
    old = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    new = np.array([[1.0, 0.0], [1.0, 0.0], [-1.0, -1.0]])  # residuals (unit): 0, sqrt(2), 2
    assert adapter_residual(new, old) == pytest.approx([0.0, np.sqrt(2), 2.0])
    assert backfill_order("adapter_residual", old_gallery=old, new_gallery=new).tolist() == [2, 1, 0]
    swap = lambda x: x[:, ::-1]  # noqa: E731  a map that swaps the axes
    assert adapter_residual(new, old, adapter=swap) == pytest.approx([np.sqrt(2), 0.0, 2.0])
    assert adapter_residual(new, old, adapter=new[:, ::-1].copy()) == pytest.approx([np.sqrt(2), 0.0, 2.0])
    assert backfill_order("adapter_residual", old_gallery=old, new_gallery=new, adapter=swap).tolist() == [2, 0, 1]
    assert adapter_residual(2 * new, old, normalize=False) == pytest.approx([1.0, np.sqrt(5), np.sqrt(18)])


def test_adapter_residual_matches_numpy_with_a_dimension_changing_map():
    rng = np.random.default_rng(1)
    old, new = rng.normal(size=(30, 4)), rng.normal(size=(30, 6))
    w = rng.normal(size=(6, 4))
    ref = np.linalg.norm(_unit(new @ w) - _unit(old), axis=1)
    assert adapter_residual(new, old, adapter=lambda x: x @ w) == pytest.approx(ref, rel=1e-5)
    order = backfill_order("adapter_residual", old_gallery=old, new_gallery=new, adapter=lambda x: x @ w)
    assert np.all(np.diff(ref[order]) <= 1e-6)  # largest residual first


@pytest.mark.parametrize("kwargs, message", [
    ({"adapter": None}, "without an adapter"),
    ({"adapter": np.ones((5, 4))}, "adapted new gallery has shape"),
    ({"adapter": lambda x: x[:, :3]}, "the adapter returned shape"),
    ({"adapter": "procrustes"}, "adapter must be a callable"),
])
def test_adapter_residual_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        adapter_residual(np.ones((4, 6)), np.ones((4, 4)), **kwargs)


# ---- rank merge --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("same_set", [False, True])
def test_rank_merge_by_score_equals_brute_force_and_its_endpoints(same_set):
    old_q, new_q, y, old_g, new_g = _data(d_new=5)
    a_q = new_q[:, :4] @ np.ones((4, 6)) * 0.3 + old_q  # some old-space query
    if same_set:
        a_q, new_q = old_g + 0.1 * a_q, new_g  # queries are the gallery images
    order = backfill_order("random", gallery_labels=y, seed=4)
    out = rank_merge_curves(a_q, new_q, y, old_g, new_g, y, order=order, fractions=FR, same_set=same_set)
    s_old, s_new = _cos(a_q, old_g), _cos(new_q, new_g)
    for i, k in enumerate(backfill_counts(FR, len(y))):
        moved = np.isin(np.arange(len(y)), order[:k])
        keys = np.where(moved[None, :], s_new, s_old)
        assert (out["recall@1"][i], out["map"][i]) == pytest.approx(_reference(keys, y, y, same_set), abs=1e-12)
    assert (out["recall@1"][0], out["map"][0]) == _cell(a_q, y, old_g, same_set)
    assert (out["recall@1"][-1], out["map"][-1]) == _cell(new_q, y, new_g, same_set)


@pytest.mark.parametrize("engine", ["auto", "torch"])  # compiled on CPU; torch is the CUDA path
def test_rank_merge_by_rank_equals_brute_force(engine):
    old_q, new_q, y, old_g, new_g = _data(seed=2, d_new=5)
    order = backfill_order("distance_mse", old_gallery=old_g, gallery_labels=y)
    out = rank_merge_curves(old_q, new_q, y, old_g, new_g, y, order=order, fractions=FR, merge="rank", engine=engine)
    s_old, s_new = _cos(old_q, old_g), _cos(new_q, new_g)
    for i, k in enumerate(backfill_counts(FR, len(y))):
        moved = np.isin(np.arange(len(y)), order[:k])
        keys = np.empty_like(s_old)
        for q in range(len(y)):
            for j in range(len(y)):
                own = s_new[q] if moved[j] else s_old[q]
                r = int(np.sum(own[moved == moved[j]] > own[j]))  # items of its own index scoring higher
                keys[q, j] = -(2 * r if moved[j] else 2 * r + 1)
        assert (out["recall@1"][i], out["map"][i]) == pytest.approx(_reference(keys, y, y, False), abs=1e-12)
    assert (out["recall@1"][0], out["map"][0]) == pytest.approx(_cell(old_q, y, old_g), abs=1e-12)
    assert (out["recall@1"][-1], out["map"][-1]) == pytest.approx(_cell(new_q, y, new_g), abs=1e-12)


def test_rank_merge_of_identical_spaces_is_plain_search():
    _, q, y, _, g = _data(seed=3)
    order = backfill_order("random", gallery_labels=y, seed=0)
    out = rank_merge_curves(q, q.copy(), y, g, g.copy(), y, order=order, fractions=FR)
    plain = _cell(q, y, g)
    assert np.all(out["recall@1"] == plain[0]) and np.all(out["map"] == plain[1])


# ---- candidate re-scoring ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["auto", "torch"])
@pytest.mark.parametrize("same_set", [False, True])
def test_rescoring_equals_brute_force_and_its_endpoints(same_set, engine):
    old_q, new_q, y, old_g, new_g = _data(seed=6, d_new=4)
    if same_set:
        old_q, new_q = old_g, new_g
    n = len(y)
    ks = np.array([0, 1, 3, 10, 25, n])
    out = rescoring_curves(old_q, new_q, y, old_g, new_g, y, ks=ks, same_set=same_set, engine=engine)
    s_old, s_new = _cos(old_q, old_g), _cos(new_q, new_g)
    for i, k in enumerate(ks):
        keys = np.empty((n, n), dtype=object)
        for q in range(n):
            cand = [j for j in np.lexsort((np.arange(n), -s_old[q])) if not (same_set and j == q)][:k]
            for j in range(n):
                keys[q, j] = (1, s_new[q, j]) if j in cand else (0, s_old[q, j])  # candidates first, by new score
        assert (out["recall@1"][i], out["map"][i]) == pytest.approx(_reference(keys, y, y, same_set), abs=1e-12)
    assert out["fractions"].tolist() == (ks / n).tolist()
    assert (out["recall@1"][0], out["map"][0]) == _cell(old_q, y, old_g, same_set)
    assert (out["recall@1"][-1], out["map"][-1]) == pytest.approx(_cell(new_q, y, new_g, same_set), abs=1e-12)


@pytest.mark.parametrize("engine", ["auto", "torch"])
def test_rescoring_breaks_ties_at_the_kth_place_by_lower_row(engine):
    # one query of class 0; old scores: rows 0 and 1 tie (negative 0, positive 1); new scores put the positive first
    q_old, q_new = np.array([[1.0, 0.0]]), np.array([[1.0, 0.0]])
    old_g = np.array([[1.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    new_g = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.2]])
    labels, gl = np.array([0]), np.array([1, 0, 2])
    out = rescoring_curves(q_old, q_new, labels, old_g, new_g, gl, ks=[0, 1, 2, 3], engine=engine)
    # K=0: the tie counts against (pessimistic); K=1: only row 0 (a negative) is a candidate, ranked first;
    # K=2: rows 0, 1 re-ranked, the positive (new 1.0) first; K=3: new order positive 1.0, row 2 0.98, row 0 0
    assert out["recall@1"].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert out["map"] == pytest.approx([0.5, 0.5, 1.0, 1.0])


@pytest.mark.parametrize("rank_ties", ["pessimistic", "optimistic"])
@pytest.mark.parametrize("same_set", [False, True])
def test_compiled_and_torch_paths_agree_on_every_metric_with_ties(same_set, rank_ties):
    """Features drawn from a few vectors (exact ties, also at the K-th place); the compiled walk against the torch
    keys read by the ranking kernel, for Recall@1/5 (both tie rules), mAP and mAP@10."""
    rng = np.random.default_rng(11)
    atoms = rng.normal(size=(6, 4)).astype(np.float32)
    n = 60
    y = rng.integers(0, 4, n)
    old_g, new_g = atoms[rng.integers(0, 6, n)], atoms[rng.integers(0, 6, n)]
    old_q, new_q = (old_g, new_g) if same_set else (atoms[rng.integers(0, 6, n)], atoms[rng.integers(0, 6, n)])
    metrics = ("recall@1", "recall@5", "map", "map@10")
    order = backfill_order("random", gallery_labels=y, seed=1)
    kw = {"metrics": metrics, "same_set": same_set, "rank_ties": rank_ties}
    for run in (lambda e: rank_merge_curves(old_q, new_q, y, old_g, new_g, y, order=order, fractions=FR, merge="rank", engine=e, **kw),
                lambda e: rescoring_curves(old_q, new_q, y, old_g, new_g, y, ks=[0, 1, 2, 7, 30, 59, 60], engine=e, **kw)):
        fast, slow = run("auto"), run("torch")
        for m in metrics:
            np.testing.assert_array_equal(fast[m], slow[m], err_msg=m)


def test_rescoring_grid_and_errors():
    assert rescoring_ks(10, [0, 0.01, 0.5, 1]).tolist() == [0, 5, 10]  # 0.01 * 10 rounds to 0: dropped
    _, q, y, _, g = _data(n=12)
    with pytest.raises(ValueError, match="increase strictly"):
        rescoring_curves(q, q, y, g, g, y, ks=[0, 5, 5])
    with pytest.raises(ValueError, match="increase strictly"):
        rescoring_curves(q, q, y, g, g, y, ks=[0, 13])
    with pytest.raises(ValueError, match="unknown merge rule"):
        rank_merge_curves(q, q, y, g, g, y, order=np.arange(12), merge="interleave")
    with pytest.raises(ValueError, match="unknown engine"):
        rescoring_curves(q, q, y, g, g, y, engine="cuda")
    with pytest.raises(ValueError, match="same queries"):
        rank_merge_curves(q, q[:5], y, g, g, y, order=np.arange(12))


# ---- summaries and the report -------------------------------------------------------------------------------------


def test_curve_summary_hand_case():
    fr = np.array([0.0, 0.5, 1.0])
    s = curve_summary(fr, np.array([0.2, 0.6, 0.8]), old_self=0.4, new_self=0.9)
    assert s["area"] == pytest.approx(0.55)  # (0.2 + 0.6) / 4 + (0.6 + 0.8) / 4
    assert s["reach_old"] == pytest.approx(0.25) and s["reach_new"] is None
    assert curve_summary(np.array([0.0, 0.5]), np.array([0.3, 0.4]), old_self=0.1, new_self=0.4)["area"] is None


def test_rollout_curves_with_a_rotation_adapter():
    """The new space is a rotation of the old one: the adapter (its inverse) makes every roll-out curve flat at the
    old self-test, while without the map the cross-test is poor and the curves climb to the new self-test."""
    rng = np.random.default_rng(9)
    old_q, _, y, old_g, _ = _data(n=40, seed=9)
    rot = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    new_q, new_g = (old_q @ rot).astype(np.float32), (old_g @ rot).astype(np.float32)
    out = rollout_curves(old_q, new_q, y, old_g, new_g, y, adapter=lambda x: x @ rot.T, fractions=FR)
    old_self = _cell(old_q, y, old_g)
    assert out["self_test"]["old"]["map"] == pytest.approx(out["self_test"]["new"]["map"], abs=1e-6)
    for kind in ("replacement", "rank_merge"):
        for name in ("random", "adapter_residual"):
            assert out[kind][name]["curves"]["map"] == pytest.approx([old_self[1]] * len(FR), abs=1e-6)
            for m in ("recall@1", "map"):
                assert out[kind][name]["summary"][m] == curve_summary(
                    FR, np.array(out[kind][name]["curves"][m]), old_self=out["self_test"]["old"][m], new_self=out["self_test"]["new"][m])
    assert out["rescoring"]["curves"]["recall@1"] == pytest.approx([old_self[0]] * len(out["rescoring"]["ks"]), abs=1e-6)
    p = rot[:, :4]  # the new model keeps 4 of the 6 directions; the map back is P^T
    plain = rollout_curves(old_q, old_q @ p, y, old_g, old_g @ p, y, adapted_query=old_q @ p @ p.T,
                           adapted_gallery=old_g @ p @ p.T, fractions=FR, orders=("random",))
    curve = np.array(plain["replacement"]["random"]["curves"]["map"])
    assert plain["replacement"]["random"]["summary"]["map"]["area"] == pytest.approx(np.trapezoid(curve, FR))
    with pytest.raises(ValueError, match="not both"):
        rollout_curves(old_q, new_q, y, old_g, new_g, y, adapter=lambda x: x, adapted_query=new_q, adapted_gallery=new_g)
