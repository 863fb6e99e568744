"""Retrieval metrics of one (query, gallery) cell: Recall@k (= CMC top-k), mAP, mAP@k.

Features are compared by cosine similarity (both sides L2-normalised). The neighbours of a cell are
computed once (:func:`cell_stats`) and every metric is derived from the same per-query statistics.

Gallery kinds (``gallery_kind``; the run's closed/open-set "protocol" is another thing):
* ``instance`` (default): every gallery image is a gallery item.
* ``template``: the gallery is one template per class, the L2-normalised mean of that class's
  L2-normalised features, as in the IAM-CL2R code (``image2template_feature``).

``same_set=True`` means the query set *is* the gallery set (row ``i`` of both is the same image):
the query's own image is excluded from the gallery by index. With templates, the query's own class
template is recomputed without its image (leave-one-out); a class with one image then has no
positive for that query.

Queries whose class has no positive in the gallery are counted (``n_no_positive``) and left out of
the averages; the averages are over the ``n_valid`` remaining queries.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from engine.core.norms import EPS, unit_rows_np
from engine.core.kinds import TREC_RANK_TIES, check_rank_ties
from engine.metrics.ranking import QueryStats, stats_numba, stats_torch
from engine.metrics.search import DEFAULT_BLOCK, Backend, pick_backend
from engine.metrics.validate import check_cell
from engine.core.vocab import GALLERY_KINDS
from engine.core.vocab import VERIFICATION, parse_metric

if TYPE_CHECKING:
    import torch

GalleryKind = Literal["instance", "template"]
# how a negative that ties the best positive ranks (Recall@k, engine.core.kinds.RANK_TIES); not the ECC tie rule
# (engine.core.kinds.TIES). "trec": trec_eval's order, equal scores by item id descending (string compare); it needs
# the ids, so it applies to top-k lists (engine.metrics.relevance), not to the counts of a full ranking
RankTies = Literal["pessimistic", "optimistic", "trec"]


@dataclass(frozen=True)
class Gallery:
    """A gallery ready for search: unit-norm features sorted by label, and each class's column range."""

    features: Any  # (n, d) float32, rows sorted by label: a numpy array, or a tensor on the search's torch device
    labels: np.ndarray  # (n,) sorted labels
    position: np.ndarray  # position[i] = column of the caller's gallery row i (-1 if none)
    classes: np.ndarray  # sorted distinct labels
    starts: np.ndarray
    ends: np.ndarray

    def slices(self, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Column range of the positives of each query label (empty when the class is absent)."""
        idx = np.clip(np.searchsorted(self.classes, labels), 0, len(self.classes) - 1)
        present = self.classes[idx] == labels
        return np.where(present, self.starts[idx], 0).astype(np.int64), np.where(present, self.ends[idx], 0).astype(np.int64)


def unit_rows(x: np.ndarray, device: torch.device | None = None) -> Any:
    """Rows of ``x`` as float32, scaled to unit L2 norm without overflow (zero rows stay zero): a numpy array when
    ``device`` is None (:func:`engine.core.norms.unit_rows_np`), else a tensor on ``device``."""
    if device is None:
        return unit_rows_np(x, np.float32)
    import torch

    return unit_tensor_rows(torch.as_tensor(np.asarray(x), dtype=torch.float32, device=device))


def unit_tensor_rows(t: torch.Tensor) -> torch.Tensor:
    """``F.normalize(t, dim=1)`` (bit for bit), except that rows whose norm overflows (near the float32 maximum) or underflows
    are first divided by their max-abs (engine.core.norms): they keep their direction instead of becoming 0."""
    import torch

    norm = torch.linalg.vector_norm(t, dim=1, keepdim=True)
    bad = ~torch.isfinite(norm) | (norm < EPS)
    if bool(bad.any()):
        scale = t.abs().amax(dim=1, keepdim=True)
        usable = bad & torch.isfinite(scale) & (scale > 0)
        t = torch.where(usable, t / torch.where(usable, scale, torch.ones_like(scale)), t)
        norm = torch.linalg.vector_norm(t, dim=1, keepdim=True)
    return t / norm.clamp_min(EPS)  # as F.normalize computes it


def _unit(x: Any) -> Any:
    """:func:`unit_rows` of rows already in place (a numpy array or a tensor)."""
    return unit_rows_np(x) if isinstance(x, np.ndarray) else unit_tensor_rows(x)


def _take(x: Any, rows: np.ndarray) -> Any:
    """The rows ``rows`` (a numpy index) of a numpy array or a tensor."""
    if isinstance(x, np.ndarray):
        return x[rows]
    import torch

    return x[torch.as_tensor(rows, device=x.device)]


def _class_sums(feats: Any, index: np.ndarray, n: int) -> Any:
    """Row ``c`` = the sum of the rows of ``feats`` whose ``index`` is ``c``, added in row order, of ``feats``' kind."""
    if isinstance(feats, np.ndarray):
        sums = np.zeros((n, feats.shape[1]), feats.dtype)
        np.add.at(sums, index, feats)
        return sums
    import torch

    return torch.zeros(n, feats.shape[1], device=feats.device).index_add_(0, torch.as_tensor(index, device=feats.device), feats)


def prepare_gallery(gallery: np.ndarray, labels: np.ndarray, *, gallery_kind: GalleryKind = "instance",
                    device: torch.device | str | None = None) -> Gallery:
    """Normalise, (optionally) average into class templates, and sort a gallery by label (numpy when ``device`` is None)."""
    feats = unit_rows(gallery, device)
    labels = np.asarray(labels)
    if gallery_kind == "template":
        classes, inverse = np.unique(labels, return_inverse=True)
        sums = _class_sums(feats, inverse, len(classes))
        return Gallery(_unit(sums), classes, np.full(len(labels), -1), classes, np.arange(len(classes)), np.arange(1, len(classes) + 1))
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    classes = np.unique(sorted_labels)
    position = np.empty(len(labels), np.int64)
    position[order] = np.arange(len(labels))
    starts = np.searchsorted(sorted_labels, classes, side="left")
    ends = np.searchsorted(sorted_labels, classes, side="right")
    return Gallery(_take(feats, order), sorted_labels, position, classes, starts, ends)


def _loo_template_sims(query: Any, query_labels: np.ndarray, gallery: np.ndarray, gallery_labels: np.ndarray, g: Gallery) -> Any:
    """Similarity of each query to its own class template with its own image left out (-inf if empty)."""
    device = None if isinstance(query, np.ndarray) else query.device
    feats = unit_rows(gallery, device)
    idx = np.searchsorted(g.classes, gallery_labels)
    sums = _class_sums(feats, idx, len(g.classes))
    counts = np.bincount(idx, minlength=len(g.classes))
    sims = (query * _unit(_take(sums, idx) - feats)).sum(1)
    if device is None:
        return np.where(counts[idx] > 1, sims, np.float32(-np.inf))
    import torch

    return torch.where(torch.as_tensor(counts[idx] > 1, device=device), sims, torch.full_like(sims, -torch.inf))


def cell_stats(
    query: np.ndarray,
    query_labels: np.ndarray,
    gallery: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    gallery_kind: GalleryKind = "instance",
    same_set: bool = False,
    map_k: int = 0,
    want_ap: bool = True,
    backend: Backend | str | None = None,
    top_k: int = 1,
    max_block: int = DEFAULT_BLOCK,
) -> QueryStats:
    """One neighbour pass over a cell: per-query statistics in the caller's query order.

    ``top_k`` is the largest k a Recall@k will be asked of these statistics (used by top-k backends).
    """
    check_cell(query, query_labels, gallery, gallery_labels, same_set=same_set)
    if gallery_kind not in GALLERY_KINDS:
        raise ValueError(f"unknown gallery kind {gallery_kind!r}; use 'instance' or 'template'")
    be = pick_backend(backend, need_ranking=want_ap or map_k > 0, k=top_k)
    query_labels = np.asarray(query_labels)
    g = prepare_gallery(gallery, gallery_labels, gallery_kind=gallery_kind, device=be.device)
    q = unit_rows(query, be.device)
    starts, ends = g.slices(query_labels)
    loo = None
    if same_set and gallery_kind == "template":
        loo = _loo_template_sims(q, query_labels, gallery, np.asarray(gallery_labels), g)
    exclude = g.position if (same_set and gallery_kind == "instance") else None
    return be.stats(q, g, starts, ends, exclude=exclude, own_template=loo, map_k=map_k, want_ap=want_ap, max_block=max_block)


def per_query_from_stats(stats: QueryStats, *, ks: tuple[int, ...] = (1, 5), map_at: int | None = None,
                         want_map: bool = True, rank_ties: RankTies = "pessimistic") -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per-query outcomes of one cell: ``(valid, {"recall@k": hit (bool), "map": AP, "map@k": AP@k})``.

    ``valid`` marks the queries with a positive in the gallery; the vectors cover every query in the
    caller's order (hits are False and APs NaN where not valid). Averaging them over ``valid`` gives
    :func:`metrics_from_stats`; a paired test compares two cells' vectors query by query.
    """
    if rank_ties == TREC_RANK_TIES:
        raise ValueError("the trec tie order ranks equal scores by item id, which a full ranking's counts do not hold; "
                         "it applies to top-k lists (check-upgrade --old-gallery ... --rank-ties trec)")
    valid = stats.n_positives > 0
    before = stats.neg_ge_best if check_rank_ties(rank_ties) == "pessimistic" else stats.neg_gt_best
    out: dict[str, np.ndarray] = {f"recall@{k}": valid & (before < k) for k in ks}
    if want_map:
        out["map"] = np.where(valid, stats.ap, np.nan)
    if map_at:
        out[f"map@{map_at}"] = np.where(valid, stats.ap_at_k, np.nan)
    return valid, out


def metrics_from_stats(stats: QueryStats, *, ks: tuple[int, ...] = (1, 5), map_at: int | None = None, want_map: bool = True, rank_ties: RankTies = "pessimistic") -> dict[str, float | int]:
    """Average the per-query statistics into Recall@k, mAP and mAP@k over the valid queries."""
    valid, vectors = per_query_from_stats(stats, ks=ks, map_at=map_at, want_map=want_map, rank_ties=rank_ties)
    n_valid = int(valid.sum())
    out: dict[str, float | int] = {name: float(v[valid].mean()) if n_valid else float("nan") for name, v in vectors.items()}
    out["n_queries"] = int(len(valid))
    out["n_valid"] = n_valid
    out["n_no_positive"] = int(len(valid) - n_valid)
    return out


def retrieval_metrics(
    query: np.ndarray,
    query_labels: np.ndarray,
    gallery: np.ndarray,
    gallery_labels: np.ndarray,
    *,
    ks: tuple[int, ...] = (1, 5),
    map_at: int | None = None,
    gallery_kind: GalleryKind = "instance",
    same_set: bool = False,
    rank_ties: RankTies = "pessimistic",
    compute_map: bool = True,
    backend: Backend | str | None = None,
) -> dict[str, float | int]:
    """Recall@k for each k, mAP (full ranking) and optionally mAP@``map_at`` of one cell.

    Returns fractions in [0, 1] plus ``n_queries``, ``n_valid`` and ``n_no_positive``.
    """
    ks = tuple(int(k) for k in ks)
    if any(k < 1 for k in ks):
        raise ValueError(f"every k must be >= 1, got {ks}")
    stats = cell_stats(query, query_labels, gallery, gallery_labels, gallery_kind=gallery_kind, same_set=same_set,
                       map_k=map_at or 0, want_ap=compute_map or bool(map_at), backend=backend,
                       top_k=max(ks, default=1))
    return metrics_from_stats(stats, ks=ks, map_at=map_at, want_map=compute_map, rank_ties=rank_ties)


__all__ = ["Gallery", "prepare_gallery", "cell_stats", "metrics_from_stats", "per_query_from_stats", "VERIFICATION", "retrieval_metrics", "parse_metric",
           "GALLERY_KINDS", "stats_numba", "stats_torch"]
