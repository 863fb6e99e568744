"""Search backends: who computes the neighbours of a cell.

* ``numpy``: the queries in blocks of rows; each block's similarities to the whole gallery are one
  matrix product (numpy's BLAS) written into a buffer that is reused from block to block, and the per-query
  statistics come from the compiled CPU kernels while the block is still in cache. Exact for every metric;
  loads no torch.
* ``torch``: the same blocks as tensors on a torch device; the statistics from the compiled kernels on the
  CPU, from torch on CUDA.
* ``faiss``: ``IndexFlatIP`` top-k search (GPU index when ``faiss.get_num_gpus() > 0``), for
  Recall@k-only requests. The best positive's similarity is computed exactly per class; queries
  whose top-k list ends in a tie with it are recomputed by the numpy backend, so both backends
  give the same hits.

``pick_backend(None)`` ("auto") picks torch on CUDA when the process has already loaded torch and it sees a GPU
(:func:`engine.metrics.device.auto_device`), faiss for a Recall-only request when the process has already loaded
faiss and only faiss sees a GPU, and numpy otherwise. On the CPU numpy and torch give the same statistics up to the
summation order of the product (a few float32 ulps) at the same speed, and the block product plus the counting pass
costs less than faiss's top-1 search even for Recall@1 alone (``bench/bench_metrics.py``); numpy and torch are the
only ones that give AP.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from typing import Protocol as TypingProtocol

import numpy as np

from engine.core.vocab import RANK_TIE_TOLERANCE
from engine.metrics.device import auto_device, host, on_cpu, one_blas_thread, torch_device
from engine.metrics.ranking import QueryStats, stats_numba, stats_torch

if TYPE_CHECKING:
    import torch

BACKENDS = ("auto", "numpy", "torch", "faiss")
# similarity entries per block of query rows (16 MB of float32): small enough that the ranking pass
# reads the block from cache right after the matrix product wrote it
DEFAULT_BLOCK = 1 << 22


class Backend(TypingProtocol):
    device: torch.device | None  # None: numpy arrays on the CPU
    name: str

    def stats(self, q: Any, g, starts: np.ndarray, ends: np.ndarray, *, exclude: np.ndarray | None,
              own_template: Any, map_k: int, want_ap: bool, max_block: int) -> QueryStats: ...


def similarity_blocks(q: Any, g, starts: np.ndarray, ends: np.ndarray, exclude: np.ndarray | None,
                      own_template: Any, max_block: int) -> Iterator[tuple[slice, Any]]:
    """``(rows, sims)`` for consecutive blocks of query rows, each holding at most ``max_block`` similarities.

    ``q`` and ``g.features`` are numpy arrays or tensors on one device; ``sims`` is of the same kind. Every block
    is written into one buffer, so ``sims`` is valid until the next block is produced. Callers that use the same
    ``max_block`` get the same blocks, hence bit-identical similarities.
    """
    n, width = q.shape[0], g.features.shape[0]
    step = max(1, max_block // max(width, 1))
    if isinstance(q, np.ndarray):
        buffer = np.empty((min(step, n), width), np.float32)
    else:
        import torch

        buffer = torch.empty(min(step, n), width, device=q.device)
    for lo in range(0, n, step):
        rows = slice(lo, min(n, lo + step))
        yield rows, block_similarities(q, g, rows, starts, ends, exclude, own_template, out=buffer)


def block_similarities(q: Any, g, rows: slice, starts: np.ndarray, ends: np.ndarray, exclude: np.ndarray | None,
                       own_template: Any, out: Any) -> Any:
    """Similarities of a block of queries to the whole gallery, with exclusions applied.

    ``out`` is a reusable (rows, width) buffer of the queries' kind; the block is written into its first rows.
    """
    block = q[rows]
    if isinstance(q, np.ndarray):
        sims = np.matmul(block, g.features.T, out=out[: len(block)])
        local = np.arange(sims.shape[0])
        if exclude is not None:
            sims[local, exclude[rows]] = -np.inf
        if own_template is not None:
            has = ends[rows] > starts[rows]
            sims[local[has], starts[rows][has]] = own_template[rows][has]
        return sims
    import torch

    sims = torch.mm(block, g.features.T, out=out[: len(block)])
    local = torch.arange(sims.shape[0], device=sims.device)
    if exclude is not None:
        sims[local, torch.as_tensor(exclude[rows], device=sims.device)] = -torch.inf
    if own_template is not None:
        has = torch.as_tensor(ends[rows] > starts[rows], device=sims.device)
        cols = torch.as_tensor(starts[rows], device=sims.device)
        sims[local[has], cols[has]] = own_template[rows][has]
    return sims


class NumpyBackend:
    """Exact statistics from chunked similarity blocks, numpy on the CPU (no torch)."""

    name = "numpy"
    device = None

    def stats(self, q, g, starts, ends, *, exclude, own_template, map_k, want_ap, max_block) -> QueryStats:
        return _block_stats(q, g, starts, ends, exclude, own_template, map_k, want_ap, max_block)


class TorchBackend:
    """Exact statistics from chunked similarity blocks (CPU or CUDA)."""

    name = "torch"

    def __init__(self, device: str | torch.device = "auto"):
        self.device = torch_device(device)

    def stats(self, q, g, starts, ends, *, exclude, own_template, map_k, want_ap, max_block) -> QueryStats:
        return _block_stats(q, g, starts, ends, exclude, own_template, map_k, want_ap, max_block)


def _block_stats(q, g, starts, ends, exclude, own_template, map_k, want_ap, max_block) -> QueryStats:
    """The statistics of every block: the compiled kernels on host arrays, torch on CUDA."""
    parts = []
    with one_blas_thread(isinstance(q, np.ndarray)):
        for rows, sims in similarity_blocks(q, g, starts, ends, exclude, own_template, max_block):
            if on_cpu(sims):
                parts.append(stats_numba(host(sims), starts[rows], ends[rows], map_k=map_k, want_ap=want_ap))
            else:
                import torch

                parts.append(stats_torch(sims, torch.as_tensor(starts[rows]), torch.as_tensor(ends[rows]), map_k=map_k,
                                         want_ap=want_ap))
    return QueryStats.concat(parts) if parts else stats_numba(np.zeros((0, g.features.shape[0]), np.float32), starts, ends)


class FaissBackend:
    """Top-k search with faiss ``IndexFlatIP`` for Recall@k-only requests."""

    name = "faiss"

    def __init__(self, k: int = 1):
        import faiss  # noqa: F401  (fails early when faiss is missing)

        self.device = None  # numpy arrays in; the index moves them where faiss computes
        self.k = k

    def _index(self, feats: np.ndarray):
        import faiss

        index = faiss.IndexFlatIP(feats.shape[1])
        if faiss.get_num_gpus() > 0:
            index = faiss.index_cpu_to_all_gpus(index)
        index.add(feats)
        return index

    def stats(self, q, g, starts, ends, *, exclude, own_template, map_k, want_ap, max_block) -> QueryStats:
        if want_ap or map_k:
            return NumpyBackend().stats(q, g, starts, ends, exclude=exclude, own_template=own_template,
                                        map_k=map_k, want_ap=want_ap, max_block=max_block)
        qn, gn = q, g.features
        n, width = qn.shape[0], gn.shape[0]
        # one item beyond k (and the query's own image) shows whether the list ends inside a tie
        kk = min(width, self.k + 1 + (1 if exclude is not None else 0))
        sims, idx = self._index(gn).search(qn, kk)
        in_pos = (idx >= starts[:, None]) & (idx < ends[:, None])
        is_self = (idx == exclude[:, None]) if exclude is not None else np.zeros_like(in_pos)
        neg = ~in_pos & ~is_self & (idx >= 0)
        if own_template is not None:
            best = own_template.astype(np.float32)
        else:
            # the first positive of a descending list is the best positive; compute it only where none is listed
            listed = in_pos & ~is_self
            has = listed.any(1)
            best = np.where(has, sims[np.arange(n), listed.argmax(1)], -np.inf).astype(np.float32)
            rows = np.flatnonzero(~has & (ends > starts))
            if len(rows):
                best[rows] = _best_positive(q[rows], g, starts[rows], ends[rows],
                                            None if exclude is None else exclude[rows])
        neg_ge = (neg & (sims >= best[:, None])).sum(1)
        neg_gt = (neg & (sims > best[:, None])).sum(1)
        wide = best.astype(np.float64)[:, None]
        top, bottom = wide + RANK_TIE_TOLERANCE, wide - RANK_TIE_TOLERANCE
        above = (neg & (sims > top)).sum(1)
        near = (neg & (sims >= bottom) & (sims <= top)).sum(1)
        pos_near = (in_pos & ~is_self & (sims >= bottom)).sum(1)
        n_pos = ends - starts - (((exclude >= starts) & (exclude < ends)) if exclude is not None else 0)
        if own_template is not None:
            n_pos = np.where(np.isfinite(own_template), n_pos, 0)
            pos_near = (n_pos > 0).astype(np.int64)  # the query's own class template is its one positive
        pos_near = np.where(n_pos > 0, np.maximum(pos_near, 1), 0)  # the best positive, listed or not (then unsure)
        # a list that is full down to the best positive (less the tie tolerance) may hide tied or higher negatives
        # and tied positives: recompute exactly
        unsure = (n_pos > 0) & (above < self.k) & (sims[:, -1] >= bottom[:, 0]) & (kk < width)
        as_int = lambda a: np.asarray(a, np.int64)  # noqa: E731
        stats = QueryStats(as_int(n_pos), as_int(neg_ge), as_int(neg_gt), np.full(n, np.nan), np.full(n, np.nan),
                           as_int(above), as_int(near), as_int(pos_near))
        if unsure.any():
            rows = np.flatnonzero(unsure)
            exact = NumpyBackend().stats(q[rows], g, starts[rows], ends[rows],
                                         exclude=None if exclude is None else exclude[rows],
                                         own_template=None if own_template is None else own_template[rows],
                                         map_k=0, want_ap=False, max_block=max_block)
            for f in ("n_positives", "neg_ge_best", "neg_gt_best", "neg_above", "neg_tied", "pos_tied"):
                getattr(stats, f)[rows] = getattr(exact, f)
        return stats


def _best_positive(q, g, starts, ends, exclude) -> np.ndarray:
    """Exact similarity of each query's best positive (-inf without one), one class at a time."""
    best = np.full(q.shape[0], -np.inf, dtype=np.float32)
    for s, e in {(int(s), int(e)) for s, e in zip(starts, ends) if e > s}:
        rows = np.flatnonzero((starts == s) & (ends == e))
        sims = q[rows] @ g.features[s:e].T
        if exclude is not None:
            own = exclude[rows] - s
            inside = (own >= 0) & (own < e - s)
            sims[np.flatnonzero(inside), own[inside]] = -np.inf
        best[rows] = sims.max(1)
    return best


def _faiss_gpus() -> int:
    try:
        import faiss
    except ImportError:
        return 0
    return faiss.get_num_gpus()


def pick_backend(backend: "Backend | str | None", *, need_ranking: bool, k: int = 1) -> Backend:
    """Resolve a backend name; ``None``/"auto" as the module docstring says (numpy unless a loaded library sees a GPU)."""
    if backend is not None and not isinstance(backend, str):
        return backend
    name = backend or "auto"
    if name not in BACKENDS:
        raise ValueError(f"unknown search backend {name!r}; use one of {', '.join(BACKENDS)}")
    if name == "auto":
        device = auto_device()
        if device is not None:
            return TorchBackend(device)
        name = "faiss" if not need_ranking and "faiss" in sys.modules and _faiss_gpus() > 0 else "numpy"
    if name == "numpy":
        return NumpyBackend()
    if name == "faiss":
        try:
            return FaissBackend(k)
        except ImportError:
            raise ValueError("search backend 'faiss' was requested but faiss is not installed") from None
    return TorchBackend("auto")
