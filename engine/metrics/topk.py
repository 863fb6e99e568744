"""Streaming top-k search: each query's k nearest gallery items by cosine similarity, the gallery read in blocks.

Memory holds the queries, one gallery block (converted to float32 and normalised; float16 storage is fine),
one (query rows x block) similarity tile of at most ``max_tile`` entries, and the running lists (n_q x k ids and
scores): never a full similarity matrix and never the whole gallery. Every label, qrels and label-free metric of
:mod:`engine.metrics.relevance` derives from the returned :class:`TopK` ("compute the neighbours once").

Order and ties: descending similarity; items with the same similarity in the order the gallery was streamed (lower
position first), exactly as ``np.argsort(-sims, kind="stable")[:k]`` on the full matrix. ``tied_beyond[i]`` counts the
gallery items *outside* query ``i``'s list whose similarity equals the list's last score, so the metrics can apply
the engine's pessimistic rule (a non-relevant item tied with a relevant one ranks before it) at the cut as well.

Backends: ``numpy`` (default; a matrix product per tile and a compiled pass per row that keeps the top k in that
order, no torch), ``torch`` (the product and ``torch.topk`` in torch on the CPU) or ``faiss`` (``IndexFlatIP`` per
block, CPU), as :mod:`engine.metrics.search`. ``torch.topk`` and faiss return a block's top-k without the tie order
above, so a row whose k-th score ties another item of the block is recomputed from the block's similarities: every
backend gives the same lists from the same similarities (numpy's and torch's products differ by a few float32 ulps,
:mod:`engine.metrics.device`).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numba
import numpy as np

from engine.core.norms import unit_rows_np
from engine.metrics.device import one_blas_thread, torch_threads_kept
from engine.metrics.retrieval import unit_tensor_rows

if TYPE_CHECKING:
    import torch

TOPK_BACKENDS = ("numpy", "torch", "faiss")
DEFAULT_TILE = 1 << 24  # similarity entries per (query rows x block) tile: 64 MB of float32


@dataclass(frozen=True)
class TopK:
    """Each query's ``k`` nearest gallery items: ids (n_q, k) int64, scores (n_q, k) float32, tied_beyond (n_q,) int64."""

    ids: np.ndarray
    scores: np.ndarray
    tied_beyond: np.ndarray
    n_gallery: int

    @property
    def k(self) -> int:
        return self.ids.shape[1]


@numba.njit(parallel=True, cache=True, nogil=True)
def _topk_kernel(sims, k):  # pragma: no cover - compiled
    """Per row, the top ``k`` columns by descending value, lower column first among equals, and how many columns
    outside them equal the k-th value. One pass keeps a sorted list (a column enters only above the k-th value,
    since it comes after every column already listed), a second counts the ties at the cut."""
    n, width = sims.shape
    vals = np.empty((n, k), np.float32)
    cols = np.empty((n, k), np.int64)
    beyond = np.zeros(n, np.int64)
    for r in numba.prange(n):
        row = sims[r]
        v = vals[r]
        c = cols[r]
        size = 0
        for j in range(width):
            x = row[j]
            if size == k:
                if not x > v[k - 1]:
                    continue
                p = k - 1
            else:
                p = size
                size += 1
            while p > 0 and v[p - 1] < x:
                v[p] = v[p - 1]
                c[p] = c[p - 1]
                p -= 1
            v[p] = x
            c[p] = j
        last = v[k - 1]
        tied = 0
        for j in range(width):
            if row[j] == last:
                tied += 1
        for i in range(k):
            if v[i] == last:
                tied -= 1
        beyond[r] = tied
    return vals, cols, beyond


def _numpy_block_topk(sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_block_topk` of a float32 numpy tile, compiled."""
    with torch_threads_kept():
        return _topk_kernel(np.ascontiguousarray(sims, dtype=np.float32), min(k, sims.shape[1]))


def _block_topk(sims: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-k columns of each row of a tile in the stable order (position breaks ties), and ties left out at the k-th score."""
    import torch

    n, width = sims.shape
    kk = min(k, width)
    extra = min(kk + 1, width)  # one more item shows whether the k-th score ties an item outside the list
    vals, cols = torch.topk(sims, extra, dim=1, largest=True, sorted=True)
    vals_np, cols_np = vals.numpy()[:, :kk].copy(), cols.numpy()[:, :kk].astype(np.int64)
    beyond = np.zeros(n, np.int64)
    if extra > kk:
        for r in np.flatnonzero(vals.numpy()[:, kk - 1] == vals.numpy()[:, kk]):  # a tie at the cut: lowest positions first
            row = sims[r].numpy()
            order = np.argsort(-row, kind="stable")[:kk]
            cols_np[r], vals_np[r] = order, row[order]
            beyond[r] = int((row == row[order[-1]]).sum()) - int((row[order] == row[order[-1]]).sum())
    # torch.topk orders equal values arbitrarily inside the list: restore position order among ties
    order = np.lexsort((cols_np, -vals_np), axis=1)
    return np.take_along_axis(vals_np, order, 1), np.take_along_axis(cols_np, order, 1), beyond


def _merge(scores: np.ndarray, ids: np.ndarray, pos: np.ndarray, beyond: np.ndarray,
           b_scores: np.ndarray, b_ids: np.ndarray, b_pos: np.ndarray, b_beyond: np.ndarray, k: int):
    """Merge a running list with a block's list; ``pos`` (stream positions) break ties, lower first."""
    all_s = np.concatenate([scores, b_scores], 1)
    all_i = np.concatenate([ids, b_ids], 1)
    all_p = np.concatenate([pos, b_pos], 1)
    order = np.lexsort((all_p, -all_s), axis=1)[:, :k]
    new_s = np.take_along_axis(all_s, order, 1)
    last = new_s[:, -1]
    left = (all_s == last[:, None]).sum(1) - (new_s == last[:, None]).sum(1)
    old_last = scores[:, -1] if scores.shape[1] else np.full(len(scores), -np.inf, np.float32)
    new_beyond = (left + np.where(old_last == last, beyond, 0)
                  + np.where(b_scores[:, -1] == last, b_beyond, 0)).astype(np.int64)
    return new_s, np.take_along_axis(all_i, order, 1), np.take_along_axis(all_p, order, 1), new_beyond


def _faiss_block_topk(q: np.ndarray, g: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """faiss ``IndexFlatIP`` top-k of a block, rows with a tie at the cut recomputed exactly (see the docstring)."""
    import faiss

    kk = min(k, len(g))
    index = faiss.IndexFlatIP(g.shape[1])
    index.add(g)
    extra = min(len(g), kk + 1)
    vals, cols = index.search(q, extra)
    cols = cols.astype(np.int64)
    beyond = np.zeros(len(q), np.int64)
    unsure = np.flatnonzero(vals[:, kk - 1] == vals[:, extra - 1]) if extra > kk else np.zeros(0, np.int64)
    vals, cols = vals[:, :kk].copy(), cols[:, :kk].copy()
    if len(unsure):
        v, c, b = _numpy_block_topk(q[unsure] @ g.T, kk)
        vals[unsure], cols[unsure], beyond[unsure] = v, c, b
    order = np.lexsort((cols, -vals), axis=1)
    return np.take_along_axis(vals, order, 1), np.take_along_axis(cols, order, 1), beyond


def _unit(x: np.ndarray, backend: str):
    """Unit float32 rows for ``backend``: a torch tensor for "torch", else a C-ordered numpy array; a row beyond float32
    comes out NaN/inf, for the caller's check."""
    if backend == "torch":
        import torch

        return unit_tensor_rows(torch.as_tensor(x, dtype=torch.float32))
    with np.errstate(over="ignore", invalid="ignore"):
        return np.ascontiguousarray(unit_rows_np(x, np.float32))


def _tiles(q, g, step: int) -> Iterator:
    """The similarity tiles of at most ``step`` query rows against a block, of the rows' kind (numpy or torch), each
    written into one reused buffer (valid until the next tile)."""
    n_q = len(q)
    if isinstance(q, np.ndarray):
        out = np.empty((min(step, n_q), len(g)), np.float32)
        for lo in range(0, n_q, step):
            yield np.matmul(q[lo: lo + step], g.T, out=out[: min(step, n_q - lo)])
        return
    import torch

    out = torch.empty(min(step, n_q), len(g))
    for lo in range(0, n_q, step):
        yield torch.mm(q[lo: lo + step], g.T, out=out[: min(step, n_q - lo)])


def stream_topk(queries: np.ndarray, blocks: Iterable[tuple[np.ndarray, np.ndarray]], *, k: int,
                backend: str = "numpy", max_tile: int = DEFAULT_TILE) -> TopK:
    """Each query's ``k`` nearest items of a gallery given as blocks of ``(ids, vectors)`` (see the module docstring).

    ``queries`` (n_q, d) and the vectors are compared by cosine similarity; ids are any distinct integers.
    """
    if backend not in TOPK_BACKENDS:
        raise ValueError(f"unknown top-k backend {backend!r}; use one of {', '.join(TOPK_BACKENDS)}")
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    queries = np.asarray(queries)
    if queries.ndim != 2 or not np.isfinite(queries).all():
        raise ValueError(f"queries must be a finite 2-D array, got shape {queries.shape}")
    q = _unit(queries, backend)
    n_q, d = q.shape
    scores = np.zeros((n_q, 0), np.float32)
    ids = np.zeros((n_q, 0), np.int64)
    pos = np.zeros((n_q, 0), np.int64)
    beyond = np.zeros(n_q, np.int64)
    seen = 0
    for index, (b_ids, vectors) in enumerate(blocks):
        b_ids, vectors = np.asarray(b_ids), np.asarray(vectors)
        if vectors.ndim != 2 or vectors.shape[1] != d:
            raise ValueError(f"gallery block {index}: vectors are {vectors.shape[1:] or 'not'} "
                             f"{'-d' if vectors.ndim == 2 else '2-D'} but queries are {d}-d")
        if len(b_ids) != len(vectors):
            raise ValueError(f"gallery block {index}: {len(b_ids)} ids for {len(vectors)} vectors")
        if not len(vectors):
            continue
        g = _unit(vectors, backend)
        if not bool(g.isfinite().all() if backend == "torch" else np.isfinite(g).all()):
            raise ValueError(f"gallery block {index}: vectors have NaN or inf values")
        kk = min(k, len(g))
        parts = []
        if backend == "faiss":
            parts.append(_faiss_block_topk(q, g, kk))
        else:
            with one_blas_thread(backend == "numpy"):
                top = _numpy_block_topk if backend == "numpy" else _block_topk
                parts.extend(top(tile, kk) for tile in _tiles(q, g, max(1, max_tile // len(g))))
        b_scores = np.concatenate([p[0] for p in parts])
        b_cols = np.concatenate([p[1] for p in parts])
        b_beyond = np.concatenate([p[2] for p in parts])
        b_pos = b_cols + seen
        scores, ids, pos, beyond = _merge(scores, ids, pos, beyond, b_scores, b_ids.astype(np.int64)[b_cols], b_pos,
                                          b_beyond, k)
        seen += len(g)
    if seen == 0:
        raise ValueError("the gallery is empty: no block has an item")
    return TopK(ids, scores, beyond, seen)


def merge_topk(parts: Sequence[TopK], k: int) -> TopK:
    """One gallery's lists from the lists of its consecutive partitions (the same queries; partitions in stream order;
    ids are stream positions, as the rows of :func:`stream_topk`'s blocks): the block-by-block merge of
    :func:`stream_topk` applied to the partitions, so ties and ``tied_beyond`` are those of one pass over the whole."""
    if not parts:
        raise ValueError("no partition to merge")
    n_q = len(parts[0].ids)
    scores, ids, beyond = np.zeros((n_q, 0), np.float32), np.zeros((n_q, 0), np.int64), np.zeros(n_q, np.int64)
    for index, part in enumerate(parts):
        if len(part.ids) != n_q:
            raise ValueError(f"partition {index} ranks {len(part.ids)} queries, not {n_q}")
        scores, ids, _, beyond = _merge(scores, ids, ids, beyond, part.scores, part.ids, part.ids, part.tied_beyond, k)
    return TopK(ids, scores, beyond, sum(part.n_gallery for part in parts))


def array_blocks(ids: np.ndarray, vectors: np.ndarray, size: int = 65536) -> list[tuple[np.ndarray, np.ndarray]]:
    """An in-memory gallery as consecutive ``(ids, vectors)`` blocks of ``size`` rows (views, no copy)."""
    return [(ids[lo: lo + size], vectors[lo: lo + size]) for lo in range(0, len(vectors), size)]


__all__ = ["DEFAULT_TILE", "TOPK_BACKENDS", "TopK", "array_blocks", "merge_topk", "stream_topk"]
