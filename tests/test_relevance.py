"""Relevance as labels, qrels or none (engine.metrics.relevance) from the streaming top-k (engine.metrics.topk),
checked against hand-computed values, scikit-learn and plain numpy."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import ndcg_score

from engine.core.conventions import relevance_phrase
from engine.core.vocab import RELEVANCE
from engine.metrics.cell_interval import paired_intervals
from engine.metrics.relevance import label_outcomes, neighbour_recall, outcomes, qrels_outcomes, ranked_gains
from engine.metrics.topk import TopK, array_blocks, stream_topk


def exact_units(rng: np.random.Generator, n: int, d: int = 16) -> np.ndarray:
    """Unit rows with four entries of +/-0.5: every cosine is an exact multiple of 1/4, so ties are many and exact."""
    x = np.zeros((n, d), np.float32)
    for i in range(n):
        x[i, rng.choice(d, 4, replace=False)] = rng.choice([-0.5, 0.5], 4)
    return x


def numpy_topk(q: np.ndarray, g: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Full similarity matrix, stable argsort: ties go to the lower gallery position; ties left out at the cut."""
    sims = q @ g.T
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    scores = np.take_along_axis(sims, order, 1)
    beyond = (sims == scores[:, -1:]).sum(1) - (scores == scores[:, -1:]).sum(1)
    return order, scores, beyond


@pytest.mark.parametrize("backend", ["numpy", "torch", "faiss"])
@pytest.mark.parametrize("block, tile", [(1000, 1 << 20), (37, 50), (7, 1), (4, 3)])  # (4, 3): blocks smaller than k
def test_streaming_topk_equals_a_full_stable_argsort_ties_included(backend, block, tile):
    if backend == "faiss":
        pytest.importorskip("faiss")
    rng = np.random.default_rng(3)
    g, q = exact_units(rng, 300), exact_units(rng, 40)
    ids = rng.permutation(10_000)[:300]  # any distinct integers
    top = stream_topk(q, array_blocks(ids, g, block), k=6, backend=backend, max_tile=tile)
    order, scores, beyond = numpy_topk(q, g, 6)
    assert (beyond > 0).sum() > 10  # the case really has ties at the cut
    np.testing.assert_array_equal(top.ids, ids[order])
    np.testing.assert_array_equal(top.scores, scores)
    np.testing.assert_array_equal(top.tied_beyond, beyond)
    assert top.n_gallery == 300


def test_streaming_topk_keeps_the_stable_order_when_every_item_enters_the_list():
    """Gallery items in ascending similarity to the query (each one enters the running list at its head) and a list as
    long as the block: the compiled pass still gives the stable argsort, ties at the cut included."""
    q = np.array([[1.0, 0.0]], np.float32)
    angles = np.repeat(np.linspace(np.pi / 2, 0, 20), 3)  # 20 scores, each three times, ascending
    g = np.stack([np.cos(angles), np.sin(angles)], 1).astype(np.float32)
    for k in (1, 4, 59, 60, 80):
        top = stream_topk(q, array_blocks(np.arange(60), g, 64), k=k)
        order, scores, beyond = numpy_topk(q, g, min(k, 60))
        np.testing.assert_array_equal(top.ids, order)
        np.testing.assert_array_equal(top.scores, scores)
        np.testing.assert_array_equal(top.tied_beyond, beyond)


def test_streaming_topk_reads_float16_blocks_and_refuses_bad_blocks():
    rng = np.random.default_rng(0)
    g = exact_units(rng, 50).astype(np.float16)  # +/-0.5 is exact in float16
    q = exact_units(rng, 5)
    top = stream_topk(q, array_blocks(np.arange(50), g, 16), k=3)
    np.testing.assert_array_equal(top.ids, numpy_topk(q, g.astype(np.float32), 3)[0])
    with pytest.raises(ValueError, match="16-d"):
        stream_topk(q, [(np.arange(2), np.ones((2, 8), np.float32))], k=1)
    with pytest.raises(ValueError, match="NaN"):
        stream_topk(q, [(np.arange(2), np.full((2, 16), np.nan, np.float32))], k=1)
    with pytest.raises(ValueError, match="empty"):
        stream_topk(q, [], k=1)
    with pytest.raises(ValueError, match="backend"):
        stream_topk(q, [], k=1, backend="annoy")


def hand_list(ids, scores, beyond=None) -> TopK:
    ids, scores = np.atleast_2d(ids), np.atleast_2d(np.asarray(scores, np.float32))
    return TopK(np.asarray(ids, np.int64), scores, np.zeros(len(ids), np.int64) if beyond is None else np.asarray(beyond), 100)


def test_qrels_recall_ap_on_a_hand_computed_case():
    # ranked items 11 12 13 14 15; relevant: 12 and 15 in the list, 99 in the gallery but not retrieved (R = 3)
    top = hand_list([11, 12, 13, 14, 15], [0.9, 0.8, 0.7, 0.6, 0.5])
    qrels = {"q": {12: 1, 15: 1, 99: 1, 500: 1, 13: 0}}  # 500 is not in the gallery; 13 judged not relevant
    out = qrels_outcomes(top, ["q"], qrels, gallery_ids=np.arange(100), ks=(1, 2, 5))
    assert out.values["recall@1"][0] == 0 and out.values["recall@2"][0] == pytest.approx(1 / 3)
    assert out.values["recall@5"][0] == pytest.approx(2 / 3)
    # AP@k over R = 3: AP@5 = (1/2 + 2/5) / 3 = 0.3, AP@2 = (1/2) / 3; capped over min(R, k): AP@2 = (1/2) / 2
    assert out.values["map@5"][0] == pytest.approx((1 / 2 + 2 / 5) / 3)
    assert out.values["map@2"][0] == pytest.approx(1 / 6)
    assert out.values["map_capped@2"][0] == pytest.approx(0.25) and out.values["map_capped@5"][0] == pytest.approx(0.3)
    # P@k = hits / k, MRR@k = 1 / rank of the first relevant item (0 when none within k)
    assert [out.values[f"precision@{k}"][0] for k in (1, 2, 5)] == pytest.approx([0, 1 / 2, 2 / 5])
    assert [out.values[f"mrr@{k}"][0] for k in (1, 2, 5)] == pytest.approx([0, 1 / 2, 1 / 2])
    assert out.n_no_relevant == 0


def test_graded_ndcg_equals_sklearn():
    rng = np.random.default_rng(1)
    n_items, k = 40, 8
    rows = []
    for _ in range(6):
        scores = rng.permutation(n_items).astype(np.float32) / n_items  # no ties (sklearn averages ties)
        grades = rng.choice([0, 0, 0, 1, 2, 3], n_items)
        rows.append((scores, grades))
    order = [np.argsort(-s)[:k] for s, _ in rows]
    top = TopK(np.array(order), np.array([s[o] for (s, _), o in zip(rows, order)]), np.zeros(6, np.int64), n_items)
    qrels = {i: {int(j): int(g) for j, g in enumerate(grades) if g > 0} for i, (_, grades) in enumerate(rows)}
    out = qrels_outcomes(top, list(range(6)), qrels, gallery_ids=np.arange(n_items), ks=(3, k))
    for kk in (3, k):
        want = [ndcg_score([grades], [scores], k=kk) for scores, grades in rows]
        np.testing.assert_allclose(out.values[f"ndcg@{kk}"], want, rtol=1e-12)


def test_queries_without_a_relevant_item_are_counted_not_dropped():
    top = hand_list([[1, 2], [3, 4], [5, 6]], [[0.9, 0.1], [0.9, 0.1], [0.9, 0.1]])
    qrels = {"a": {2: 1}, "b": {77: 2}}  # b's only judgement is outside the gallery; c has none
    out = qrels_outcomes(top, ["a", "b", "c"], qrels, gallery_ids=np.arange(10), ks=(2,))
    assert out.n_queries == 3 and out.n_no_relevant == 2
    np.testing.assert_array_equal(out.no_relevant, [False, True, True])
    assert out.values["recall@2"][0] == 1 and np.isnan(out.values["recall@2"][1:]).all()
    assert out.means()["recall@2"] == 1
    assert "2 queries without a relevant item" in relevance_phrase("qrels", n_no_relevant=2)
    lab = label_outcomes(top, np.array([0, 1, 9]), np.arange(10), np.arange(10) % 3, ks=(1,))
    assert lab.n_no_relevant == 1 and np.isnan(lab.values["recall@1"][2])


def test_ties_rank_non_relevant_first_inside_the_list_and_at_the_cut():
    # two items tied at 0.5: the relevant one ranks second (pessimistic); the cut hides 2 more items tied at 0.2
    top = hand_list([1, 2, 3], [0.5, 0.5, 0.2], beyond=[2])
    np.testing.assert_array_equal(ranked_gains(top, np.array([[1.0, 0.0, 1.0]])), [[0.0, 1.0, 0.0]])
    labels = label_outcomes(top, np.array([7]), np.arange(1, 10), np.array([7, 0, 7, 0, 0, 0, 0, 0, 0]), ks=(1, 2))
    assert labels.values["recall@1"][0] == 0 and labels.values["recall@2"][0] == 1


def test_label_recall_matches_the_hit_rate_of_a_numpy_ranking():
    rng = np.random.default_rng(5)
    g, q = rng.normal(size=(400, 8)).astype(np.float32), rng.normal(size=(60, 8)).astype(np.float32)
    g_lab, q_lab = rng.integers(0, 12, 400), rng.integers(0, 14, 60)  # classes 12, 13 have no gallery item
    top = stream_topk(q, array_blocks(np.arange(400), g, 64), k=5)
    out = label_outcomes(top, q_lab, np.arange(400), g_lab, ks=(1, 5))
    gn, qn = g / np.linalg.norm(g, axis=1, keepdims=True), q / np.linalg.norm(q, axis=1, keepdims=True)
    order = np.argsort(-(qn @ gn.T), axis=1)
    for k in (1, 5):
        want = (g_lab[order[:, :k]] == q_lab[:, None]).any(1).astype(float)
        want[q_lab >= 12] = np.nan
        np.testing.assert_array_equal(out.values[f"recall@{k}"], want)
    assert out.n_no_relevant == int((q_lab >= 12).sum())


def test_label_free_neighbour_recall_equals_numpy_on_a_hand_made_case():
    # 2-d gallery on the unit circle at known angles; old/new models place the items differently
    angles_new = np.deg2rad([0, 10, 20, 90, 100, 180])
    angles_old = np.deg2rad([0, 30, 95, 85, 100, 180])
    new_g = np.c_[np.cos(angles_new), np.sin(angles_new)].astype(np.float32)
    old_g = np.c_[np.cos(angles_old), np.sin(angles_old)].astype(np.float32)
    ids = np.array([10, 11, 12, 13, 14, 15])
    q_new = np.array([[1, 0.05], [0, 1]], np.float32)  # near items 10/11/12 and 13/14 in the new space
    q_old = np.array([[1, 0.0], [0.05, 1]], np.float32)
    ref = stream_topk(q_new, array_blocks(ids, new_g, 4), k=3)
    np.testing.assert_array_equal(np.sort(ref.ids, 1), [[10, 11, 12], [12, 13, 14]])
    cells = {"new->old": stream_topk(q_new, array_blocks(ids, old_g, 4), k=3),
             "old->old": stream_topk(q_old, array_blocks(ids, old_g, 4), k=3)}
    for name, top in cells.items():
        q = q_new if name == "new->old" else q_old
        sims = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ old_g.T
        mine = ids[np.argsort(-sims, axis=1)[:, :3]]
        want = [len(set(a) & set(b)) / 3 for a, b in zip(mine, ref.ids)]
        np.testing.assert_allclose(neighbour_recall(top, ref, ks=(3,)).values["neighbour_recall@3"], want)
    # by hand: old space, query 0 (angle 0) -> 10, 11 (30), 13 (85): shares 10, 11 with the reference
    assert neighbour_recall(cells["old->old"], ref, ks=(3,)).values["neighbour_recall@3"][0] == pytest.approx(2 / 3)


def test_per_query_outcomes_feed_the_paired_interval():
    rng = np.random.default_rng(2)
    base = rng.integers(0, 2, 500).astype(float)
    better = np.where(rng.random(500) < 0.3, 1.0, base)
    (iv,) = paired_intervals(base, [better], seed=(0, 1, 0), resamples=300, confidence=0.95)
    assert iv.n == 500 and iv.lo > 0 and iv.diff == pytest.approx((better - base).mean())


def test_relevance_vocabulary_and_dispatch():
    assert RELEVANCE == ("labels", "qrels", "none")
    top = hand_list([1, 2], [0.9, 0.1])
    assert outcomes("none", top, reference=top, ks=(2,)).values["neighbour_recall@2"][0] == 1
    with pytest.raises(ValueError, match="relevance"):
        outcomes("clicks", top)
    with pytest.raises(ValueError, match=r"\[1, 2\]"):
        neighbour_recall(top, top, ks=(3,))
    for kind in RELEVANCE:
        assert relevance_phrase(kind, k=10)
    assert "top-10" in relevance_phrase("none", k=10)
