"""A stored run's per-item outcomes, recomputed from its stored features, for the hierarchical interval.

A stored matrix keeps each cell's value, not its per-query (or per-pair) outcomes; the features it was computed from
are stored, so the outcomes are recomputed here with the pass that gives the cell's value
(:func:`engine.metrics.compatibility.cell_outcomes`). One experiment (one seed) becomes one
:class:`engine.metrics.hierarchical.SeedItems`: a row per test image (queries) or per verification pair, a column per
lower-triangle cell (:func:`engine.metrics.hierarchical.matrix_columns`), NaN where a row is not in a cell (a query
of a class the gallery model has not seen under ``eval_classes = seen``). Pairs carry the test images they compare,
in one id space over the cells, so the bootstrap resamples images and pairs stay clustered by image.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from sqlalchemy import Engine

from engine.core.cell import cell_features
from engine.core.contract import DERIVED_VIEWS, same_set_of
from engine.metrics.cell_interval import pair_images
from engine.metrics.compatibility import CellFeatures, cell_outcomes
from engine.metrics.hierarchical import SeedItems, matrix_columns
from engine.metrics.retrieval import VERIFICATION, parse_metric
from storage import get_experiment, list_model_versions, load_feature_set, session_scope


def experiment_same_set(db: Engine, experiment_id: int) -> bool:
    """Whether a stored run's queries are its gallery images (closed set) or other images (open set)."""
    with session_scope(db) as s:
        return same_set_of(get_experiment(s, experiment_id).config)


def cell_source(db: Engine, experiment_id: int, *, view: str, eval_classes: str,
                topk: int | None = None) -> tuple[int, Callable[[int, int], CellFeatures]]:
    """The number of models and ``cell(t, k)`` of a stored experiment: model t's query split as queries, model k's
    gallery split as the gallery (closed set: both the test images; the run's own cells: classes ``0 .. C^k - 1``
    after remapping; PSP/LSP keep the first C^k outputs), ``query_ids`` the query image of each query row."""
    with session_scope(db) as s:
        versions = list_model_versions(s, experiment_id)
    raw = DERIVED_VIEWS.get(view, view)
    cache: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}

    def load(i: int, split: str) -> tuple[np.ndarray, np.ndarray]:
        if (i, split) not in cache:
            with session_scope(db) as s:
                cache[(i, split)] = load_feature_set(s, versions[i].id, split, raw)[:2]
        return cache[(i, split)]

    def cell(t: int, k: int) -> CellFeatures:
        ck = len(versions[k].classes)
        (q, ql), (g, gl) = load(t, "query"), load(k, "gallery")
        ids = np.arange(len(ql))
        if eval_classes == "seen":
            qm, gm = ql < ck, gl < ck
            q, ql, g, gl, ids = q[qm], ql[qm], g[gm], gl[gm], ids[qm]
        q, g = cell_features({raw: q}, {raw: g}, view, columns=ck, topk=topk)
        return CellFeatures(q, ql, g, gl, query_ids=ids)

    return len(versions), cell


def seed_items(db: Engine, experiment_id: int, *, view: str, metric: str, gallery: str, eval_classes: str,
               topk: int | None = None) -> tuple[SeedItems, np.ndarray]:
    """The experiment's per-item outcomes (module docstring) and the T x T matrix of their means (the cells' values)."""
    T, cell = cell_source(db, experiment_id, view=view, eval_classes=eval_classes, topk=topk)
    return items_from_cells(T, cell, metric=metric, gallery=gallery, same_set=experiment_same_set(db, experiment_id))


def items_from_cells(T: int, cell: Callable[[int, int], CellFeatures], *, metric: str,
                     gallery: str = "instance", same_set: bool = True) -> tuple[SeedItems, np.ndarray]:
    """:func:`seed_items` for any ``cell(t, k)`` (``query_ids``: the query images' ids; every lower-triangle cell
    comparable). ``same_set``: the queries are the gallery images (closed set, one id space); else (open set) the
    gallery images get their own ids after the queries', so a pair names its two images in one id space."""
    columns = matrix_columns(T)
    pairs = parse_metric(metric)[0] == VERIFICATION
    C = np.full((T, T), np.nan)
    per_cell: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    n_images = 0
    for (t, k) in columns:
        c = cell(t, k)
        if np.asarray(c.query).shape[1] != np.asarray(c.gallery).shape[1]:
            raise ValueError(f"cell ({t + 1}, {k + 1}) is not comparable: no per-item outcomes")
        C[t, k], vec = cell_outcomes(c, metric, gallery_kind=gallery, same_set=same_set)
        ids = np.arange(len(c.query_labels)) if c.query_ids is None else np.asarray(c.query_ids, np.int64)
        n_images = max(n_images, int(ids.max()) + 1 if len(ids) else 0)
        if pairs and same_set:
            rows = ids[pair_images(c.query_labels, c.gallery_labels, same_set=True)]
        elif pairs:  # query image ids, then the gallery's after every query id (pair_images offsets by the queries)
            qg = pair_images(c.query_labels, c.gallery_labels, same_set=False)
            rows = np.stack([ids[qg[:, 0]], n_images + qg[:, 1] - len(c.query_labels)], axis=1)
        else:
            rows = ids
        per_cell[(t, k)] = (rows, vec)
    if not pairs:  # a row per test image
        x = np.full((n_images, len(columns)), np.nan)
        for cell_, (rows, vec) in per_cell.items():
            x[rows, columns[cell_]] = vec
        return SeedItems(x), C
    groups: dict[bytes, list[tuple[int, int]]] = {}  # cells that drew the same pairs share rows
    for cell_, (rows, _) in per_cell.items():
        groups.setdefault(rows.tobytes() + bytes(str(rows.shape), "ascii"), []).append(cell_)
    blocks, images = [], []
    for cells in groups.values():
        rows = per_cell[cells[0]][0]
        x = np.full((len(rows), len(columns)), np.nan)
        for cell_ in cells:
            x[:, columns[cell_]] = per_cell[cell_][1]
        blocks.append(x)
        images.append(rows)
    return SeedItems(np.concatenate(blocks), np.concatenate(images)), C
