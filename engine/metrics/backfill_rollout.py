"""Backfill curves that follow how an upgrade is rolled out: rank merge of two indexes and candidate re-scoring.

Two indexes over the same gallery items: the **old index** (old-model vectors, searched with queries in the
old space: the new model's queries mapped by an adapter A, or the old model's own queries) and the **new
index** (new-model vectors, searched with the new model's queries). Conventions are those of
:mod:`engine.metrics.backfill` (cosine similarity, ties as in scikit-learn for AP and pessimistic for
Recall@k by default, queries without a positive counted and left out, ``same_set`` excluding each query's
own item by index).

* **Rank merge** (online backfilling, Seo et al., "Metric Compatible Training for Online Backfilling in
  Large-Scale Retrieval", WACV 2025): at fraction beta the first ``round(beta * N)`` items of ``order``
  live in the new index and the others in the old one; each item appears once, in the index it lives in.
  ``merge="score"`` (default, the paper's distance rank merge): one list sorted by each item's similarity in
  its own index (old-space query vs old vector, new query vs new vector), ties shared as in any ranking.
  ``merge="rank"``: the two result lists interleaved by position, the new index first: an item's merged
  place is ``2r`` in the new index and ``2r + 1`` in the old one, ``r`` = how many items of its own index
  score strictly higher (tied items share ``r``, hence a place). Use it where the two scores are not
  comparable. Endpoints: beta = 0 is the old index's cell (old-space queries), beta = 1 the new self-test.
* **Candidate re-scoring**: the old index returns its top K for the old-space query (ties at the K-th
  place broken by the lower gallery row, i.e. the caller's row order); those K are re-ranked by the new
  model's similarity (new query vs their new vectors) and placed first; the other items follow in their
  old order. K = 0 is the old index's cell; K = N the new model's ranking of every item (its self-test).
  The curve runs over K, also given as the fraction K / N so it has an area and reach fractions.

Item replacement (one query, a gallery whose items switch from old to new vectors) is
:func:`engine.metrics.backfill.backfill_curves`; :func:`rollout_curves` reports the three side by side.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.metrics.backfill import (
    _check_fractions,
    _check_order,
    backfill_counts,
    backfill_curves,
    check_two_spaces,
    curve_area,
    curve_output,
    fraction_to_reach,
    mixed_gallery_curves,
    parse_curve_metrics,
)
from engine.metrics.backfill_kernels import _stats, segment_of_columns
from engine.metrics.backfill_orders import RESIDUAL_BLOCK, backfill_order
from engine.metrics.device import auto_device, host, on_cpu, one_blas_thread, torch_threads_kept
from engine.metrics.backfill_rollout_kernels import rank_merge_stats, rescoring_stats, sorted_columns
from engine.metrics.ranking import QueryStats
from engine.metrics.retrieval import RankTies, prepare_gallery, retrieval_metrics, unit_rows
from engine.metrics.search import DEFAULT_BLOCK, similarity_blocks
from engine.metrics.validate import check_features

MERGE_RULES = ("score", "rank")
ROLLOUT_ORDERS = ("random", "adapter_residual")


def _greater_counts(vals: Any) -> Any:
    """Per row of a tensor, for each entry, how many entries of the row are strictly greater (``-inf`` entries count as absent)."""
    import torch

    ascending = torch.sort(vals, dim=1).values
    return vals.shape[1] - torch.searchsorted(ascending, vals.contiguous(), right=True)


KEY_ENGINES = ("auto", "torch")


def _check_engine(engine: str) -> None:
    if engine not in KEY_ENGINES:
        raise ValueError(f"unknown engine {engine!r}; use 'auto' (compiled on CPU, torch on CUDA) or 'torch'")


def _keyed_curves(query_old, query_new, query_labels, old_gallery, new_gallery, gallery_labels, *, n_points: int,
                  keys: Callable[..., Any], compiled: Callable[..., tuple[np.ndarray, ...]], engine: str,
                  metrics, same_set: bool, rank_ties: RankTies, max_block: int):
    """Per grid point, the statistics of a ranking: on CPU (``engine="auto"``) from ``compiled(s_old, s_new, by_old,
    by_new, starts, ends, map_k, ctx)`` (every point at once, rows sorted once per block), else from the ranking
    kernel over the keys ``keys(s_old, s_new, point, ctx)``."""
    n = check_two_spaces(query_old, query_new, query_labels, old_gallery, new_gallery, gallery_labels, same_set=same_set)
    metrics, parsed, ks, map_k, want_ap = parse_curve_metrics(metrics, rank_ties)
    device = auto_device()
    query_labels = np.asarray(query_labels)
    old_g = prepare_gallery(old_gallery, gallery_labels, device=device)
    new_g = prepare_gallery(new_gallery, gallery_labels, device=device)  # same labels -> same column order
    q_old, q_new = unit_rows(query_old, device), unit_rows(query_new, device)
    starts, ends = old_g.slices(query_labels)
    exclude = old_g.position if same_set else None
    parts: list[list[QueryStats]] = [[] for _ in range(n_points)]
    blocks = zip(similarity_blocks(q_old, old_g, starts, ends, exclude, None, max_block),
                 similarity_blocks(q_new, new_g, starts, ends, exclude, None, max_block))
    ctx: dict = {"position": old_g.position, "n": n}
    with one_blas_thread(device is None):
        for (rows, s_old), (_, s_new) in blocks:
            if engine == "auto" and on_cpu(s_old):
                so, sn = np.ascontiguousarray(host(s_old)), np.ascontiguousarray(host(s_new))
                by_old, by_new = sorted_columns(so, old_g.position), sorted_columns(sn, old_g.position)
                with torch_threads_kept():
                    n_pos, neg_ge, neg_gt, ap, ap_k = compiled(so, sn, by_old, by_new, starts[rows], ends[rows], map_k, ctx)
                for i in range(n_points):
                    parts[i].append(QueryStats(n_pos[i], neg_ge[i], neg_gt[i], ap[i], ap_k[i]))
                continue
            ctx.pop("old_place", None)  # per-block state of the torch path
            if isinstance(s_old, np.ndarray):  # the keys are torch's: the same blocks as tensors (no copy)
                import torch

                s_old, s_new = torch.from_numpy(s_old), torch.from_numpy(s_new)
            for i in range(n_points):
                parts[i].append(_stats(keys(s_old, s_new, i, ctx), starts[rows], ends[rows], map_k=map_k, want_ap=want_ap))
    return n, metrics, parsed, ks, map_k, parts


def rank_merge_curves(
    query_old: np.ndarray,
    query_new: np.ndarray,
    query_labels: np.ndarray,
    old_gallery: np.ndarray,
    new_gallery: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    order: Sequence[int] | np.ndarray,
    fractions: Sequence[float] | np.ndarray | None = None,
    metrics: Sequence[str] = ("recall@1", "map"),
    merge: str = "score",
    same_set: bool = False,
    rank_ties: RankTies = "pessimistic",
    max_block: int = DEFAULT_BLOCK,
    engine: str = "auto",
) -> dict[str, np.ndarray | int]:
    """Rank-merge curves while items move from the old index to the new one in ``order`` (see the module docstring).

    ``query_old`` searches the old index (``old_gallery``), ``query_new`` the new one (``new_gallery``); the two
    may differ in dimension. Returns the same dict as :func:`engine.metrics.backfill.backfill_curves`. ``engine``
    (merge by rank): "auto" = compiled kernels on CPU and torch on CUDA, "torch" = torch keys read by the ranking kernel
    everywhere (the same similarity blocks).
    """
    if merge not in MERGE_RULES:
        raise ValueError(f"unknown merge rule {merge!r}; use one of {', '.join(MERGE_RULES)}")
    _check_engine(engine)
    if merge == "score":
        return mixed_gallery_curves(query_old, query_new, query_labels, old_gallery, new_gallery, gallery_labels,
                                    order=order, fractions=fractions, metrics=metrics, same_set=same_set, rank_ties=rank_ties,
                                    max_block=max_block)
    n = len(np.asarray(gallery_labels))
    order = _check_order(order, n)
    fractions = _check_fractions(fractions)
    counts = backfill_counts(fractions, n)

    def keys(s_old, s_new, i, ctx):
        import torch

        if "segment" not in ctx:
            ctx["segment"] = torch.as_tensor(segment_of_columns(ctx["position"][order], counts), device=s_old.device)
        in_new = ctx["segment"] <= i  # (width,) columns living in the new index at this fraction
        old_vals = s_old.masked_fill(in_new, -torch.inf)
        new_vals = s_new.masked_fill(~in_new, -torch.inf)
        place = torch.where(in_new, 2 * _greater_counts(new_vals), 2 * _greater_counts(old_vals) + 1)
        own = torch.where(in_new, new_vals, old_vals)
        return torch.where(own == -torch.inf, -torch.inf, -place.to(torch.float32))

    def compiled(so, sn, by_old, by_new, starts, ends, map_k, ctx):
        if "segment_np" not in ctx:
            ctx["segment_np"] = segment_of_columns(ctx["position"][order], counts)
        return rank_merge_stats(so, sn, by_old, by_new, ctx["segment_np"], starts, ends, len(counts), map_k=map_k)

    n, metrics, parsed, ks, map_k, parts = _keyed_curves(
        query_old, query_new, query_labels, old_gallery, new_gallery, gallery_labels, n_points=len(fractions), keys=keys,
        compiled=compiled, engine=engine, metrics=metrics, same_set=same_set, rank_ties=rank_ties, max_block=max_block)
    return curve_output(parts, metrics, parsed, ks, map_k, rank_ties, fractions=fractions, n_backfilled=counts)


def rescoring_ks(n: int, fractions: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
    """Candidate counts K = round(beta * n) over a fraction grid (default 0, 0.05, ..., 1), repeats dropped."""
    return np.unique(backfill_counts(_check_fractions(fractions), n))


def rescoring_curves(
    query_old: np.ndarray,
    query_new: np.ndarray,
    query_labels: np.ndarray,
    old_gallery: np.ndarray,
    new_gallery: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    ks: Sequence[int] | np.ndarray | None = None,
    metrics: Sequence[str] = ("recall@1", "map"),
    same_set: bool = False,
    rank_ties: RankTies = "pessimistic",
    max_block: int = DEFAULT_BLOCK,
    engine: str = "auto",
) -> dict[str, np.ndarray | int]:
    """Candidate re-scoring curves over K: the old index's top K re-ranked by the new model (module docstring).

    ``ks``: strictly increasing candidate counts in [0, N] (default :func:`rescoring_ks`). Returns ``ks``,
    ``fractions`` (K / N), one array per metric and the query counts. ``engine`` as in :func:`rank_merge_curves`.
    """
    _check_engine(engine)
    n = len(np.asarray(gallery_labels))
    grid = rescoring_ks(n) if ks is None else np.asarray(ks)
    if grid.ndim != 1 or len(grid) == 0 or not np.issubdtype(grid.dtype, np.integer):
        raise ValueError(f"ks must be a non-empty 1-D list of integer candidate counts, got {grid!r}")
    if grid.min() < 0 or grid.max() > n or (np.diff(grid) <= 0).any():
        raise ValueError(f"ks must increase strictly within [0, {n}] (the gallery size), got {grid.tolist()}")
    grid = grid.astype(np.int64)

    def keys(s_old, s_new, i, ctx):
        import torch

        if "old_place" not in ctx:  # place of each column in the old ranking, ties by lower gallery row
            position = torch.as_tensor(ctx["position"], device=s_old.device)  # column of each gallery row
            by_row = s_old[:, position]
            idx = torch.sort(by_row, dim=1, descending=True, stable=True).indices
            place = torch.empty_like(idx)
            place.scatter_(1, idx, torch.arange(by_row.shape[1], device=s_old.device).expand_as(idx).contiguous())
            ctx["old_place"] = torch.empty_like(place)
            ctx["old_place"][:, position] = place
        width = ctx["n"]
        valid = s_old != -torch.inf
        head = (ctx["old_place"] < int(grid[i])) & valid
        head_rank = _greater_counts(s_new.masked_fill(~head, -torch.inf))
        tail_rank = _greater_counts(s_old.masked_fill(head, -torch.inf))
        key = torch.where(head, 2 * width - head_rank, width - tail_rank).to(torch.float32)  # head above tail
        return key.masked_fill(~valid, -torch.inf)

    def compiled(so, sn, by_old, by_new, starts, ends, map_k, ctx):
        return rescoring_stats(so, sn, by_old, by_new, grid, starts, ends, map_k=map_k)

    n, metrics, parsed, ks_, map_k, parts = _keyed_curves(
        query_old, query_new, query_labels, old_gallery, new_gallery, gallery_labels, n_points=len(grid), keys=keys,
        compiled=compiled, engine=engine, metrics=metrics, same_set=same_set, rank_ties=rank_ties, max_block=max_block)
    return curve_output(parts, metrics, parsed, ks_, map_k, rank_ties, ks=grid, fractions=grid / max(n, 1))


def curve_summary(fractions: np.ndarray, values: np.ndarray, *, old_self: float, new_self: float) -> dict[str, float | None]:
    """A curve's area (M-tilde; None unless the grid runs from 0 to 1) and the fractions at which it first reaches
    the old and the new self-test (``reach_old``, ``reach_new``; None when it never does)."""
    f = np.asarray(fractions, dtype=np.float64)
    area = curve_area(f, values) if len(f) and f[0] == 0.0 and f[-1] == 1.0 else None
    return {"area": area, "reach_old": fraction_to_reach(f, values, old_self),
            "reach_new": fraction_to_reach(f, values, new_self)}


def map_rows(adapter: Callable[[np.ndarray], np.ndarray] | None, x: np.ndarray, *, what: str) -> np.ndarray:
    """``adapter`` applied to the rows of ``x`` in blocks (float32); ``x`` itself when ``adapter`` is None."""
    check_features(what, x)
    if adapter is None:
        return np.asarray(x)
    if not callable(adapter):
        raise ValueError(f"adapter must be a callable mapping new-model rows to the old space, got {type(adapter).__name__}")
    parts = []
    for lo in range(0, len(x), RESIDUAL_BLOCK):
        rows = np.asarray(x[lo:lo + RESIDUAL_BLOCK], dtype=np.float32)
        out = np.asarray(adapter(rows))
        if out.ndim != 2 or len(out) != len(rows):
            raise ValueError(f"the adapter returned shape {out.shape} for {len(rows)} rows of the {what}; expected one row each")
        parts.append(out.astype(np.float32))
    mapped = np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
    check_features(f"adapted {what}", mapped)
    return mapped


def rollout_curves(
    old_query: np.ndarray,
    new_query: np.ndarray,
    query_labels: np.ndarray,
    old_gallery: np.ndarray,
    new_gallery: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    adapter: Callable[[np.ndarray], np.ndarray] | None = None,
    adapted_query: np.ndarray | None = None,
    adapted_gallery: np.ndarray | None = None,
    orders: Sequence[str] = ROLLOUT_ORDERS,
    fractions: Sequence[float] | np.ndarray | None = None,
    metrics: Sequence[str] = ("recall@1", "map"),
    merge: str = "score",
    same_set: bool = False,
    rank_ties: RankTies = "pessimistic",
    seed: int = 0,
) -> dict:
    """Item replacement (per order), rank merge (per order) and candidate re-scoring, each with its summary.

    The new-to-old map is ``adapter`` (a callable), or the already adapted ``adapted_query`` and
    ``adapted_gallery`` rows, or the identity when neither is given (same dimension needed). Old-space
    queries are A(new query). Item replacement searches with A(new query) a gallery whose items move from
    their old vector to A(new vector); rank merge and re-scoring search the old index with A(new query) and
    the new index with the new query. Orders are names of :mod:`engine.metrics.backfill_orders` (``distance_*``
    use the gallery labels and the old vectors; ``adapter_residual`` the same map). Summaries compare each
    curve with the old self-test (old queries, old gallery) and the new one (new queries, new gallery).
    """
    if adapter is not None and (adapted_query is not None or adapted_gallery is not None):
        raise ValueError("give the adapter either as a callable or as adapted rows, not both")
    if (adapted_query is None) != (adapted_gallery is None):
        raise ValueError("adapted rows need both adapted_query and adapted_gallery")
    a_query = adapted_query if adapted_query is not None else map_rows(adapter, new_query, what="new query features")
    a_gallery = adapted_gallery if adapted_gallery is not None else map_rows(adapter, new_gallery, what="new gallery features")
    metrics, parsed, ks, map_k, _ = parse_curve_metrics(metrics, rank_ties)
    fractions = _check_fractions(fractions)
    if fractions[0] != 0.0 or fractions[-1] != 1.0:
        raise ValueError(f"a roll-out curve runs from beta 0 to 1 (its area averages over [0, 1]); got {fractions[0]} to {fractions[-1]}")
    cell = {"ks": ks or (1,), "map_at": map_k or None, "same_set": same_set, "rank_ties": rank_ties}
    old_self = retrieval_metrics(old_query, query_labels, old_gallery, gallery_labels, **cell)
    new_self = retrieval_metrics(new_query, query_labels, new_gallery, gallery_labels, **cell)

    def summarised(out: dict, grid: np.ndarray) -> dict:
        return {"curves": {m: np.asarray(out[m]).tolist() for m in metrics},
                "summary": {m: curve_summary(grid, np.asarray(out[m]), old_self=old_self[m], new_self=new_self[m]) for m in metrics}}

    replacement, merged = {}, {}
    for name in orders:
        order = backfill_order(name, old_gallery=old_gallery, new_gallery=new_gallery, gallery_labels=gallery_labels,
                               seed=seed, adapter=a_gallery)
        out = backfill_curves(a_query, query_labels, old_gallery, a_gallery, gallery_labels, order=order,
                              fractions=fractions, metrics=metrics, same_set=same_set, rank_ties=rank_ties)
        replacement[name] = summarised(out, fractions)
        out = rank_merge_curves(a_query, new_query, query_labels, old_gallery, new_gallery, gallery_labels, order=order,
                                fractions=fractions, metrics=metrics, merge=merge, same_set=same_set, rank_ties=rank_ties)
        merged[name] = summarised(out, fractions)
    rescored = rescoring_curves(a_query, new_query, query_labels, old_gallery, new_gallery, gallery_labels,
                                ks=rescoring_ks(len(np.asarray(gallery_labels)), fractions), metrics=metrics,
                                same_set=same_set, rank_ties=rank_ties)
    return {
        "fractions": fractions.tolist(),
        "metrics": list(metrics),
        "merge": merge,
        "self_test": {"old": {m: old_self[m] for m in metrics}, "new": {m: new_self[m] for m in metrics}},
        "cross_test": {m: replacement[orders[0]]["curves"][m][0] for m in metrics} if orders else None,
        "replacement": replacement,
        "rank_merge": merged,
        "rescoring": {"ks": rescored["ks"].tolist(), "fractions": rescored["fractions"].tolist(),
                      **summarised(rescored, rescored["fractions"])},
        "n_queries": old_self["n_queries"], "n_valid": new_self["n_valid"], "n_no_positive": new_self["n_no_positive"],
    }
