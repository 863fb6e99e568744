"""A compatibility cell's features, derived from stored raw outputs (torch-free): encoder, logits, softmax, PSP, LSP.

A model's raw outputs (encoder features, logits, softmax over all its outputs) are extracted once
(``engine.models.extract.extract_outputs``) and stored. The PSP/LSP view of a query model depends on the
*gallery* model's classes, so ``cell_features`` derives both sides of a compatibility-matrix cell from the
stored raw outputs.

How a cell (query model t, gallery model k) is read is one :class:`CellRecipe` (view, each side's class columns,
top-k, the rows ``eval_classes`` keeps, same set or not), built by :func:`cell_recipe` from the experiment's
evaluation settings and the two models' classes, and applied by :meth:`CellRecipe.side` /
:func:`apply_recipe`: the pipeline, the search tasks, the checkpoint comparison, the upgrade check and every
analysis build and apply it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from engine.core.classes import aligned_columns, index_names
from engine.core.contract import DERIVED_VIEWS, raw_view, same_set_of
from engine.core.conventions import settings
from engine.core.norms import tame_rows, unit_rows_np
from engine.core.kinds import RAW_VIEWS  # noqa: F401 (re-exported: what extract_outputs returns and stores)
from engine.core.vocab import EVAL_CLASSES, VIEWS

TOPK_ORDERS = ("project_first", "sparsify_first")
# the outputs PSP/LSP keep: C^k (the first C^k, nested models) or the column indices in the gallery's class order
Columns = Union[int, Sequence[int], np.ndarray]
# a model's classes as a cell needs them: C (a run's nested model: classes 0 .. C - 1, its first C outputs) or names
ClassList = Union[int, Sequence[str]]


def project_simplex(
    outputs: np.ndarray,
    num_classes: int,
    *,
    center: bool = True,
    topk: int | None = None,
    topk_order: str = "project_first",
) -> np.ndarray:
    """PSP/LSP feature (paper 000, Algorithm 1): keep the first C^k outputs, centre, L2-normalise.

    ``outputs`` (``(..., C^t)``) are softmax probabilities for PSP or logits for LSP over all the
    model's outputs in class order; ``num_classes`` is C^k <= C^t of the gallery model. This equals
    ``normalize([I - J/C^k | 0] f)``. Floating inputs keep their dtype, others become float32.

    ``center=False`` skips the centring, which is LSP as literally written in Eq. 6 (z/||z||, with
    the truncation a cross-test needs); the default follows Algorithm 1, which the paper says it
    applies to logits as well.

    ``topk`` keeps only the k largest entries (Appendix K, which does not fix the order):
    - ``"project_first"`` (default): centre, keep the k largest centred entries, zero the rest,
      L2-normalise; this reads Appendix K's "setting all entries of a PSP feature representation
      vector to zero except for the top-k" literally and yields k-sparse features.
    - ``"sparsify_first"``: zero all but the k largest raw outputs, then centre and normalise; with
      centring the result is dense again (zeros become minus the mean).
    Ties are broken towards the lower class index, so the result is deterministic.
    """
    values = np.asarray(outputs)
    total = values.shape[-1]
    if not 1 <= num_classes <= total:
        raise ValueError(
            f"the gallery model has {num_classes} classes but these outputs cover {total}; PSP/LSP needs "
            "a query model that knows at least the gallery's classes, in the same order"
        )
    if center and num_classes < 2:
        raise ValueError("a centred simplex projection of a single class is the zero vector; use num_classes >= 2")
    if topk is not None and not 1 <= topk <= num_classes:
        raise ValueError(f"topk must lie in [1, {num_classes}], got {topk}")
    if topk_order not in TOPK_ORDERS:
        raise ValueError(f"unknown topk_order {topk_order!r}; use one of {TOPK_ORDERS}")
    if not np.issubdtype(values.dtype, np.floating):
        values = values.astype(np.float32)

    kept = tame_rows(values[..., :num_classes])  # rows near the float maximum (or tiny) scaled: centring cannot overflow
    if topk is not None and topk_order == "sparsify_first":
        kept = _keep_topk(kept, topk)
    if center:
        kept = kept - kept.mean(axis=-1, keepdims=True)
    if topk is not None and topk_order == "project_first":
        kept = _keep_topk(kept, topk)
    return unit_rows_np(kept)


def _keep_topk(values: np.ndarray, k: int) -> np.ndarray:
    """Zero every entry but the k largest of each row (stable: ties go to the lower index)."""
    order = np.argsort(-values, axis=-1, kind="stable")[..., :k]
    mask = np.zeros(values.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=-1)
    return np.where(mask, values, values.dtype.type(0))


def output_view(raw: Mapping[str, np.ndarray], view: str, *, columns: Columns | None = None,
                topk: int | None = None) -> np.ndarray:
    """One model's stored raw outputs in ``view``, as an ``(N, D)`` array.

    ``encoder``, ``logits``, ``softmax`` and any other view ``raw`` holds are returned as stored (not copied;
    ``columns`` and ``topk`` do not apply to them). ``psp`` (from ``softmax``) and ``lsp`` (from ``logits``) keep the outputs
    ``columns`` names, then centre, keep the top ``topk`` and L2-normalise (:func:`project_simplex`):
    ``columns`` is C^k (the first C^k outputs, the paper's nested models) or this model's column of
    each class the gallery model shares, in the gallery's class order (``engine.core.classes``).
    """
    if view not in DERIVED_VIEWS and view in raw:  # a raw view, or one stored as it is (e.g. adapted features)
        return np.asarray(raw[view])
    if view not in VIEWS:
        raise ValueError(f"unknown feature view {view!r}; use one of {VIEWS}")
    source = raw_view(view)
    if source not in raw:
        raise ValueError(f"the raw outputs have no {source!r} entry; extract them with extract_outputs")
    values = np.asarray(raw[source])
    if columns is None:
        raise ValueError(f"the {view!r} view depends on the gallery model; pass its class columns (C^k)")
    if not isinstance(columns, (int, np.integer)):
        cols = np.asarray(columns, dtype=np.int64)
        values, columns = np.ascontiguousarray(values[:, cols]), len(cols)
    return project_simplex(values, int(columns), topk=topk)


def cell_features(query_raw: Mapping[str, np.ndarray], gallery_raw: Mapping[str, np.ndarray], view: str, *,
                  columns: Columns | tuple[Columns, Columns] | None = None,
                  topk: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(query features, gallery features)`` of one compatibility cell: query model t, gallery model k.

    ``query_raw`` / ``gallery_raw`` are the two models' stored raw outputs (``encoder``, ``logits``,
    ``softmax``). For PSP/LSP, ``columns`` is C^k (both sides keep their first C^k outputs) or a pair
    ``(query columns, gallery columns)`` from ``engine.core.classes.aligned_columns``; ``topk`` is the
    config's ``eval.topk`` (PSP/LSP only). Rows are projected one by one, so selecting rows (``eval_classes``)
    before or after gives the same features.
    """
    q_cols, g_cols = columns if isinstance(columns, tuple) else (columns, columns)
    return (output_view(query_raw, view, columns=q_cols, topk=topk),
            output_view(gallery_raw, view, columns=g_cols, topk=topk))


@dataclass(frozen=True)
class CellRecipe:
    """How one compatibility cell (query model t, gallery model k) is read from the two models' stored raw outputs.

    ``view``: the view compared; PSP/LSP are derived from the stored ``raw`` output with ``query_columns`` /
    ``gallery_columns`` (C^k, or each side's column of the classes both share, in the gallery's class order) and
    ``topk`` (None for every other view). ``below``: ``eval_classes = "seen"``, only the rows whose label is one of the
    gallery model's classes 0 .. C^k - 1 are kept (None: every row). ``same_set``: the queries are the gallery's
    items (closed-set), each left out of its own ranking.
    """

    view: str
    query_columns: int | tuple[int, ...] | None = None
    gallery_columns: int | tuple[int, ...] | None = None
    topk: int | None = None
    below: int | None = None
    same_set: bool = False

    @property
    def raw(self) -> str:
        """The stored output the view is read from (:func:`engine.core.contract.raw_view`)."""
        return raw_view(self.view)

    @property
    def derived(self) -> bool:
        """Whether the view is PSP/LSP, derived from the stored output with the cell's columns and top-k."""
        return self.view in DERIVED_VIEWS

    def kept_rows(self, labels: np.ndarray) -> np.ndarray:
        """A boolean mask of the rows the cell evaluates (every row unless ``eval_classes = "seen"``)."""
        labels = np.asarray(labels)
        return np.ones(len(labels), dtype=bool) if self.below is None else labels < self.below

    def side(self, side: str, values: np.ndarray, labels: np.ndarray, ids: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One side's ``(features, labels, row ids)``: the kept rows of ``values`` (the stored ``raw`` output), in the view.

        ``side`` is ``"query"`` or ``"gallery"`` (whose columns PSP/LSP keep); ``ids`` are the rows' ids (default
        their positions), returned for the kept rows.
        """
        if side not in ("query", "gallery"):
            raise ValueError(f"a cell has a 'query' and a 'gallery' side, not {side!r}")
        labels = np.asarray(labels)
        ids = np.arange(len(labels), dtype=np.int64) if ids is None else np.asarray(ids)
        if self.below is not None:
            keep = self.kept_rows(labels)
            values, labels, ids = np.asarray(values)[keep], labels[keep], ids[keep]
        columns = self.query_columns if side == "query" else self.gallery_columns
        return output_view({self.raw: values}, self.view, columns=columns, topk=self.topk), labels, ids


def cell_recipe(view: str, query: ClassList, gallery: ClassList, *, eval_classes: str = "all",
                topk: int | None = None, same_set: bool = False) -> CellRecipe:
    """The recipe of the cell (query model, gallery model) in ``view``.

    ``query`` / ``gallery``: each model's classes, as C (a training run's nested models: classes 0 .. C - 1 are the
    first C outputs, so PSP/LSP keep the first C^k) or class names (PSP/LSP keep the gallery's classes the query
    model knows, aligned by name, :func:`engine.core.classes.aligned_columns`; a count stands for the names
    ``"0" .. "C-1"``). ``eval_classes``, ``topk``: the experiment's ``eval`` settings; ``same_set``: closed-set.
    """
    if eval_classes not in EVAL_CLASSES:
        raise ValueError(f"eval_classes must be one of {', '.join(EVAL_CLASSES)}, got {eval_classes!r}")
    gallery_count = gallery if isinstance(gallery, (int, np.integer)) else len(gallery)
    below = int(gallery_count) if eval_classes == "seen" else None  # model k knows classes 0 .. C^k - 1
    if view not in DERIVED_VIEWS:
        return CellRecipe(view, below=below, same_set=bool(same_set))
    if isinstance(query, (int, np.integer)) and isinstance(gallery, (int, np.integer)):
        q_cols: int | tuple[int, ...] = int(gallery)
        g_cols: int | tuple[int, ...] = int(gallery)
    else:
        def names(classes: ClassList) -> Sequence[str]:
            return index_names(int(classes)) if isinstance(classes, (int, np.integer)) else classes

        q_idx, g_idx = aligned_columns(names(query), names(gallery))
        q_cols, g_cols = tuple(int(i) for i in q_idx), tuple(int(i) for i in g_idx)
    return CellRecipe(view, q_cols, g_cols, topk=topk, below=below, same_set=bool(same_set))


def recipe_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`cell_recipe` an experiment's stored config fixes: eval_classes, topk, same_set."""
    s = settings(config)
    return {"eval_classes": s.eval_classes, "topk": s.topk, "same_set": same_set_of(config)}


def apply_recipe(recipe: CellRecipe, query: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray,
                 gallery_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(query, query labels, query row ids, gallery, gallery labels)`` of a cell from the query model's stored
    query outputs and the gallery model's stored gallery outputs (both the recipe's ``raw`` view)."""
    q, ql, qids = recipe.side("query", query, query_labels)
    g, gl, _ = recipe.side("gallery", gallery, gallery_labels)
    return q, ql, qids, g, gl
