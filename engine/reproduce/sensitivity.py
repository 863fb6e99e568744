"""The sensitivity rows beside a claim: its AC under every evaluation convention its stored features allow
(eval classes seen / all x gallery instance / template x metric), re-evaluated from the stored features without
retraining.

A matrix missing for a convention is computed here from the experiment's stored query / gallery features (the cells
the run pipeline builds: gallery model k's classes are ``0 .. C^k - 1`` after remapping; PSP/LSP keep its first C^k
outputs) and stored beside the run's own (``engine.results.record.record_matrices``), so a rerun reads it back.
The protocol (open / closed set) cannot be changed this way: the stored features are of the run's own images.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sqlalchemy import Engine

from engine.core.cell import cell_features
from engine.core.contract import DERIVED_VIEWS
from engine.metrics import PairedOptions
from engine.metrics.compatibility import CellFeatures, MatrixResult, compatibility_matrices
from engine.metrics.summary import average_compatibility
from engine.metrics.uncertainty import seed_interval
from engine.reproduce.claims import Claim
from engine.reproduce.table import Interval
from engine.results.record import record_matrices
from storage import list_model_versions, load_feature_set, load_matrices, session_scope

EVAL_CLASSES = ("all", "seen")
GALLERIES = ("instance", "template")
PAIR_METRICS = ("verification",)  # pairs have no gallery: one row, under "instance"


def conventions(claim: Claim) -> list[tuple[str, str, str]]:
    """``(eval_classes, gallery, metric)`` of every sensitivity row: the claim's metric, Recall@1 and mAP."""
    metrics = tuple(dict.fromkeys((claim.our_convention["metric"], "recall@1", "map")))
    return [(ec, g, m) for m in metrics for ec in EVAL_CLASSES for g in GALLERIES
            if not (m in PAIR_METRICS and g != "instance")]


def stored_or_computed(db: Engine, experiment_id: int, *, view: str, metric: str, gallery: str, eval_classes: str,
                       topk: int | None = None) -> np.ndarray:
    """The experiment's matrix under this convention: read when stored, else computed from its features and stored."""
    with session_scope(db) as s:
        rows = [r for r in load_matrices(s, experiment_id, metric=metric, gallery_kind=gallery, view=view)
                if r.eval_classes == eval_classes]
    if rows:
        return np.asarray(rows[0].values, dtype=np.float64)
    result = compute_matrix(db, experiment_id, view=view, metric=metric, gallery=gallery, eval_classes=eval_classes,
                            topk=topk)
    with session_scope(db) as s:
        record_matrices(s, experiment_id, result, gallery_kind=gallery, view=view, eval_classes=eval_classes)
    return np.asarray(result.values[metric], dtype=np.float64)


def compute_matrix(db: Engine, experiment_id: int, *, view: str, metric: str, gallery: str, eval_classes: str,
                   topk: int | None = None) -> MatrixResult:
    """The experiment's matrix under this convention, computed from its stored closed-set features (not stored)."""
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

    return compatibility_matrices(cell, num_models=len(versions), metrics=(metric,), gallery_kind=gallery,
                                  same_set=True, paired=PairedOptions())


def sensitivity_rows(db: Engine, claim: Claim, runs: dict[tuple[int, str], int], methods: Sequence[str], *,
                     interval: Interval = seed_interval) -> list[dict]:
    """Per method and convention: AC per seed with its interval over seeds (closed-set runs only)."""
    out = []
    for method in methods:
        exps = [e for (seed, m), e in sorted(runs.items()) if m == method]
        for ec, g, metric in conventions(claim):
            values = [average_compatibility(stored_or_computed(db, e, view=claim.view(method), metric=metric,
                                                                gallery=g, eval_classes=ec)) for e in exps]
            out.append({"method": method, "eval_classes": ec, "gallery": g, "metric": metric,
                        "values": values, "interval": interval(values)})
    return out


def render_sensitivity(claim: Claim, rows: Sequence[dict]) -> str:
    """The sensitivity rows as text: one line per method, one column per convention (AC mean [interval])."""
    own = (claim.our_convention["eval_classes"], claim.our_convention["gallery"], claim.our_convention["metric"])
    lines = ["  sensitivity of AC to the convention (closed-set runs re-evaluated from stored features; * = the claim's):"]
    for r in rows:
        iv = r["interval"]
        span = "not run" if iv["mean"] is None else (
            f"{iv['mean']:.2f}" + ("" if iv["lo"] is None else f" [{max(0.0, iv['lo']):.2f}, {min(1.0, iv['hi']):.2f}]"))
        mark = "*" if (r["eval_classes"], "pairs" if r["metric"] in PAIR_METRICS else r["gallery"], r["metric"]) == own else " "
        lines.append(f"  {mark} {r['method']:<14}{r['metric']:<14}{r['eval_classes']:<6}{r['gallery']:<10}{span}")
    return "\n".join(lines)
