"""The study summary of ``python -m engine run/compare``: per method, its matrices and AC/AA/ACA."""
from __future__ import annotations

import numpy as np
from sqlalchemy import Engine

from engine.core.contract import main_view
from engine.metrics.gain import gain_json
from engine.core.conventions import replaced_steps, settings, stored_ties
from engine.metrics.over_seeds import over_seeds
from engine.results.verdict_words import verdict_word
from engine.methods import METHODS
from engine.methods.base import resolve_init_seed
from engine.results.report import render_matrix, render_summary_table, seed_spread as _spread
from storage import get_experiment, load_matrices, session_scope


def study_summary(db: Engine, study_id: int, experiment_ids: list[int]) -> dict:
    """JSON-ready: {"study_id", "seeds", "methods": {method: {...}}}, the matrices under each run's ``eval.eval_classes``.

    Per method: ``experiment_id``/``views`` of its first seed (matrix, AC/AA/ACA, update gain, paired test),
    ``experiment_ids`` and ``seeds`` of every run, ``init_seed`` (effective), ``spread``: {view: {metric:
    {"AC"|"AA"|"ACA": {"mean", "std", "n"}}}} across seeds, and ``over_seeds``: {view: {metric: the verdict of each
    cross-test's mean over the seeds and Γ over the cells where ECC holds}} (:func:`engine.metrics.over_seeds.over_seeds`).
    """
    out: dict = {"study_id": study_id, "seeds": [], "methods": {}}
    with session_scope(db) as s:
        for exp_id in experiment_ids:
            exp = get_experiment(s, exp_id)
            views: dict = {}
            rows = load_matrices(s, exp_id)  # eval.also_eval_classes' matrices are the Compatibility page's to show
            configured = settings(exp.config).eval_classes
            for m in [m for m in rows if m.eval_classes == configured] or rows:
                views.setdefault(m.view, {})[m.metric] = {
                    "matrix": [[None if np.isnan(v) else float(v) for v in row] for row in m.values],
                    "AC": m.summary.get("AC"), "AA": m.summary.get("AA"), "ACA": m.summary.get("ACA"),
                    "update_gain": gain_json(np.asarray(m.values, float)), "paired": m.summary.get("paired"),
                    "gallery_kind": m.gallery_kind, "eval_classes": m.eval_classes, "ties": stored_ties(m.summary),
                }
            seed = exp.config.get("seed")
            cls = METHODS.get(exp.method)
            choice = exp.config.get("model", {}).get("init_seed", "same")
            entry = out["methods"].setdefault(exp.method, {
                "experiment_id": exp_id, "main_view": main_view(exp.method), "views": views,
                "init_seed": resolve_init_seed(cls, choice) if cls else choice, "runs": []})
            entry["runs"].append({"seed": seed, "experiment_id": exp_id, "views": views})
            if seed not in out["seeds"]:
                out["seeds"].append(seed)
            out.setdefault("replaced_steps", list(replaced_steps(exp.config)))
    for entry in out["methods"].values():
        entry["experiment_ids"] = [r["experiment_id"] for r in entry["runs"]]
        entry["seeds"] = [r["seed"] for r in entry["runs"]]
        entry["spread"] = {view: {metric: {key: _spread([r["views"].get(view, {}).get(metric, {}).get(key) for r in entry["runs"]])
                                           for key in ("AC", "AA", "ACA")}
                                  for metric in metrics}
                           for view, metrics in entry["views"].items()}
        entry["over_seeds"] = {view: {metric: over_seeds([r["views"].get(view, {}).get(metric) for r in entry["runs"]])
                                      for metric in metrics}
                               for view, metrics in entry["views"].items()}
        del entry["runs"]
    return out


def _matrix(rows: list) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64)


def gallery_kind(entry: dict) -> str:
    """An entry's gallery kind; ``protocol``, its key in summaries written before the rename, is read too."""
    return entry.get("gallery_kind") or entry.get("protocol") or ""


def header(summary: dict, metric: str) -> str:
    """The conventions of the printed numbers: metric, gallery, classes, seeds and each method's initialisation."""
    first = next((m for info in summary["methods"].values() for m in info["views"].values() if metric in m), {})
    entry = first.get(metric, {})
    inits = ", ".join(f"{name} {info['init_seed']}" for name, info in summary["methods"].items())
    return (f"{metric} | gallery {gallery_kind(entry) or '?'} | eval_classes {entry.get('eval_classes', '?')} | "
            f"seeds {', '.join(str(x) for x in summary.get('seeds', []))} | init_seed: {inits}")


def mean_lines(label: str, over: dict | None, names_count: int) -> list[str]:
    """``BCT: M2→M1 +1.2 points, 95 % CI -0.5 to +2.9 (t over 3 seeds): too close to call`` per cross-test, then Γ."""
    if not over:
        return []
    out = []
    v = over.get("verdicts")
    if v:
        for t in range(names_count):
            for k in range(t):
                if v["verdict"][t][k] is None:
                    continue
                how = f"t over {v['seeds'][t][k]} seeds" if v["seeds"][t][k] > 1 else "one seed's items"
                out.append(f"{label}: M{t + 1}→M{k + 1} {100 * v['diff'][t][k]:+.1f} points, 95 % CI "
                           f"{100 * v['lo'][t][k]:+.1f} to {100 * v['hi'][t][k]:+.1f} ({how}): {verdict_word(v['verdict'][t][k])}")
    g = over.get("gain") or {}
    out.append(f"{label}: mean Γ {100 * g['mean']:.1f} % over {g['cells']} cells where ECC holds" if g.get("mean") is not None
               else f"{label}: Γ {g.get('why') or 'undefined'}")
    return out


def print_study(summary: dict, *, fmt: str = "text", table_only: bool = False, metric: str = "recall@1") -> None:
    """Print the conventions, each method's main-view matrix (unless ``table_only``; first seed, with its paired
    verdicts and update gains, then each cross-test's mean over the seeds with its interval and verdict) and the
    methods x AC/AA/ACA table (mean +/- std over seeds when several; the verdicts counted are those of the means)."""
    print(header(summary, metric))
    rows = []
    for method, info in summary["methods"].items():
        for view, metrics in info["views"].items():
            if metric not in metrics:
                continue
            entry = metrics[metric]
            label = method if view == info["main_view"] else f"{method} ({view})"
            over = info.get("over_seeds", {}).get(view, {}).get(metric)
            rows.append((label, {**entry, "spread": info.get("spread", {}).get(view, {}).get(metric), "over_seeds": over}))
            if not table_only:
                gain = _matrix(entry["update_gain"]) if entry.get("update_gain") else None
                seed = f", seed {info['seeds'][0]}" if len(info.get("seeds", [])) > 1 else ""
                print(render_matrix(_matrix(entry["matrix"]), fmt=fmt, title=f"{label}: {metric}{seed}",
                                    paired=entry.get("paired"), gain=gain, replaced=summary.get("replaced_steps", ()),
                                    metric=metric, view=view, gallery_kind=gallery_kind(entry),
                                    eval_classes=entry.get("eval_classes", ""), ties=stored_ties(entry),
                                    tie_readings=entry.get("tie_readings")))
                if len(info.get("seeds", [])) > 1:
                    for line in mean_lines(label, over, len(entry["matrix"])):
                        print(line)
    many = len(summary.get("seeds", [])) > 1
    print(f"{metric}, AA and ACA in %" + (f", mean ± std over {len(summary['seeds'])} seeds; ✓/✗/? count the verdicts of "
                                          "each cross-test's mean over the seeds (95 % t-interval over seeds)" if many else "")
          + "; mean Γ only over cells where ECC holds:")
    print(render_summary_table(rows, fmt="markdown" if fmt == "text" else fmt))
