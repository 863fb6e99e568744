"""The paper's query/gallery combination table for one old/new pair (paper 004 Tables 1-2)."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch

from engine.adapters.inputs import as_features, as_labels, check_same_rows
from engine.adapters.pair import AdapterPair

Evaluate = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], dict[str, float]]

COMBINATION_ROWS = ("old/old", "new/old", "F(old)/F(old)", "B(new)/F(old)", "B(new)/old", "B(new)/B(new)")
EXTRA_ROWS = ("F(old)/old", "new/new")
VIEWS = ("old", "new", "F(old)", "B(new)")


def combination_table(
    old_q: np.ndarray | torch.Tensor,
    new_q: np.ndarray | torch.Tensor,
    old_g: np.ndarray | torch.Tensor,
    new_g: np.ndarray | torch.Tensor,
    q_labels: np.ndarray | torch.Tensor | Sequence,
    g_labels: np.ndarray | torch.Tensor | Sequence,
    adapters: AdapterPair,
    *,
    evaluate: Evaluate,
    rows: Sequence[str] = COMBINATION_ROWS,
) -> list[dict]:
    """One dict per "query/gallery" row: ``{"row", "query", "gallery", **evaluate(...)}``.

    Default rows (the paper's, query first): old/old, new/old, F(old)/F(old), B(new)/F(old),
    B(new)/old, B(new)/B(new); ``EXTRA_ROWS`` adds F(old)/old and new/new. ``old_*``/``new_*``
    are the raw features of the same query (gallery) images in the same row order.
    ``evaluate(query, query_labels, gallery, gallery_labels)`` computes the metrics (e.g.
    ``engine.metrics.retrieval.retrieval_metrics``); when query and gallery are the same images (the
    paper's leave-one-out protocol) it must exclude gallery row ``i`` for query ``i`` in every
    row, cross-model rows included.

    Views of different widths are reconciled by the pair's ``dim_mismatch`` rule (``match_dims``).
    Without B (FCT) B(new) is the raw new features, so B(new) rows read as the paper's
    new/... rows. Rows that need F on a pair without F get NaN for every metric key.
    """
    unknown = [r for r in rows if r.count("/") != 1 or any(v not in VIEWS for v in r.split("/"))]
    if unknown:
        raise ValueError(f"unknown rows {unknown}; a row is 'query/gallery' with views from {VIEWS}")
    q = _side(old_q, new_q, adapters, "query")
    g = _side(old_g, new_g, adapters, "gallery")
    q_lab = as_labels(q_labels, q["old"].shape[0], "query labels")
    g_lab = as_labels(g_labels, g["old"].shape[0], "gallery labels")

    results: dict[str, dict] = {}
    for row in rows:
        query_view, gallery_view = row.split("/")
        if query_view in q and gallery_view in g:
            query, gallery = adapters.match_dims(q[query_view], g[gallery_view])
            metrics = evaluate(query, q_lab, gallery, g_lab)
            results[row] = {"row": row, "query": query_view, "gallery": gallery_view, **metrics}
    keys = list(dict.fromkeys(k for r in results.values() for k in r if k not in ("row", "query", "gallery")))
    table = []
    for row in rows:
        if row not in results:
            query_view, gallery_view = row.split("/")
            results[row] = {"row": row, "query": query_view, "gallery": gallery_view, **{k: math.nan for k in keys}}
        table.append(results[row])
    return table


def _side(old, new, adapters: AdapterPair, what: str) -> dict[str, np.ndarray]:
    old_arr = as_features(old, f"{what} old features")
    new_arr = as_features(new, f"{what} new features")
    check_same_rows(old_arr, new_arr, f"{what} old features", f"{what} new features")
    for arr, dim, name in ((old_arr, adapters.old_dim, "old"), (new_arr, adapters.new_dim, "new")):
        if arr.shape[1] != dim:
            raise ValueError(
                f"{what} {name} features have {arr.shape[1]} dimensions but the adapters were trained on "
                f"{dim}-d {name} features"
            )
    views = {"old": old_arr, "new": new_arr, "B(new)": adapters.apply_backward(new_arr)}
    if adapters.forward is not None:
        views["F(old)"] = adapters.apply_forward(old_arr)
    return views
