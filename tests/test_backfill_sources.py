"""Backfill curves from sources (engine.metrics.list_merge, engine.upgrade.backfill_sources): with lists that cover
the gallery they equal the in-memory backfill curves exactly (labels), and a numpy brute force over the explicitly
mixed gallery (qrels, label-free); with truncated lists every decided query is exact and the others are counted."""
from __future__ import annotations

import json

import numpy as np
import pytest
from support.upgrade_sources import NG, NQ, embeddings

from engine.cli import main
from engine.metrics.backfill import backfill_counts, backfill_curves, curve_area, fraction_to_reach
from engine.metrics.backfill_orders import adapter_residual, backfill_order
from engine.metrics.list_merge import list_curves, merge_backfilled
from engine.metrics.relevance import label_outcomes
from engine.metrics.topk import array_blocks, stream_topk
from engine.upgrade.backfill_sources import SOURCE_ORDERINGS, class_mean_orders, residual_order
from engine.upgrade.from_sources import SourceSpecs, check_sources
from support.backfill_sources import hand_ndcg

SIDES = ("old_gallery", "new_gallery", "old_queries", "new_queries")
RESAMPLES = 200
GRID = np.linspace(0.0, 1.0, 21)


@pytest.fixture(scope="module")
def drift():
    return embeddings()


@pytest.fixture(autouse=True)
def roots(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPATLAB_DATA_ROOTS", str(tmp_path))


def write_npz(folder, e, *, labels: bool = True, new_order: np.ndarray | None = None) -> SourceSpecs:
    """Each side as an .npz in the natural order (gallery row i = item i); the new gallery optionally reordered."""
    folder.mkdir(parents=True, exist_ok=True)
    for side in SIDES:
        n = NG if "gallery" in side else NQ
        at = new_order if side == "new_gallery" and new_order is not None else np.arange(n)
        extra = {"labels": (e["g_labels"] if "gallery" in side else e["q_labels"])[at]} if labels else {}
        np.savez(folder / f"{side}.npz", ids=np.arange(n)[at], vectors=e[side][at], **extra)
    return SourceSpecs(*(str(folder / f"{s}.npz") for s in ("old_gallery", "old_queries", "new_queries", "new_gallery")))


def unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_lists(e, order, k):
    """Per fraction, each new query's top-k rows on the explicitly mixed gallery (numpy, float64)."""
    out = []
    for count in backfill_counts(GRID, NG):
        mixed = e["old_gallery"].copy()
        mixed[order[:count]] = e["new_gallery"][order[:count]]
        sims = unit(e["new_queries"]) @ unit(mixed).T
        out.append(np.argsort(-sims, axis=1, kind="stable")[:, :k])
    return out


def qrels_for(e, seed: int = 5):
    """Graded judgements: per query, 1..4 gallery rows of its class with grades 1..3 (some queries judged none)."""
    rng = np.random.default_rng(seed)
    out = {}
    for q in range(NQ):
        if q % 7 == 3:
            continue
        same = np.flatnonzero(e["g_labels"] == e["q_labels"][q])
        picked = rng.choice(same, size=min(len(same), int(rng.integers(1, 5))), replace=False)
        out[q] = {int(i): int(rng.integers(1, 4)) for i in picked}
    return out




# ---- the pure merge ------------------------------------------------------------------------------------------------

def test_complete_lists_give_the_in_memory_curves_exactly(drift):
    """D = N: every query decided, Recall@1, Recall@5 and mAP@5 equal backfill_curves point for point."""
    q = drift["new_queries"]
    on_old = stream_topk(q, array_blocks(np.arange(NG), drift["old_gallery"], 64), k=NG)
    on_new = stream_topk(q, array_blocks(np.arange(NG), drift["new_gallery"], 50), k=NG)
    order = backfill_order("random", gallery_labels=drift["g_labels"], seed=4)
    want = backfill_curves(q, drift["q_labels"], drift["old_gallery"], drift["new_gallery"], drift["g_labels"],
                           order=order, metrics=("recall@1", "recall@5", "map@5"))
    for metric in ("recall@1", "recall@5", "map@5"):
        at = int(metric.split("@")[1])

        def outcome(top, rows, metric=metric, at=at):
            return label_outcomes(top, drift["q_labels"][rows], np.arange(NG), drift["g_labels"], ks=(at,)).values[metric]

        got = list_curves(on_old, on_new, {"random": order}, outcome, k=at)["random"]
        assert got.decided.tolist() == [1.0] * len(GRID)
        np.testing.assert_array_equal(got.values, want[metric])
        np.testing.assert_array_equal(got.n_backfilled, want["n_backfilled"])


def test_truncated_lists_decide_exactly_or_flag(drift):
    """D = 12 of 240: a decided query's merged top-5 is the brute-force top-5 of the mixed gallery; some are not."""
    q, k, depth = drift["new_queries"], 5, 12
    on_old = stream_topk(q, array_blocks(np.arange(NG), drift["old_gallery"], 64), k=depth)
    on_new = stream_topk(q, array_blocks(np.arange(NG), drift["new_gallery"], 64), k=depth)
    order = backfill_order("random", gallery_labels=drift["g_labels"], seed=1)
    rank = np.empty(NG, np.int64)
    rank[order] = np.arange(NG)
    shares = []
    for count, want in zip(backfill_counts(GRID, NG), brute_lists(drift, order, k)):
        merged = merge_backfilled(on_old, on_new, rank < count, k)
        rows = np.flatnonzero(merged.decided)
        np.testing.assert_array_equal(merged.top.ids[rows], want[rows])
        shares.append(merged.decided.mean())
    assert shares[0] == shares[-1] == 1.0  # one list alone is exact to its depth
    assert 0 < min(shares) < 1  # mid-way some queries need items beyond depth 12: counted, not guessed


def test_the_merge_refuses_lists_of_different_galleries(drift):
    q = drift["new_queries"]
    a = stream_topk(q, array_blocks(np.arange(NG), drift["old_gallery"]), k=4)
    b = stream_topk(q, array_blocks(np.arange(NG - 1), drift["new_gallery"][:-1]), k=4)
    with pytest.raises(ValueError, match="one gallery"):
        merge_backfilled(a, b, np.zeros(NG, bool), 4)


def test_the_residual_order_pairs_blocks_by_id_in_any_nearby_order(drift):
    want = backfill_order("adapter_residual", old_gallery=drift["old_gallery"], new_gallery=drift["new_gallery"], seed=0)
    rows = np.arange(NG)
    swapped = np.concatenate([rows[40:80], rows[:40], rows[80:]])  # the new stream lists two blocks swapped
    old_blocks = array_blocks(rows, drift["old_gallery"], 40)
    new_blocks = array_blocks(swapped, drift["new_gallery"][swapped], 40)
    np.testing.assert_array_equal(residual_order(old_blocks, new_blocks, NG, max_pending=200), want)
    reverse = rows[::-1].copy()
    assert residual_order(old_blocks, array_blocks(reverse, drift["new_gallery"][reverse], 40), NG, max_pending=60) is None
    res = adapter_residual(drift["new_gallery"], drift["old_gallery"])
    assert np.all(np.diff(res[want]) <= 0)  # largest residual first


def test_the_class_mean_orders_equal_the_in_memory_ones_from_two_passes(drift):
    labels = drift["g_labels"].astype(str)  # text labels, as a Parquet column may hold them
    got = class_mean_orders(lambda: iter(array_blocks(np.arange(NG), drift["old_gallery"], 37)), labels)
    for name in ("distance_mse", "distance_cosine"):
        want = backfill_order(name, old_gallery=drift["old_gallery"], gallery_labels=labels, seed=0)
        np.testing.assert_array_equal(got[name], want)


# ---- through check_sources -----------------------------------------------------------------------------------------

def test_labels_backfill_equals_the_features_check(tmp_path, drift):
    """D covers the gallery: each ordering's curve, area and reach equal the in-memory backfill of the same order."""
    got = check_sources(write_npz(tmp_path / "s", drift), relevance="labels", metric="recall@1", resamples=RESAMPLES,
                        backfill_depth=NG, interval="queries")  # the features check it is compared with resamples the queries
    assert got.report.verdict == "not compatible"
    assert [n.ordering for n in got.report.backfill] == list(SOURCE_ORDERINGS)  # labels: the distance orders too
    old_self = got.report.old_old
    for need in got.report.backfill:
        order = backfill_order(need.ordering, old_gallery=drift["old_gallery"], new_gallery=drift["new_gallery"],
                               gallery_labels=drift["g_labels"], seed=0)
        want = backfill_curves(drift["new_queries"], drift["q_labels"], drift["old_gallery"], drift["new_gallery"],
                               drift["g_labels"], order=order, metrics=("recall@1",))["recall@1"]
        assert need.values == want.tolist() and need.fractions == GRID.tolist()
        assert need.area == curve_area(GRID, want)
        assert need.to_old_self == fraction_to_reach(GRID, want, old_self)
        assert need.to_new_self == fraction_to_reach(GRID, want, float(want[-1]))
        assert got.backfill_decided[need.ordering] == [1.0] * len(GRID)
    assert got.report.best_ordering == max(got.report.backfill, key=lambda n: n.area).ordering
    assert got.report.backfill[0].values[0] == got.report.new_old and got.report.backfill[0].values[-1] == got.report.new_new


def test_qrels_backfill_equals_numpy_on_the_mixed_gallery(tmp_path):
    """nDCG@10 at every point of the random curve, by hand on the explicitly mixed gallery (no truncation); the new
    model a rotation of the old space, so the cross-test fails clearly."""
    rotated = embeddings(new="rotation")
    judged = qrels_for(rotated)
    path = tmp_path / "qrels.tsv"
    path.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{i}\t{g}\n" for q, d in judged.items()
                                                            for i, g in d.items()))
    specs = write_npz(tmp_path / "s", rotated)
    specs = SourceSpecs(specs.old_gallery, specs.old_queries, specs.new_queries, specs.new_gallery, str(path))
    got = check_sources(specs, relevance="qrels", resamples=RESAMPLES, backfill_depth=NG, seed=2)
    assert got.report.verdict == "not compatible"
    need = next(n for n in got.report.backfill if n.ordering == "random")
    order = backfill_order("random", gallery_labels=rotated["g_labels"], seed=2)
    want = [np.nanmean([hand_ndcg(top[q], judged.get(q, {}), 10) for q in range(NQ)])
            for top in brute_lists(rotated, order, 10)]
    np.testing.assert_allclose(need.values, want, rtol=0, atol=1e-12)


def test_label_free_backfill_equals_numpy_and_ends_at_one(tmp_path):
    """Neighbour recall@10 against the new/new top-10, brute force per point; the new gallery in another order
    and the new model a rotation of the old space (the cross-test fails clearly)."""
    rotated = embeddings(new="rotation")
    shuffled = np.random.default_rng(8).permutation(NG)
    got = check_sources(write_npz(tmp_path / "s", rotated, labels=False, new_order=shuffled), relevance="none",
                        resamples=RESAMPLES, backfill_depth=NG, block_rows=NG)  # one block: the residual pairs it
    assert got.report.verdict == "not compatible"
    assert [n.ordering for n in got.report.backfill] == ["random", "adapter_residual"]
    reference = np.argsort(-(unit(rotated["new_queries"]) @ unit(rotated["new_gallery"]).T), axis=1, kind="stable")[:, :10]
    for need in got.report.backfill:
        order = backfill_order(need.ordering, old_gallery=rotated["old_gallery"], new_gallery=rotated["new_gallery"], seed=0)
        want = [np.mean([len(set(top[q]) & set(reference[q])) / 10 for q in range(NQ)])
                for top in brute_lists(rotated, order, 10)]
        np.testing.assert_allclose(need.values, want, rtol=0, atol=1e-12)
        assert need.values[-1] == 1.0
    assert any("ends at 1 by definition" in n for n in got.report.notes)


def test_a_shallow_depth_counts_the_undecided_queries(tmp_path, drift):
    got = check_sources(write_npz(tmp_path / "s", drift), relevance="labels", metric="recall@1", resamples=RESAMPLES,
                        backfill_depth=3, interval="queries")  # a clear "not compatible": the curves are computed
    shares = got.backfill_decided["random"]
    assert shares[0] == shares[-1] == 1.0 and min(shares) < 1.0
    assert got.backfill_depth == 3
    assert any("queries decided" in n and "--backfill-depth" in n for n in got.report.notes)


def test_no_backfill_when_compatible_or_without_the_new_gallery(tmp_path, drift):
    same = embeddings(new="same")
    assert check_sources(write_npz(tmp_path / "same", same), resamples=RESAMPLES).report.backfill == ()
    specs = write_npz(tmp_path / "s", drift)
    alone = check_sources(SourceSpecs(specs.old_gallery, specs.old_queries, specs.new_queries), resamples=RESAMPLES)
    assert alone.report.backfill == () and alone.backfill_depth is None


def test_cli_prints_and_exports_the_backfill(tmp_path, capsys, drift):
    specs = write_npz(tmp_path / "s", drift)
    out = tmp_path / "report.json"
    code = main(["check-upgrade", "--old-gallery", specs.old_gallery, "--new-gallery", specs.new_gallery,
                 "--old-queries", specs.old_queries, "--new-queries", specs.new_queries, "--resamples", str(RESAMPLES),
                 "--backfill-depth", str(NG), "--json", str(out), "--data-root", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 1
    data = json.loads(out.read_text())
    assert [n["ordering"] for n in data["backfill"]] == list(SOURCE_ORDERINGS)
    assert data["backfill_depth"] == NG and data["backfill_decided"]["random"] == [1.0] * len(GRID)
    for need in data["backfill"]:
        assert f"backfill {need['ordering']:<16} area {need['area']:.4f}" in printed


def test_a_bad_depth_is_one_line_exit_2(tmp_path, capsys, drift):
    specs = write_npz(tmp_path / "s", drift)
    code = main(["check-upgrade", "--old-gallery", specs.old_gallery, "--new-gallery", specs.new_gallery,
                 "--old-queries", specs.old_queries, "--new-queries", specs.new_queries, "--backfill-depth", "0",
                 "--data-root", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "backfill depth must be a positive integer" in err and len(err.strip().splitlines()) == 1
    code = main(["check-upgrade", "--features", str(tmp_path), "--backfill-depth", "50"])
    assert code == 2 and "--backfill-depth go(es) with --old-gallery" in capsys.readouterr().err
