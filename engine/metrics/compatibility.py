"""Compatibility matrices: C[t, k] = metric(queries embedded by model t, gallery embedded by model k), k <= t.

Each cell's neighbours are computed once and every requested metric is read from them. Cells whose
query and gallery features have different dimensions are *not comparable*: they are NaN and flagged
in ``MatrixResult.comparable`` (never shown as zero).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.metrics.retrieval import Protocol, Ties, cell_stats, metrics_from_stats, parse_metric


@dataclass(frozen=True)
class CellFeatures:
    """The four arrays of one model's evaluation (or of one cell)."""

    query: np.ndarray
    query_labels: np.ndarray
    gallery: np.ndarray
    gallery_labels: np.ndarray

    @staticmethod
    def of(x: "CellFeatures | Mapping[str, np.ndarray]") -> "CellFeatures":
        """Accept a CellFeatures or a mapping with keys query_features/query_labels/gallery_features/gallery_labels."""
        if isinstance(x, CellFeatures):
            return x
        return CellFeatures(x["query_features"], x["query_labels"], x["gallery_features"], x["gallery_labels"])


@dataclass(frozen=True)
class MatrixResult:
    """Matrices of several metrics over the same cells; NaN above the diagonal and where undefined."""

    values: dict[str, np.ndarray]
    valid_queries: np.ndarray  # int per cell (-1 where not computed)
    no_positive: np.ndarray  # int per cell (-1 where not computed)
    comparable: np.ndarray  # bool per cell (False above the diagonal and for dimension mismatches)


CellSource = Sequence["CellFeatures | Mapping[str, np.ndarray]"] | Callable[[int, int], CellFeatures]


def compatibility_matrices(
    source: CellSource,
    *,
    metrics: Sequence[str] = ("recall@1", "map"),
    num_models: int | None = None,
    protocol: Protocol = "instance",
    same_set: bool = False,
    ties: Ties = "pessimistic",
    backend=None,
    progress: Callable[[int, int], None] | None = None,
) -> MatrixResult:
    """All lower-triangle cells for every metric in ``metrics`` (one neighbour pass per cell).

    ``source`` is either one feature set per model (row t's queries meet column k's gallery) or a
    callable ``cell(t, k) -> CellFeatures`` (0-based) for views whose query side depends on the
    gallery model, such as PSP/LSP.
    """
    if callable(source):
        if num_models is None:
            raise ValueError("num_models is required when cells come from a callable")
        cell = source
        T = num_models
    else:
        sets = [CellFeatures.of(s) for s in source]
        T = len(sets)
        cell = lambda t, k: CellFeatures(sets[t].query, sets[t].query_labels, sets[k].gallery, sets[k].gallery_labels)  # noqa: E731
    if T < 1:
        raise ValueError("a compatibility matrix needs at least one model")
    parsed = [parse_metric(m) for m in metrics]
    ks = tuple(sorted({k for kind, k in parsed if kind == "recall"}))
    map_ks = sorted({k for kind, k in parsed if kind == "map" and k})
    if len(map_ks) > 1:
        raise ValueError(f"one mAP@k at a time, got {map_ks}")
    want_map = any(kind == "map" for kind, _ in parsed)
    want_full_map = ("map", None) in parsed
    values = {m: np.full((T, T), np.nan) for m in metrics}
    valid = np.full((T, T), -1, dtype=np.int64)
    no_pos = np.full((T, T), -1, dtype=np.int64)
    comparable = np.zeros((T, T), dtype=bool)
    cells = [(t, k) for t in range(T) for k in range(t + 1)]
    for i, (t, k) in enumerate(cells):
        c = cell(t, k)
        if np.asarray(c.query).shape[1] == np.asarray(c.gallery).shape[1]:  # otherwise not comparable: left NaN
            stats = cell_stats(c.query, c.query_labels, c.gallery, c.gallery_labels, protocol=protocol, same_set=same_set,
                               map_k=map_ks[0] if map_ks else 0, want_ap=want_map, backend=backend, top_k=max(ks, default=1))
            out = metrics_from_stats(stats, ks=ks, map_at=map_ks[0] if map_ks else None, want_map=want_full_map, ties=ties)
            for name, (kind, at) in zip(metrics, parsed):
                values[name][t, k] = out[f"{kind}@{at}" if at else kind]
            valid[t, k], no_pos[t, k], comparable[t, k] = out["n_valid"], out["n_no_positive"], True
        if progress:
            progress(i + 1, len(cells))
    return MatrixResult(values, valid, no_pos, comparable)


def compatibility_matrix(source: CellSource, *, metric: str = "recall@1", protocol: Protocol = "instance",
                         same_set: bool = False, **kwargs) -> np.ndarray:
    """One metric's T x T matrix (NaN above the diagonal and for non-comparable cells)."""
    return compatibility_matrices(source, metrics=(metric,), protocol=protocol, same_set=same_set, **kwargs).values[metric]
