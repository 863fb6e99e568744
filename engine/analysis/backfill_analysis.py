"""The ``backfill`` analysis of a stored experiment: partial-backfilling curves per ordering, M-tilde, reach.

The curves themselves are :func:`engine.metrics.backfill.backfill_curves`; this module reads the two models'
stored features into one cell and turns the curves into the stored payload.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import Engine

from engine.analysis.arrays import finite
from engine.metrics.backfill import backfill_curves, curve_area, fraction_to_reach
from engine.metrics.backfill_orders import backfill_order
from engine.analysis.views import (
    Progress,
    Version,
    cell_columns,
    load_view,
    topk_note,
    topk_of,
    version_of_step,
)
from engine.core.contract import DERIVED_VIEWS, REACH_SHARES, same_set_of


def compute_backfill(db: Engine, config: dict[str, Any], versions: list[Version], params: dict[str, Any],
                     progress: Progress) -> dict[str, Any]:
    """The payload of a ``backfill`` analysis: one curve per (ordering, metric), M-tilde and reach fractions.

    Queries are the new model's query features; the old gallery the old model's gallery features and the new
    gallery the new model's (same images, same rows). With ``eval_classes = "seen"`` queries and gallery keep
    the old model's classes. The orderings that look at features use the old gallery (as stored before any
    backfilling); ``confidence`` uses the new model's stored gallery logits.
    """
    old, new = version_of_step(versions, params["step_a"]), version_of_step(versions, params["step_b"])
    view, topk = params["view"], topk_of(config)
    new_cols, old_cols = cell_columns(new, old)
    same_set = same_set_of(config)
    progress(0.05, "loading features")
    query, q_labels, _ = load_view(db, new, "query", view, columns=new_cols, topk=topk)
    old_g, g_labels, _ = load_view(db, old, "gallery", view, columns=old_cols, topk=topk)
    new_g, g_labels_new, _ = load_view(db, new, "gallery", view, columns=new_cols, topk=topk)
    if not np.array_equal(g_labels, g_labels_new):
        raise ValueError(f"the gallery features of steps {old.step} and {new.step} do not embed the same images")
    new_logits = None
    if "confidence" in params["orderings"]:
        new_logits = load_view(db, new, "gallery", "logits")[0]
    notes = []
    if config.get("eval", {}).get("eval_classes", "all") == "seen":
        q_keep, g_keep = np.isin(q_labels, old.classes), np.isin(g_labels, old.classes)
        if same_set and not np.array_equal(q_keep, g_keep):
            raise ValueError("closed-set queries and gallery must be the same images")
        query, q_labels, old_g, new_g, g_labels = query[q_keep], q_labels[q_keep], old_g[g_keep], new_g[g_keep], g_labels[g_keep]
        new_logits = None if new_logits is None else new_logits[g_keep]
        notes.append(f"eval_classes = seen: queries and gallery restricted to the old model's {len(old.classes)} classes")
    if view in DERIVED_VIEWS:
        notes.append(f"{view.upper()}: everything projected onto the old model's {len(old.classes)} classes"
                     f"{topk_note(topk)}")
    fractions = np.linspace(0.0, 1.0, params["num_fractions"])
    curves: dict[str, dict[str, list[float | None]]] = {}
    area: dict[str, dict[str, float | None]] = {}
    reach: dict[str, dict[str, dict[str, float | None]]] = {}
    counts: dict[str, Any] = {}
    for i, name in enumerate(params["orderings"]):
        progress(0.1 + 0.85 * i / len(params["orderings"]), f"ordering {name}")
        order = backfill_order(name, old_gallery=old_g, new_gallery=new_g, gallery_labels=g_labels,
                               new_logits=new_logits, seed=params["seed"])
        out = backfill_curves(query, q_labels, old_g, new_g, g_labels, order=order, fractions=fractions,
                              metrics=params["metrics"], same_set=same_set)
        counts = {k: (np.asarray(out[k]).tolist() if k == "n_backfilled" else int(out[k]))
                  for k in ("n_backfilled", "n_queries", "n_valid", "n_no_positive")}
        curves[name] = {m: [finite(v) for v in np.asarray(out[m])] for m in params["metrics"]}
        area[name] = {m: finite(curve_area(fractions, np.asarray(out[m]))) for m in params["metrics"]}
        reach[name] = {m: {f"{share:g}": fraction_to_reach(fractions, np.asarray(out[m]), share * float(out[m][-1]))
                           for share in REACH_SHARES} for m in params["metrics"]}
    first = curves[params["orderings"][0]]
    return {
        "params": params,
        "fractions": fractions.tolist(),
        **counts,
        "n_gallery": int(len(g_labels)),
        "same_set": same_set,
        "models": [{"step": v.step, "model_version_id": v.id, "num_classes": len(v.classes)} for v in (old, new)],
        "curves": curves,
        "area": area,
        "reach": reach,
        "reach_shares": [f"{s:g}" for s in REACH_SHARES],
        "self_test": {m: first[m][-1] for m in params["metrics"]},
        "cross_test": {m: first[m][0] for m in params["metrics"]},
        "notes": notes,
    }
