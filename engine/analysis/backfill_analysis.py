"""The ``backfill`` analysis of a stored experiment: partial-backfilling curves per ordering, M-tilde, reach.

The curves themselves are :func:`engine.metrics.backfill.backfill_curves`; this module reads the two models'
stored features into one cell and turns the curves into the stored payload.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import Engine

from engine.analysis.arrays import finite
from engine.metrics.backfill import backfill_curves, curve_area, fraction_to_reach, parse_curve_metrics
from engine.metrics.backfill_orders import backfill_order
from engine.metrics.backfill_rollout import curve_summary, rank_merge_curves, rescoring_curves, rescoring_ks
from engine.metrics.retrieval import retrieval_metrics
from engine.analysis.views import (
    Progress,
    StoredVersion,
    experiment_recipe,
    load_side,
    load_view,
    seen_note,
    topk_note,
    version_of_step,
)
from engine.core.contract import REACH_SHARES


def compute_backfill(db: Engine, config: dict[str, Any], versions: list[StoredVersion], params: dict[str, Any],
                     progress: Progress) -> dict[str, Any]:
    """The payload of a ``backfill`` analysis: one curve per (ordering, metric), M-tilde and reach fractions.

    Queries are the new model's query features; the old gallery the old model's gallery features and the new
    gallery the new model's (same images, same rows). With ``eval_classes = "seen"`` queries and gallery keep
    the old model's classes. The orderings that look at features use the old gallery (as stored before any
    backfilling); ``confidence`` uses the new model's stored gallery logits.
    """
    old, new = version_of_step(versions, params["step_a"]), version_of_step(versions, params["step_b"])
    view = params["view"]
    recipe = experiment_recipe(config, view, new, old)  # the cross-test's cell: new query, old gallery
    same_set = recipe.same_set
    progress(0.05, "loading features")
    query, q_labels, _, q_rows = load_side(db, new, "query", recipe, "query")
    old_g, g_labels, _, g_rows = load_side(db, old, "gallery", recipe, "gallery")
    new_g, g_labels_new, _, _ = load_side(db, new, "gallery", recipe, "query")  # the new gallery in the new model's columns
    if not np.array_equal(g_labels, g_labels_new):
        raise ValueError(f"the gallery features of steps {old.step} and {new.step} do not embed the same images")
    if same_set and recipe.below is not None and not np.array_equal(q_rows, g_rows):  # rows restricted
        raise ValueError("closed-set queries and gallery must be the same images")
    new_logits = None
    if "confidence" in params["orderings"]:
        new_logits = load_view(db, new, "gallery", "logits")[0][g_rows]
    notes = seen_note(recipe, old)
    if recipe.derived:
        notes.append(f"{view.upper()}: everything projected onto the old model's {len(old.classes)} classes"
                     f"{topk_note(recipe.topk)}")
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
    extra = {}
    if params.get("rollout"):
        progress(0.9, "rank merge and candidate re-scoring")
        old_q, old_q_labels, _, _ = load_side(db, old, "query", recipe, "gallery")
        if not np.array_equal(old_q_labels, q_labels):
            raise ValueError(f"the query features of steps {old.step} and {new.step} do not embed the same images")
        extra = {"rollout": rollout_payload(old_q, query, q_labels, old_g, new_g, g_labels, new_logits=new_logits,
                                            orderings=params["orderings"], fractions=fractions, metrics=params["metrics"],
                                            same_set=same_set, seed=params["seed"], replacement=curves)}
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
        **extra,
    }


def rollout_payload(old_query: np.ndarray, new_query: np.ndarray, query_labels: np.ndarray, old_gallery: np.ndarray,
                    new_gallery: np.ndarray, gallery_labels: np.ndarray, *, new_logits: np.ndarray | None,
                    orderings: list[str], fractions: np.ndarray, metrics: list[str], same_set: bool, seed: int,
                    replacement: dict[str, dict[str, list[float | None]]]) -> dict[str, Any]:
    """Rank merge (per ordering) and candidate re-scoring curves of a stored pair, with every curve's summary.

    The old index is searched with the old model's own queries (both models run at query time, the plain online
    backfilling), the new index with the new model's; ``replacement`` (the item-replacement curves already
    computed) gets its summary against both self-tests too.
    """
    _, _, ks, map_k, _ = parse_curve_metrics(metrics, "pessimistic")
    cell = {"ks": ks or (1,), "map_at": map_k or None, "same_set": same_set}
    old_self = retrieval_metrics(old_query, query_labels, old_gallery, gallery_labels, **cell)
    new_self = retrieval_metrics(new_query, query_labels, new_gallery, gallery_labels, **cell)

    def summarised(out_curves: dict[str, Any], grid: np.ndarray) -> dict[str, Any]:
        out = {}
        for m in metrics:
            values = np.array([np.nan if v is None else v for v in out_curves[m]], dtype=np.float64)
            summary = curve_summary(grid, values, old_self=old_self[m], new_self=new_self[m])
            out[m] = {**summary, "area": None if summary["area"] is None else finite(summary["area"])}
        return out

    merged = {}
    for name in orderings:
        order = backfill_order(name, old_gallery=old_gallery, new_gallery=new_gallery, gallery_labels=gallery_labels,
                               new_logits=new_logits, seed=seed)
        out = rank_merge_curves(old_query, new_query, query_labels, old_gallery, new_gallery, gallery_labels, order=order,
                                fractions=fractions, metrics=metrics, same_set=same_set)
        merged[name] = {"curves": {m: [finite(v) for v in np.asarray(out[m])] for m in metrics},
                        "summary": summarised(out, fractions)}
    ks = rescoring_ks(len(gallery_labels), fractions)
    out = rescoring_curves(old_query, new_query, query_labels, old_gallery, new_gallery, gallery_labels, ks=ks,
                           metrics=metrics, same_set=same_set)
    return {
        "self_test": {"old": {m: finite(old_self[m]) for m in metrics}, "new": {m: finite(new_self[m]) for m in metrics}},
        "replacement_summary": {name: summarised(c, fractions) for name, c in replacement.items()},
        "rank_merge": merged,
        "merge": "score",
        "rescoring": {"ks": ks.tolist(), "fractions": np.asarray(out["fractions"]).tolist(),
                      "curves": {m: [finite(v) for v in np.asarray(out[m])] for m in metrics},
                      "summary": summarised(out, np.asarray(out["fractions"]))},
    }
