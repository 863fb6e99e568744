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

from engine.metrics import PairedOptions
from engine.metrics.compatibility import MatrixResult, compatibility_matrices
from engine.reproduce.claims import Claim
from engine.reproduce.outcomes import cell_source, experiment_same_set
from engine.reproduce.table import DEFAULT_INTERVAL, INTERVALS, RESAMPLES, SHORT, cell_interval, seed_runs
from engine.results.record import record_matrices
from storage import load_matrices, session_scope

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
    """The experiment's matrix under this convention, computed from its stored features (not stored)."""
    T, cell = cell_source(db, experiment_id, view=view, eval_classes=eval_classes, topk=topk)
    return compatibility_matrices(cell, num_models=T, metrics=(metric,), gallery_kind=gallery,
                                  same_set=experiment_same_set(db, experiment_id), paired=PairedOptions())


def sensitivity_rows(db: Engine, claim: Claim, runs: dict[tuple[int, str], int], methods: Sequence[str], *,
                     interval: str = DEFAULT_INTERVAL) -> list[dict]:
    """Per method and convention: AC per seed with its 95 % interval (``interval``: :data:`engine.reproduce.table.
    INTERVALS`; closed-set runs only): ``{"method", "eval_classes", "gallery", "metric", "values", "interval",
    "interval_kind", "note"}``."""
    out = []
    for method in methods:
        exps = [e for (seed, m), e in sorted(runs.items()) if m == method]
        for ec, g, metric in conventions(claim):
            stored = [(e, stored_or_computed(db, e, view=claim.view(method), metric=metric, gallery=g, eval_classes=ec))
                      for e in exps]
            got = seed_runs(db, stored, view=claim.view(method), metric=metric, gallery=g, eval_classes=ec,
                            interval=interval)
            values, iv, kind = cell_interval(None, got)
            out.append({"method": method, "eval_classes": ec, "gallery": g, "metric": metric, "values": list(values),
                        "interval": iv, "interval_kind": kind, "note": got.why})
    return out


SENSITIVITY_COLUMNS = ("cell", "method", "metric", "eval classes", "gallery", "AC: mean [95 % interval] (seeds)",
                       "interval", "claim's convention")


def _span(iv: dict) -> str:
    if iv["mean"] is None:
        return "not run"
    return f"{iv['mean']:.2f}" + ("" if iv["lo"] is None else f" [{max(0.0, iv['lo']):.2f}, {min(1.0, iv['hi']):.2f}]")


def _own(claim: Claim, r: dict) -> bool:
    own = (claim.our_convention["eval_classes"], claim.our_convention["gallery"], claim.our_convention["metric"])
    return (r["eval_classes"], "pairs" if r["metric"] in PAIR_METRICS else r["gallery"], r["metric"]) == own


def sensitivity_header(interval: str = DEFAULT_INTERVAL) -> str:
    """The Markdown sensitivity table's header (its rows: :func:`render_sensitivity` with ``markdown=True``)."""
    return (f"AC under each convention, closed-set runs re-evaluated from their stored features; 95 % interval: "
            f"{INTERVALS[interval]}, {RESAMPLES} resamples; n = seeds.\n\n"
            "| " + " | ".join(SENSITIVITY_COLUMNS) + " |\n|" + "---|" * len(SENSITIVITY_COLUMNS))


def render_sensitivity(claim: Claim, rows: Sequence[dict], *, markdown: bool = False) -> str:
    """The sensitivity rows as text (one line per method and convention, * = the claim's, the interval said) or as
    Markdown rows (:func:`sensitivity_header` above them)."""
    if markdown:
        return "\n".join("| " + " | ".join((claim.name, r["method"], r["metric"], r["eval_classes"], r["gallery"],
                                              f"{_span(r['interval'])} (n={r['interval']['n']})",
                                              SHORT[r["interval_kind"]], "yes" if _own(claim, r) else "")) + " |"
                         for r in rows)
    kinds = dict.fromkeys(r["interval_kind"] for r in rows)
    lines = ["  sensitivity of AC to the convention (closed-set runs re-evaluated from stored features; * = the claim's; "
             f"95 % interval: {'; '.join(INTERVALS[k] for k in kinds)}):"]
    lines += [f"  seeds only for {r['method']} {r['metric']} {r['eval_classes']} {r['gallery']}: {r['note']}"
              for r in rows if r.get("note")]
    for r in rows:
        mark = "*" if _own(claim, r) else " "
        lines.append(f"  {mark} {r['method']:<14}{r['metric']:<14}{r['eval_classes']:<6}{r['gallery']:<10}{_span(r['interval'])}")
    return "\n".join(lines)
