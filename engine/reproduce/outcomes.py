"""A stored run's per-item outcomes, recomputed from its stored features, for the hierarchical interval.

A stored matrix keeps each cell's value, not its per-query (or per-pair) outcomes; the features it was computed from
are stored, so the outcomes are recomputed here with the pass that gives the cell's value
(:func:`engine.metrics.compatibility.cell_outcomes`). One experiment (one seed) becomes one
:class:`engine.metrics.hierarchical.SeedItems`: a row per test image (queries) or per verification pair, a column per
lower-triangle cell (:func:`engine.metrics.hierarchical.matrix_columns`), NaN where a row is not in a cell (a query
of a class the gallery model has not seen under ``eval_classes = seen``). Pairs carry the test images they compare,
in one id space over the cells, so the bootstrap resamples images and pairs stay clustered by image.

A *part* keeps one kind of item per cell, NaN elsewhere (:data:`PARTS`): ``trained``, the queries (pairs: both
images) of classes both models of the cell learned; ``untrained``, the others (a class one of them never learned).
A part's cell value is the mean of its items' outcomes (verification: the pairs' outcomes under the thresholds the
whole cell chose). Each model's training accuracy is read from its stored logits of the ``train`` split (training
images of every trained class that every model embeds, ``eval.train_features_per_class`` per class).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from sqlalchemy import Engine

from engine.core.cell import cell_features
from engine.core.contract import DERIVED_VIEWS, same_set_of
from engine.metrics.cell_interval import pair_images
from engine.metrics.compatibility import CellFeatures, cell_outcomes
from engine.metrics.hierarchical import SeedItems, matrix_columns
from engine.metrics.retrieval import VERIFICATION, parse_metric
from engine.metrics.verification import sample_pairs
from engine.reproduce.claims import PARTS
from storage import get_experiment, list_model_versions, load_feature_set, session_scope



def experiment_same_set(db: Engine, experiment_id: int) -> bool:
    """Whether a stored run's queries are its gallery images (closed set) or other images (open set)."""
    with session_scope(db) as s:
        return same_set_of(get_experiment(s, experiment_id).config)


def learned_classes(db: Engine, experiment_id: int) -> list[int]:
    """How many classes each model of a stored experiment learned (``0 .. C^t - 1`` after remapping), in step order."""
    with session_scope(db) as s:
        return [len(v.classes) for v in list_model_versions(s, experiment_id)]


def training_accuracy(db: Engine, experiment_id: int) -> list[float]:
    """Each model's top-1 accuracy (argmax of its stored logits over all its outputs) on the stored training images
    of the classes it learned; NaN where the run stored no ``train`` split."""
    out = []
    with session_scope(db) as s:
        for v in list_model_versions(s, experiment_id):
            try:
                logits, labels = load_feature_set(s, v.id, "train", "logits")[:2]
            except ValueError:  # no train split stored (eval.train_features_per_class = 0)
                out.append(float("nan"))
                continue
            mine = np.asarray(labels) < len(v.classes)
            hits = np.asarray(logits)[mine].argmax(axis=1) == np.asarray(labels)[mine]
            out.append(float(hits.mean()) if mine.any() else float("nan"))
    return out


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

    def cell(t: int, k: int, *, gallery_model: int | None = None) -> CellFeatures:
        """Model t's queries, model k's classes (under seen) and columns; the gallery embedded by ``gallery_model``
        (default k): ``cell(t, k, gallery_model=t)`` is model t's self-test on the items cross-test (t, k) counts."""
        ck = len(versions[k].classes)
        (q, ql), (g, gl) = load(t, "query"), load(k if gallery_model is None else gallery_model, "gallery")
        ids = np.arange(len(ql))
        if eval_classes == "seen":
            qm, gm = ql < ck, gl < ck
            q, ql, g, gl, ids = q[qm], ql[qm], g[gm], gl[gm], ids[qm]
        q, g = cell_features({raw: q}, {raw: g}, view, columns=ck, topk=topk)
        return CellFeatures(q, ql, g, gl, query_ids=ids)

    return len(versions), cell


def seed_items(db: Engine, experiment_id: int, *, view: str, metric: str, gallery: str, eval_classes: str,
               topk: int | None = None, part: str | None = None, rank_ties: str = "pessimistic"
               ) -> tuple[SeedItems, np.ndarray]:
    """The experiment's per-item outcomes (module docstring; ``part``: one kind of item, :data:`PARTS`; ``rank_ties``:
    Recall@k's tie rule) and the T x T matrix of their means (the cells' values)."""
    T, cell = cell_source(db, experiment_id, view=view, eval_classes=eval_classes, topk=topk)
    classes = learned_classes(db, experiment_id) if part is not None else None
    return items_from_cells(T, cell, metric=metric, gallery=gallery, same_set=experiment_same_set(db, experiment_id),
                            part=part, classes=classes, rank_ties=rank_ties)


def own_gain(db: Engine, experiment_id: int, cell: tuple[int, int], *, view: str, metric: str, gallery: str,
             eval_classes: str, part: str | None = None, rank_ties: str = "pessimistic") -> float:
    """The upgrade's own gain behind cross-test ``cell`` = (t, k): model t's self-test minus model k's, both on the
    items the cross-test counts (under seen: model k's classes; ``part``: with model k's classes learned).

    This is the denominator of paper 002's Update Gain (Gamma = (M(t, k) - M(k, k)) / (M(t, t) - M(k, k))) and the
    premise of its reading of ECC: a newer model that is not itself better at this evaluation leaves no gain for a
    cross-test to recover (paper 002 Tab. 2: +4 / +6 / +2 points for CoReS)."""
    t, k = cell
    _, source = cell_source(db, experiment_id, view=view, eval_classes=eval_classes)
    same_set = experiment_same_set(db, experiment_id)
    learned = learned_classes(db, experiment_id)[k]
    pairs = parse_metric(metric)[0] == VERIFICATION

    def value(model: int) -> float:
        c = source(model, k, gallery_model=model)
        v, vec = cell_outcomes(c, metric, gallery_kind=gallery, same_set=same_set, rank_ties=rank_ties)
        if part is None:
            return v
        if pairs:
            qi, gi, _ = sample_pairs(c.query_labels, c.gallery_labels, same_set=same_set)
            keep = part_mask(part, learned, np.asarray(c.query_labels)[qi], np.asarray(c.gallery_labels)[gi])
        else:
            keep = part_mask(part, learned, c.query_labels)
        kept = vec[keep & ~np.isnan(vec)]
        return float(kept.mean()) if len(kept) else float("nan")

    return value(t) - value(k)


def same_image_cosines(db: Engine, experiment_id: int, view: str = "encoder") -> dict[str, float]:
    """How far one image's feature moves from the first model to the second of a stored experiment: the mean cosine of
    the same image's two features in ``view`` over the test queries (``"test"``; open set: classes no model trained)
    and over the stored training images of the classes the first model learned (``"trained"``, where a method's loss
    acts; NaN without a stored ``train`` split). A derived view (PSP, LSP) keeps the first model's C^1 outputs on both
    sides, as their cross-test does. A zero feature is left out (its cosine is undefined)."""
    raw = DERIVED_VIEWS.get(view, view)
    with session_scope(db) as s:
        versions = list_model_versions(s, experiment_id)[:2]
        if len(versions) < 2:
            raise ValueError(f"experiment {experiment_id} has one model: no old and new feature to compare")
        out = {}
        for split, key in (("query", "test"), ("train", "trained")):
            try:
                (fo, lo, io), (fn, _, in_) = (load_feature_set(s, v.id, split, raw) for v in versions)
            except ValueError:  # no such split stored
                out[key] = float("nan")
                continue
            if io is not None and in_ is not None and not np.array_equal(io, in_):
                raise ValueError(f"experiment {experiment_id}: its models' {split} features are not of the same images")
            if view != raw:
                fo, fn = cell_features({raw: fo}, {raw: fn}, view, columns=len(versions[0].classes))
            keep = np.asarray(lo) < len(versions[0].classes) if split == "train" else np.ones(len(lo), bool)
            cos = row_cosines(np.asarray(fo)[keep], np.asarray(fn)[keep])
            out[key] = float(np.nanmean(cos)) if np.isfinite(cos).any() else float("nan")
    return out


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two feature arrays of the same images, in float64 (NaN for a zero feature)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def part_mask(part: str, learned: int, query_labels: np.ndarray, gallery_labels: np.ndarray | None = None) -> np.ndarray:
    """Which items of a cell are in ``part``: ``trained`` when every class an item involves (a query's; a pair's two,
    ``gallery_labels`` given) is below ``learned`` (the classes both models learned), ``untrained`` otherwise."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; use one of {', '.join(PARTS)}")
    inside = np.asarray(query_labels) < learned
    if gallery_labels is not None:
        inside &= np.asarray(gallery_labels) < learned
    return inside if part == "trained" else ~inside


def items_from_cells(T: int, cell: Callable[[int, int], CellFeatures], *, metric: str,
                     gallery: str = "instance", same_set: bool = True, part: str | None = None,
                     classes: Sequence[int] | None = None, rank_ties: str = "pessimistic") -> tuple[SeedItems, np.ndarray]:
    """:func:`seed_items` for any ``cell(t, k)`` (``query_ids``: the query images' ids; every lower-triangle cell
    comparable). ``same_set``: the queries are the gallery images (closed set, one id space); else (open set) the
    gallery images get their own ids after the queries', so a pair names its two images in one id space. ``part``
    (with ``classes``, the classes each model learned): only that part's items (:func:`part_mask`), the others NaN;
    ``rank_ties``: Recall@k's rule for a negative tying the best positive (pessimistic: a miss, as stored)."""
    if part is not None and (classes is None or len(classes) != T):
        raise ValueError(f"a part needs the classes each of the {T} models learned")
    columns = matrix_columns(T)
    pairs = parse_metric(metric)[0] == VERIFICATION
    C = np.full((T, T), np.nan)
    per_cell: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    n_images = 0
    for (t, k) in columns:
        c = cell(t, k)
        if np.asarray(c.query).shape[1] != np.asarray(c.gallery).shape[1]:
            raise ValueError(f"cell ({t + 1}, {k + 1}) is not comparable: no per-item outcomes")
        C[t, k], vec = cell_outcomes(c, metric, gallery_kind=gallery, same_set=same_set, rank_ties=rank_ties)
        if part is not None:
            learned = min(classes[t], classes[k])
            if pairs:
                qi, gi, _ = sample_pairs(c.query_labels, c.gallery_labels, same_set=same_set)
                keep = part_mask(part, learned, np.asarray(c.query_labels)[qi], np.asarray(c.gallery_labels)[gi])
            else:
                keep = part_mask(part, learned, c.query_labels)
            vec = np.where(keep, vec, np.nan)
            C[t, k] = float(np.nanmean(vec)) if (keep & ~np.isnan(vec)).any() else float("nan")
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
