"""The study summary of ``python -m engine run/compare``: per method, its matrices and AC/AA/ACA."""
from __future__ import annotations

import numpy as np
from sqlalchemy import Engine

from engine.methods import METHODS
from engine.report import render_matrix, render_summary_table
from storage import load_matrices, session_scope
from storage.models import Experiment


def main_view(method: str) -> str:
    """The view a method is judged by: its own (psp/lsp) or the encoder."""
    cls = METHODS.get(method)
    views = getattr(cls, "default_views", ("encoder",)) if cls else ("encoder",)
    return views[0]


def study_summary(db: Engine, study_id: int, experiment_ids: list[int]) -> dict:
    """JSON-ready: {"study_id", "methods": {method: {"experiment_id", "main_view", "views": {view: {metric: {...}}}}}}."""
    out: dict = {"study_id": study_id, "methods": {}}
    with session_scope(db) as s:
        for exp_id in experiment_ids:
            exp = s.get(Experiment, exp_id)
            views: dict = {}
            for m in load_matrices(s, exp_id):
                views.setdefault(m.view, {})[m.metric] = {
                    "matrix": [[None if np.isnan(v) else float(v) for v in row] for row in m.values],
                    "AC": m.summary.get("AC"), "AA": m.summary.get("AA"), "ACA": m.summary.get("ACA"),
                    "protocol": m.protocol, "eval_classes": m.eval_classes,
                }
            out["methods"][exp.method] = {"experiment_id": exp_id, "main_view": main_view(exp.method), "views": views}
    return out


def print_study(summary: dict, *, fmt: str = "text", table_only: bool = False, metric: str = "recall@1") -> None:
    """Print each method's main-view matrix (unless ``table_only``) and the methods x AC/AA/ACA table."""
    rows = []
    for method, info in summary["methods"].items():
        for view, metrics in info["views"].items():
            if metric not in metrics:
                continue
            entry = metrics[metric]
            label = method if view == info["main_view"] else f"{method} ({view})"
            rows.append((label, entry))
            if not table_only:
                C = np.array([[np.nan if v is None else v for v in row] for row in entry["matrix"]])
                print(render_matrix(C, fmt=fmt, title=f"{label}: {metric}"))
    print(f"{metric}, AA and ACA in %:")
    print(render_summary_table(rows, fmt="markdown" if fmt == "text" else fmt))
