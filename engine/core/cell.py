"""A compatibility cell's features, derived from stored raw outputs (torch-free): encoder, logits, softmax, PSP, LSP.

A model's raw outputs (encoder features, logits, softmax over all its outputs) are extracted once
(``engine.models.extract.extract_outputs``) and stored. The PSP/LSP view of a query model depends on the
*gallery* model's classes, so ``cell_features`` derives both sides of a compatibility-matrix cell from the
stored raw outputs; the pipeline, the checkpoint comparison and every analysis go through it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Union

import numpy as np

from engine.core.contract import DERIVED_VIEWS
from engine.core.norms import tame_rows, unit_rows_np

VIEWS = ("encoder", "logits", "softmax", "psp", "lsp")
RAW_VIEWS = ("encoder", "logits", "softmax")  # what extract_outputs returns and what is stored; psp/lsp derive from them
TOPK_ORDERS = ("project_first", "sparsify_first")
# the outputs PSP/LSP keep: C^k (the first C^k, nested models) or the column indices in the gallery's class order
Columns = Union[int, Sequence[int], np.ndarray]


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
    source = DERIVED_VIEWS.get(view, view)
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
