"""Partial backfilling: retrieval metrics while gallery items are re-embedded one by one.

Setting (Paper B, Sec. 3.6; FastFill). The gallery starts embedded by the old model, raw or
forward-adapted (F(old)); queries come from the new model, raw or backward-adapted (B(new)). Gallery
items are re-embedded by the new model following an ordering ``order``, a permutation of the gallery
rows (first = re-embedded first). At a fraction beta the first ``round(beta * N)`` items of ``order``
carry their new embedding and the others their old one. Each such cell is scored with the evaluation
core's conventions (:mod:`engine.metrics.ranking`): cosine similarity, label-sorted gallery columns,
-inf for an excluded item, scikit-learn ties for AP, pessimistic ties for Recall@k by default, and
queries without a positive counted and left out of the means. The protocol is ``instance`` (class
templates would mix old and new items into one vector).

Choices:

* Rounding: ``round(beta * N)`` is the nearest integer with halves rounded up, ``floor(beta * N + 0.5)``
  (:func:`backfill_counts`). The paper writes ``floor(beta * N)``. The two agree whenever beta * N is an
  integer (the default grid with N a multiple of 20), and rounding keeps a product such as
  0.29 * 100 = 28.999999999999996 at 29 where flooring would drop it to 28.
* Area: M-tilde = E_{beta ~ U[0, 1]} M(beta) is the trapezoid rule over the grid, which must start at 0
  and end at 1 (:func:`curve_area`). Values are fractions in [0, 1], like every metric here.
* Endpoints: beta = 0 is the cross-test (new queries, old gallery) and beta = 1 the new model's
  self-test. Both equal ``retrieval_metrics`` on the pure galleries bit for bit, because the similarity
  blocks come from the torch backend's own ``similarity_blocks``: same normalisation, same row blocks
  (``max_block``), same exclusion by index.

Evaluation is incremental. Per block of query rows, the similarities to the old and to the new
gallery are computed once (two matrix products). For each beta, the columns backfilled since the
previous beta are copied from the new block into the old one (the backfilled sets are nested), and the
ranking kernel runs on that mixed block. A request for Recall@1 alone skips the ranking kernel: one
pass over both blocks collects, per query, the best positive and the best negative of each segment of
the order (the items first backfilled at one fraction); the best positive and negative at every beta
are then prefix/suffix maxima over those segments (:func:`_recall1_stats`). Exact, and its cost does
not grow with the grid size.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numba
import numpy as np
import torch

from engine.device import pick_device
from engine.metrics.ranking import QueryStats, stats_numba, stats_torch
from engine.metrics.retrieval import Ties, unit_rows, metrics_from_stats, parse_metric, prepare_gallery
from engine.metrics.search import DEFAULT_BLOCK, similarity_blocks
from engine.metrics.validate import check_cell, check_features, check_labels

DEFAULT_FRACTIONS = np.linspace(0.0, 1.0, 21)


def backfill_counts(fractions: np.ndarray, n: int) -> np.ndarray:
    """Number of gallery items backfilled at each fraction: ``round(beta * n)``, halves rounded up."""
    return np.floor(np.asarray(fractions, dtype=np.float64) * n + 0.5).astype(np.int64)


def _check_fractions(fractions: Sequence[float] | np.ndarray | None) -> np.ndarray:
    f = DEFAULT_FRACTIONS.copy() if fractions is None else np.asarray(fractions, dtype=np.float64)
    if f.ndim != 1 or len(f) == 0:
        raise ValueError(f"fractions must be a non-empty 1-D grid of betas in [0, 1], got shape {f.shape}")
    if not np.isfinite(f).all() or f.min() < 0 or f.max() > 1:
        raise ValueError(f"fractions must lie in [0, 1], got values from {f.min()} to {f.max()}")
    steps = np.diff(f)
    if (steps <= 0).any():
        i = int(np.flatnonzero(steps <= 0)[0])
        raise ValueError(f"fractions must be strictly increasing; {f[i]} is followed by {f[i + 1]}")
    return f


def _check_order(order: Sequence[int] | np.ndarray, n: int) -> np.ndarray:
    order = np.asarray(order)
    if order.ndim != 1:
        raise ValueError(f"order must be a 1-D permutation of the gallery rows, got shape {order.shape}")
    if not np.issubdtype(order.dtype, np.integer):
        raise ValueError(f"order must hold integer gallery row indices, got dtype {order.dtype}")
    if len(order) != n:
        raise ValueError(f"order has {len(order)} entries but the gallery has {n} items; it must list every row once")
    outside = (order < 0) | (order >= n)
    if outside.any():
        raise ValueError(f"order has {int(outside.sum())} out-of-range indices (first: {order[outside][0]}); "
                         f"gallery rows are 0..{n - 1}")
    repeated = np.flatnonzero(np.bincount(order, minlength=n) > 1)
    if len(repeated):
        raise ValueError(f"order has duplicates: {len(repeated)} gallery rows appear more than once "
                         f"(first: {repeated[0]}); it must list every row once")
    return order.astype(np.int64)


def _stats(sims: torch.Tensor, starts: np.ndarray, ends: np.ndarray, *, map_k: int, want_ap: bool) -> QueryStats:
    """The ranking statistics of one block, with the kernel the torch backend uses on that device."""
    if sims.device.type == "cpu":
        return stats_numba(sims.numpy(), starts, ends, map_k=map_k, want_ap=want_ap)
    return stats_torch(sims, torch.as_tensor(starts), torch.as_tensor(ends), map_k=map_k, want_ap=want_ap)


@numba.njit(parallel=True, cache=True, nogil=True)
def _copy_columns_kernel(dst, src, cols):  # pragma: no cover - compiled
    for r in numba.prange(dst.shape[0]):
        for c in cols:
            dst[r, c] = src[r, c]


def copy_columns(dst: torch.Tensor, src: torch.Tensor, cols: np.ndarray) -> None:
    """``dst[:, cols] = src[:, cols]`` in place (compiled on CPU, where torch's column indexing is slow)."""
    cols = np.sort(cols)  # ascending columns walk each row forwards
    if dst.device.type == "cpu":
        _copy_columns_kernel(dst.numpy(), src.numpy(), cols)
    else:
        idx = torch.as_tensor(cols, device=dst.device)
        dst.index_copy_(1, idx, src.index_select(1, idx))


def _mixed_stats(s_old: torch.Tensor, s_new: torch.Tensor, starts: np.ndarray, ends: np.ndarray,
                 cols: np.ndarray, counts: np.ndarray, *, map_k: int, want_ap: bool) -> list[QueryStats]:
    """Statistics at every fraction; ``s_old`` becomes the mixed block (new columns copied in, in place)."""
    out, done = [], 0
    for k in counts:
        if k > done:
            copy_columns(s_old, s_new, cols[done:k])
            done = k
        out.append(_stats(s_old, starts, ends, map_k=map_k, want_ap=want_ap))
    return out


def segment_of_columns(cols: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Segment of each gallery column: the index of the first fraction at which it is backfilled.

    ``cols`` lists the columns in backfilling order. Segment i holds the columns first backfilled at
    fraction i; segment ``len(counts)`` those the grid never backfills (when it stops before 1).
    """
    position = np.empty(len(cols), np.int64)
    position[cols] = np.arange(len(cols))
    return np.searchsorted(counts, position, side="right").astype(np.int64)


@numba.njit(parallel=True, cache=True, nogil=True)
def _segment_maxima_kernel(s_old, s_new, segment, starts, ends, n_seg):  # pragma: no cover - compiled
    n, width = s_old.shape
    out = np.full((4, n, n_seg), -np.inf, np.float32)  # old positives, old negatives, new positives, new negatives
    for r in numba.prange(n):
        a = starts[r]
        b = ends[r]
        for j in range(width):
            s = segment[j]
            k = 0 if a <= j < b else 1
            v = s_old[r, j]
            if v > out[k, r, s]:
                out[k, r, s] = v
            v = s_new[r, j]
            if v > out[2 + k, r, s]:
                out[2 + k, r, s] = v
    return out


def segment_maxima(s_old: torch.Tensor, s_new: torch.Tensor, segment: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   n_seg: int, *, engine: str = "auto") -> np.ndarray:
    """Per query and segment, the best positive and the best negative similarity, old and new (-inf if none).

    Returns float32 (4, n, n_seg): old positives, old negatives, new positives, new negatives. One pass
    over both blocks: the compiled kernel on CPU (``engine="auto"``/``"numba"``), torch scatter otherwise.
    """
    if engine not in ("auto", "numba", "torch"):
        raise ValueError(f"unknown engine {engine!r}; use 'auto', 'numba' or 'torch'")
    if engine == "numba" or (engine == "auto" and s_old.device.type == "cpu"):
        return _segment_maxima_kernel(s_old.numpy(), s_new.numpy(), segment, starts.astype(np.int64), ends.astype(np.int64), n_seg)
    n, width = s_old.shape
    dev = s_old.device
    cols = torch.arange(width, device=dev)
    is_pos = (cols >= torch.as_tensor(starts, device=dev)[:, None]) & (cols < torch.as_tensor(ends, device=dev)[:, None])
    index = torch.as_tensor(segment, device=dev).expand(n, width)
    out = [torch.full((n, n_seg), -torch.inf, device=dev).scatter_reduce(1, index, sims.masked_fill(drop, -torch.inf), "amax")
           for sims in (s_old, s_new) for drop in (~is_pos, is_pos)]
    return torch.stack(out).cpu().numpy()


def _recall1_stats(s_old: torch.Tensor, s_new: torch.Tensor, starts: np.ndarray, ends: np.ndarray,
                   segment: np.ndarray, n_fractions: int, n_pos: np.ndarray) -> list[QueryStats]:
    """Recall@1 statistics at every fraction without the ranking kernel (exact).

    At fraction i, segments 0..i carry new similarities and the others old ones (see
    :func:`segment_of_columns`), so the best positive and the best negative are a prefix maximum of the
    new segment maxima joined with a suffix maximum of the old ones. The negative counts are capped at 1
    (``best negative >= / > best positive``), which is all Recall@1 reads under either tie rule; AP is
    not computed (NaN).
    """
    maxima = segment_maxima(s_old, s_new, segment, starts, ends, n_fractions + 1)

    def at_fractions(old: np.ndarray, new: np.ndarray) -> np.ndarray:
        backfilled = np.maximum.accumulate(new, axis=1)[:, :n_fractions]  # segments 0..i
        stale = np.maximum.accumulate(old[:, ::-1], axis=1)[:, ::-1][:, 1:]  # segments i+1..last
        return np.maximum(backfilled, stale)

    best, neg = at_fractions(maxima[0], maxima[2]), at_fractions(maxima[1], maxima[3])
    nan = np.full(len(n_pos), np.nan)
    return [QueryStats(n_pos, (neg[:, i] >= best[:, i]).astype(np.int64), (neg[:, i] > best[:, i]).astype(np.int64), nan, nan)
            for i in range(n_fractions)]


def backfill_curves(
    query: np.ndarray,
    query_labels: np.ndarray,
    old_gallery: np.ndarray,
    new_gallery: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    order: Sequence[int] | np.ndarray,
    fractions: Sequence[float] | np.ndarray | None = None,
    metrics: Sequence[str] = ("recall@1", "map"),
    same_set: bool = False,
    ties: Ties = "pessimistic",
    max_block: int = DEFAULT_BLOCK,  # the torch backend's default: same blocks, so the endpoints match it bit for bit
) -> dict[str, np.ndarray | int]:
    """Backfilling curves of several metrics from one pass over the queries.

    ``old_gallery`` and ``new_gallery`` embed the same items in the same row order (labels
    ``gallery_labels``); ``order`` lists the rows in backfilling order. Returns ``fractions``,
    ``n_backfilled`` (items backfilled at each fraction), one array per name in ``metrics`` (keyed by
    that name: ``recall@K``, ``map``, at most one ``map@K``), and ``n_queries``, ``n_valid`` and
    ``n_no_positive`` (the same at every fraction: exclusions are by index on both galleries).
    """
    check_features("query features", query)
    check_features("old gallery features", old_gallery)
    check_features("new gallery features", new_gallery)
    (n_old, d_old), (n_new, d_new) = np.shape(old_gallery), np.shape(new_gallery)
    if n_old != n_new:
        raise ValueError(f"the old gallery has {n_old} rows but the new gallery has {n_new}; "
                         "both must embed the same items in the same row order")
    if d_old != d_new:
        raise ValueError(f"old gallery features are {d_old}-d but new gallery features are {d_new}-d; "
                         "adapt one side (F or B) so both live in the query's space")
    check_cell(query, query_labels, old_gallery, gallery_labels, same_set=same_set)
    order = _check_order(order, n_old)
    fractions = _check_fractions(fractions)
    metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    if not metrics or not all(isinstance(m, str) for m in metrics):
        raise ValueError(f"metrics must be a non-empty list of names such as 'recall@1' or 'map', got {metrics!r}")
    parsed = [parse_metric(m, pairs=False) for m in metrics]
    ks = tuple(sorted({k for kind, k in parsed if kind == "recall"}))
    map_ks = sorted({k for kind, k in parsed if kind == "map" and k})
    if len(map_ks) > 1:
        raise ValueError(f"one mAP@k at a time, got {map_ks}")
    if ties not in ("pessimistic", "optimistic"):
        raise ValueError(f"unknown tie rule {ties!r}; use 'pessimistic' or 'optimistic'")
    map_k = map_ks[0] if map_ks else 0
    want_ap = any(kind == "map" for kind, _ in parsed)

    device = pick_device("auto")
    query_labels = np.asarray(query_labels)
    old_g = prepare_gallery(old_gallery, gallery_labels, device=device)
    new_g = prepare_gallery(new_gallery, gallery_labels, device=device)  # same labels -> same column order
    q = unit_rows(query, device)
    starts, ends = old_g.slices(query_labels)
    exclude = old_g.position if same_set else None
    counts = backfill_counts(fractions, n_old)
    cols = old_g.position[order]  # gallery column of each item, in backfilling order
    recall1_only = all(p == ("recall", 1) for p in parsed)
    segment = segment_of_columns(cols, counts) if recall1_only else None
    n_pos = ends - starts
    if exclude is not None:
        n_pos = n_pos - ((exclude >= starts) & (exclude < ends))

    parts: list[list[QueryStats]] = [[] for _ in fractions]
    blocks = zip(similarity_blocks(q, old_g, starts, ends, exclude, None, max_block),
                 similarity_blocks(q, new_g, starts, ends, exclude, None, max_block))
    for (rows, s_old), (_, s_new) in blocks:
        if recall1_only:
            block = _recall1_stats(s_old, s_new, starts[rows], ends[rows], segment, len(counts), n_pos[rows].astype(np.int64))
        else:
            block = _mixed_stats(s_old, s_new, starts[rows], ends[rows], cols, counts, map_k=map_k, want_ap=want_ap)
        for acc, stats in zip(parts, block):
            acc.append(stats)

    per_beta = [metrics_from_stats(QueryStats.concat(p), ks=ks, map_at=map_k or None, want_map=("map", None) in parsed, ties=ties)
                for p in parts]
    out: dict[str, np.ndarray | int] = {"fractions": fractions, "n_backfilled": counts}
    for name, (kind, at) in zip(metrics, parsed):
        out[name] = np.array([m[f"{kind}@{at}" if at else kind] for m in per_beta], dtype=np.float64)
    for key in ("n_queries", "n_valid", "n_no_positive"):
        out[key] = per_beta[0][key]
    return out


def backfill_curve(
    query: np.ndarray,
    query_labels: np.ndarray,
    old_gallery: np.ndarray,
    new_gallery: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    order: Sequence[int] | np.ndarray,
    fractions: Sequence[float] | np.ndarray | None = None,
    metric: str = "recall@1",
    same_set: bool = False,
    ties: Ties = "pessimistic",
) -> tuple[np.ndarray, np.ndarray]:
    """One metric's backfilling curve: ``(fractions, values)`` (default grid 0, 0.05, ..., 1)."""
    if not isinstance(metric, str):
        raise ValueError(f"metric must be one name such as 'recall@1' or 'map', got {metric!r}")
    out = backfill_curves(query, query_labels, old_gallery, new_gallery, gallery_labels, order=order,
                          fractions=fractions, metrics=(metric,), same_set=same_set, ties=ties)
    return out["fractions"], out[metric]


def _check_curve(fractions: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    f = _check_fractions(fractions)
    v = np.asarray(values, dtype=np.float64)
    if v.shape != f.shape:
        raise ValueError(f"values has shape {v.shape} but fractions has shape {f.shape}; give one value per fraction")
    return f, v


def curve_area(fractions: np.ndarray, values: np.ndarray) -> float:
    """M-tilde: the area under a backfilling curve, trapezoid rule over a grid from 0 to 1.

    It approximates E_{beta ~ U[0, 1]} M(beta) (FastFill; Paper B), so a constant curve has that
    constant as its area.
    """
    f, v = _check_curve(fractions, values)
    if f[0] != 0.0 or f[-1] != 1.0:
        raise ValueError(f"the area M-tilde averages over beta in [0, 1]; the grid runs from {f[0]} to {f[-1]}")
    return float(np.trapezoid(v, f))


def fraction_to_reach(fractions: np.ndarray, values: np.ndarray, target: float) -> float | None:
    """The smallest beta at which the curve reaches ``target`` (e.g. the new model's self-test).

    The curve is read as piecewise linear between grid points: with i the first grid point whose value
    is >= ``target``, the answer is ``fractions[i]`` when i is the first point, otherwise the beta where
    the segment from point i - 1 to point i crosses ``target``. ``None`` when no point reaches it.
    """
    f, v = _check_curve(fractions, values)
    reached = np.flatnonzero(v >= target)
    if len(reached) == 0:
        return None
    i = int(reached[0])
    if i == 0:
        return float(f[0])
    return float(f[i - 1] + (target - v[i - 1]) * (f[i] - f[i - 1]) / (v[i] - v[i - 1]))


# ---------------------------------------------------------------------------------------------- orderings

def _gallery_size(**arrays: np.ndarray | None) -> int:
    sizes = {name: len(np.asarray(a)) for name, a in arrays.items() if a is not None}
    if not sizes:
        raise ValueError("an ordering needs the gallery: pass old_gallery, new_gallery, gallery_labels or new_logits")
    if len(set(sizes.values())) > 1:
        raise ValueError("the inputs disagree on the gallery size: " + ", ".join(f"{k} has {v} rows" for k, v in sizes.items()))
    return next(iter(sizes.values()))


def _need(ordering: str, what: str, value: np.ndarray | None, meaning: str) -> np.ndarray:
    if value is None:
        raise ValueError(f"ordering {ordering!r} needs {what} ({meaning})")
    return np.asarray(value)


def _random_order(*, old_gallery, new_gallery, gallery_labels, new_logits, seed) -> np.ndarray:
    """FCT's baseline: a seeded uniform permutation."""
    n = _gallery_size(old_gallery=old_gallery, new_gallery=new_gallery, gallery_labels=gallery_labels, new_logits=new_logits)
    return np.random.default_rng(seed).permutation(n).astype(np.int64)


def class_mean_distance(old_gallery: np.ndarray, gallery_labels: np.ndarray, *, kind: str = "mse") -> np.ndarray:
    """Distance of each gallery item to the mean of its class, both in the given (old / F-adapted) space.

    The class mean is the plain mean of the features as given (not L2-normalised), over the gallery
    items of that class. ``kind="mse"``: the Euclidean distance ``||x - mu||_2`` (Paper B calls it MSE;
    ``||x - mu||^2 / d`` gives the same order). ``kind="cosine"``: ``1 - cos(x, mu)``, a zero vector having
    cosine 0 as under ``F.normalize``. An item alone in its class is its own mean: distance 0.
    """
    check_features("old gallery features", old_gallery)
    check_labels("gallery labels", gallery_labels, np.shape(old_gallery)[0])
    x = torch.as_tensor(np.asarray(old_gallery), dtype=torch.float64)
    _, inverse = np.unique(np.asarray(gallery_labels), return_inverse=True)
    idx = torch.as_tensor(inverse)
    sums = torch.zeros(int(inverse.max()) + 1, x.shape[1], dtype=torch.float64).index_add_(0, idx, x)
    means = (sums / torch.bincount(idx)[:, None])[idx]
    if kind == "mse":
        return torch.linalg.vector_norm(x - means, dim=1).numpy()
    if kind == "cosine":
        return (1.0 - torch.nn.functional.cosine_similarity(x, means, dim=1, eps=1e-12)).numpy()
    raise ValueError(f"unknown distance {kind!r}; use 'mse' or 'cosine'")


def _distance_ordering(kind: str, *, farthest_first: bool) -> Callable[..., np.ndarray]:
    name = f"distance_{kind}" + ("" if farthest_first else "_reverse")

    def ordering(*, old_gallery, new_gallery, gallery_labels, new_logits, seed) -> np.ndarray:
        feats = _need(name, "old_gallery", old_gallery, "the (forward-adapted) old gallery features")
        labels = _need(name, "gallery_labels", gallery_labels, "the class of each gallery item")
        _gallery_size(old_gallery=feats, new_gallery=new_gallery, gallery_labels=labels, new_logits=new_logits)
        far_first = np.argsort(-class_mean_distance(feats, labels, kind=kind), kind="stable").astype(np.int64)
        return far_first if farthest_first else far_first[::-1].copy()

    ordering.__doc__ = (f"{'Largest' if farthest_first else 'Smallest'} {kind} distance to the class mean first "
                        f"({'ties by lower row' if farthest_first else 'exactly the reverse of distance_' + kind}).")
    return ordering


def _confidence_order(*, old_gallery, new_gallery, gallery_labels, new_logits, seed) -> np.ndarray:
    """Lowest new-model confidence (max softmax) first; ties by lower row."""
    logits = _need("confidence", "new_logits", new_logits, "the new classifier's logits for each gallery item")
    check_features("new_logits", logits)
    if logits.shape[1] < 2:
        raise ValueError(f"new_logits needs at least 2 classes to measure confidence, got {logits.shape[1]}")
    _gallery_size(old_gallery=old_gallery, new_gallery=new_gallery, gallery_labels=gallery_labels, new_logits=logits)
    confidence = torch.softmax(torch.as_tensor(logits, dtype=torch.float64), dim=1).amax(1).numpy()
    return np.argsort(confidence, kind="stable").astype(np.int64)


ORDERINGS: dict[str, Callable[..., np.ndarray]] = {
    "random": _random_order,
    "distance_mse": _distance_ordering("mse", farthest_first=True),
    "distance_cosine": _distance_ordering("cosine", farthest_first=True),
    "distance_mse_reverse": _distance_ordering("mse", farthest_first=False),
    "distance_cosine_reverse": _distance_ordering("cosine", farthest_first=False),
    "confidence": _confidence_order,
}


def backfill_order(
    name: str,
    *,
    old_gallery: np.ndarray | None = None,
    new_gallery: np.ndarray | None = None,
    gallery_labels: np.ndarray | None = None,
    new_logits: np.ndarray | None = None,
    seed: int = 0,
) -> np.ndarray:
    """A backfilling order (a permutation of the gallery rows, first = backfilled first).

    * ``random``: seeded uniform permutation (FCT's baseline).
    * ``distance_mse`` / ``distance_cosine``: farthest from the class mean first (Paper B, Sec. 3.6 and
      App. G). Pass as ``old_gallery`` the gallery as stored before backfilling, i.e. the
      forward-adapted F(old) features when F exists; the class means are the means of those features
      over the gallery items of each class (gallery labels). See :func:`class_mean_distance`.
    * ``distance_mse_reverse`` / ``distance_cosine_reverse``: the same orders reversed (nearest first).
    * ``confidence``: lowest max-softmax of the new model's classifier first. Low confidence marks an
      item the new model places near a class boundary, where its stale embedding is most likely to be
      retrieved wrongly or to displace a positive: the same "least reliable first" idea as FastFill's
      uncertainty order and Paper B's outliers first. It is oracle-free only when ``new_logits`` come
      without re-processing the images, e.g. the new classifier applied to F(old); logits from new-model
      forward passes cost as much as the backfilling itself.
    """
    if name not in ORDERINGS:
        raise ValueError(f"unknown backfilling order {name!r}; known: {', '.join(ORDERINGS)}")
    return ORDERINGS[name](old_gallery=old_gallery, new_gallery=new_gallery, gallery_labels=gallery_labels,
                           new_logits=new_logits, seed=seed)


__all__ = ["DEFAULT_FRACTIONS", "ORDERINGS", "backfill_counts", "backfill_curve", "backfill_curves", "backfill_order",
           "class_mean_distance", "curve_area", "fraction_to_reach"]
