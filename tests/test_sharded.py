"""Sharded exact search equals the single-shot statistics; memory is bounded by the shard; bad shards are refused.

The cells use features whose cosine similarities are exact in float32 (entries +-1 and +-3, 24 of them +-3, in
64-d: every row has norm 16, so unit rows hold multiples of 1/16 and products are multiples of 1/256 summed
without rounding). Both routes then see the same floats, in any BLAS blocking, with many exact ties.
"""
import numpy as np
import pytest

import engine.metrics.sharded as sharded
from engine.metrics.retrieval import cell_stats, retrieval_metrics
from engine.metrics.sharded import Shard, sharded_cell_stats, sharded_retrieval_metrics
from support.sharded import _cell

FIELDS = ("n_positives", "neg_ge_best", "neg_gt_best", "ap", "ap_at_k")






def _split(g, gl, cuts, ids=None):
    ids = np.arange(len(g)) if ids is None else ids
    return [Shard(g[a:b], gl[a:b], ids[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


UNEVEN = [0, 1, 1, 50, 177, 300]  # shards of 1 item, 0 items, then 49, 127 and 123 items


def _assert_same(a, b):
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)


@pytest.mark.parametrize("kw", [dict(map_k=5), dict(want_ap=False), dict(map_k=1000)])
def test_identical_statistics_on_uneven_shards_with_ties(kw):
    q, ql, g, gl = _cell()
    single = cell_stats(q, ql, g, gl, **kw)
    _assert_same(single, sharded_cell_stats(q, ql, _split(g, gl, UNEVEN), max_block=1000, **kw))
    valid = single.n_positives > 0
    assert (single.neg_ge_best > single.neg_gt_best).any()  # negatives tied with the best positive
    assert (~valid).sum() > 0  # queries without positives are counted, not dropped


def test_identical_metrics_both_tie_rules():
    q, ql, g, gl = _cell(seed=1)
    shards = _split(g, gl, UNEVEN)
    for rank_ties in ("pessimistic", "optimistic"):
        kw = dict(ks=(1, 3, 10), map_at=5, rank_ties=rank_ties)
        one = retrieval_metrics(q, ql, g, gl, **kw)
        assert sharded_retrieval_metrics(q, ql, shards, max_block=500, **kw) == one
        assert one["n_no_positive"] > 0
    assert (retrieval_metrics(q, ql, g, gl, ks=(1,))["recall@1"]
            < retrieval_metrics(q, ql, g, gl, ks=(1,), rank_ties="optimistic")["recall@1"])  # the ties matter


def test_hand_computed_cell_over_shards():
    # cosine to q=[1,0]: g0 0.995 (neg), g1 0.894 (pos), g2 0 (pos), g3 -1 (neg): positives at ranks 2 and 3
    g = np.array([[1.0, 0.1], [1.0, 0.5], [0.0, 1.0], [-1.0, 0.0]], np.float32)
    gl = np.array([1, 0, 0, 1])
    m = sharded_retrieval_metrics(np.array([[1.0, 0.0]], np.float32), [0], _split(g, gl, [0, 1, 1, 4]), ks=(1, 2), map_at=2)
    assert (m["recall@1"], m["recall@2"]) == (0.0, 1.0)
    assert m["map"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert m["map@2"] == pytest.approx((1 / 2) / 2)


def test_same_set_exclusion_by_id_with_shards_out_of_order():
    _, _, g, gl = _cell(seed=5, n=200)
    gl[7] = 99  # a class with one image: no positive once the query's own image is excluded
    shards = _split(g, gl, [0, 1, 60, 60, 133, 200])[::-1]  # ids keep their gallery rows, shards arrive reversed
    for kw in (dict(map_k=4), dict(want_ap=False)):
        single = cell_stats(g, gl, g, gl, same_set=True, **kw)
        _assert_same(single, sharded_cell_stats(g, gl, shards, exclude_ids=np.arange(200), max_block=3000, **kw))
        assert single.n_positives[7] == 0


def test_template_gallery_over_shards_and_refused_with_exclusion():
    q, ql, g, gl = _cell(seed=7)
    shards = _split(g, gl, UNEVEN)
    _assert_same(cell_stats(q, ql, g, gl, gallery_kind="template", map_k=3),
                 sharded_cell_stats(q, ql, shards, gallery_kind="template", map_k=3))
    with pytest.raises(ValueError, match="template galleries with same-set exclusion"):
        sharded_cell_stats(g, gl, shards, gallery_kind="template", exclude_ids=np.arange(len(g)))


def test_memory_is_bounded_by_the_shard(monkeypatch):
    """The largest similarity block and the gallery rows held at once never exceed a shard / max_block."""
    q, ql, g, gl = _cell(seed=9, n=300, nq=80)
    seen, alive = [], []
    real = sharded._similarities

    def spy(qb, gb, out):
        seen.append((qb.shape[0], gb.shape[0], out.size))
        return real(qb, gb, out)

    def shards():  # reads one shard at a time, as from disk; records how many it has handed out unread
        for a in range(0, 300, 40):
            alive.append(a)
            yield Shard(g[a:a + 40].copy(), gl[a:a + 40], np.arange(a, min(a + 40, 300)))

    monkeypatch.setattr(sharded, "_similarities", spy)
    stats = sharded_cell_stats(q, ql, shards, map_k=5, max_block=40 * 30)
    _assert_same(cell_stats(q, ql, g, gl, map_k=5), stats)
    assert len(alive) == 2 * 8  # two passes over 8 shards
    assert max(cols for _, cols, _ in seen) == 40  # never more gallery rows than one shard
    assert max(rows * cols for rows, cols, _ in seen) <= 40 * 30  # the block: at most max_block similarities
    assert max(buf for _, _, buf in seen) <= 40 * 30  # and so is the buffer it is written into


def test_generator_function_works_and_one_shot_iterator_is_refused():
    q, ql, g, gl = _cell(seed=11)
    make = lambda: (s for s in _split(g, gl, UNEVEN))  # noqa: E731
    _assert_same(cell_stats(q, ql, g, gl), sharded_cell_stats(q, ql, make))
    with pytest.raises(ValueError, match="re-iterable"):
        sharded_cell_stats(q, ql, make())


@pytest.mark.parametrize("bad, match", [
    (lambda s: s[:3] + [Shard(s[3].features[:, :10], s[3].labels, s[3].ids)] + s[4:], "shard 3: gallery features are 10-d"),
    (lambda s: s[:2] + [Shard(np.where(np.arange(49)[:, None] == 5, np.nan, s[2].features), s[2].labels, s[2].ids)] + s[3:],
     r"shard 2: gallery features has NaN/inf values in 1 row\(s\) \(first: row 5\)"),
    (lambda s: s[:4] + [Shard(s[4].features, s[4].labels[:-1], s[4].ids)] + s[5:], "shard 4: gallery labels has 122 labels for 123 feature rows"),
    (lambda s: [Shard(x.features, x.labels, x.ids * 0) for x in s], "gallery ids must be distinct"),
    (lambda s: [s[1]], "gallery features are empty"),
])
def test_bad_shards_are_refused_with_one_line(bad, match):
    q, ql, g, gl = _cell(seed=13)
    with pytest.raises(ValueError, match=match):
        sharded_cell_stats(q, ql, bad(_split(g, gl, UNEVEN)))


def test_ids_repeated_across_shards_and_shards_that_change_are_refused():
    q, ql, g, gl = _cell(seed=15, n=100, nq=100)
    twice = _split(g, gl, [0, 50, 100], ids=np.concatenate([np.arange(50), np.arange(50)]))
    with pytest.raises(ValueError, match="appears in more than one shard"):
        sharded_cell_stats(g, gl, twice, exclude_ids=np.arange(100))
    passes = []

    def shrinking():
        passes.append(1)
        return _split(g, gl, [0, 50, 100 - len(passes)])

    with pytest.raises(ValueError, match="the shards changed between the two passes"):
        sharded_cell_stats(q, ql, shrinking)
