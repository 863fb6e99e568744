""""Download this study": one zip built from stored rows (experiments and their matrices), torch-free.

Contents (``BUNDLE_FILES``):

- ``study.toml``: the config that reruns the study (``python -m engine run study.toml``), rebuilt from the
  experiments' stored configs (methods and seeds of every experiment, the rest shared) and written by
  ``engine.core.config.dump_toml`` after ``config_from_dict`` has checked it; left out, and said so in
  ``README.txt``, when the experiments were not trained from a config (checkpoints, feature folders);
- ``experiments.json``: each experiment's id, name, method and stored config as stored;
- ``matrices.csv``: every stored matrix, one row per lower-triangle cell (``engine.results.report.CSV_COLUMNS``
  plus the experiment, method and seed), numbers as numbers, pass/fail in its own column;
- ``matrices.json``: the same matrices as nested lists (null where undefined) with their query counts and
  stored summaries (AC / AA / ACA, paired test, update gain);
- ``summary.md``: per metric, gallery kind and evaluation classes, the convention line, the methods x
  AC / AA / ACA table and each method's matrix in its main view (``engine.results.report`` renderings).

The rows are the dicts ``app.queries.experiments`` / ``app.queries.matrices`` return (or the storage rows'
fields): experiment ``{"id", "name", "method", "config"}``, matrix ``{"metric", "gallery_kind", "view",
"eval_classes", "values", "valid_queries", "no_positive", "summary"}``.
"""
from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engine.core.config import config_from_dict, dump_toml
from engine.core.contract import main_view
from engine.metrics.gain import gain_json
from engine.core.conventions import annotate, convention, model_names, replaced_steps, stored_ties
from engine.results.report import CSV_COLUMNS, csv_text, matrix_rows, render_matrix, render_summary_table
from storage import json_ready

BUNDLE_FILES = ("README.txt", "study.toml", "experiments.json", "matrices.csv", "matrices.json", "summary.md")
BUNDLE_CSV_COLUMNS = ("experiment_id", "method", "seed") + CSV_COLUMNS


def study_config(experiments: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The run config of the whole study (every method and seed), or None when the experiments were not trained
    from a run config or their configs differ beyond method and seed."""
    configs = [dict(e["config"]) for e in experiments]
    if not configs or any(c.get("source") for c in configs):
        return None
    methods = list(dict.fromkeys(m for c in configs for m in c.get("methods", ())))
    seeds = list(dict.fromkeys(c.get("seed", 0) for c in configs))
    params: dict[str, Any] = {}
    for c in configs:
        params.update(c.get("method_params") or {})
    shared = {k: v for k, v in configs[0].items() if k not in ("methods", "seed", "seeds", "method_params")}
    if any({k: v for k, v in c.items() if k not in ("methods", "seed", "seeds", "method_params")} != shared
           for c in configs[1:]):
        return None
    return {**shared, "methods": methods, "method_params": params, "seed": seeds[0],
            "seeds": seeds if len(seeds) > 1 else []}


Given = Mapping[int, Mapping[int, str | None]]  # experiment id -> {step: the user's name of that model}


def _names(e: Mapping[str, Any], steps: int, given: Given) -> list[str]:
    """The models' names: the user's where given, else M1, M2, ... (a replaced step marked)."""
    mine = given.get(e["id"], {})
    return [mine.get(t) or n for t, n in enumerate(model_names(steps, replaced_steps(e["config"])), 1)]


def _csv_rows(experiments: Sequence[Mapping[str, Any]], matrices: Mapping[int, Sequence[Mapping[str, Any]]],
              given: Given) -> list[dict]:
    rows = []
    for e in experiments:
        for m in matrices.get(e["id"], ()):
            C = np.asarray(m["values"], dtype=np.float64)
            s = m["summary"]
            comparable = np.asarray(s["comparable"], bool) if s.get("comparable") else None
            cells = matrix_rows(C, names=_names(e, C.shape[0], given), comparable=comparable,
                                ties=stored_ties(s), paired=s.get("paired"),
                                gain=s.get("update_gain"), metric=m["metric"], view=m["view"],
                                gallery_kind=m["gallery_kind"], eval_classes=m["eval_classes"],
                                tie_readings=s.get("tie_readings"))
            rows += [{"experiment_id": e["id"], "method": e["method"], "seed": e["config"].get("seed"), **r}
                     for r in cells]
    return rows


def _matrices_json(experiments: Sequence[Mapping[str, Any]], matrices: Mapping[int, Sequence[Mapping[str, Any]]],
                   given: Given) -> list:
    return json_ready([{"experiment_id": e["id"], "method": e["method"], "seed": e["config"].get("seed"),
                        "models": _names(e, np.asarray(m["values"]).shape[0], given),
                        **{k: m[k] for k in ("metric", "view", "gallery_kind", "eval_classes")},
                        "values": np.asarray(m["values"], dtype=np.float64), "valid_queries": m["valid_queries"],
                        "no_positive": m["no_positive"], "summary": m["summary"]}
                       for e in experiments for m in matrices.get(e["id"], ())])


def _label(e: Mapping[str, Any], m: Mapping[str, Any]) -> str:
    return f"{e['method']} (#{e['id']}, {m['view']})"


def summary_markdown(experiments: Sequence[Mapping[str, Any]], matrices: Mapping[int, Sequence[Mapping[str, Any]]],
                     *, title: str, given: Given | None = None) -> str:
    """Per (metric, gallery kind, evaluation classes): the convention, the methods table and each main-view
    matrix, as the Compatibility page and ``python -m engine compare`` render them."""
    parts = [f"# {title}\n"]
    keys = sorted({(m["metric"], m["gallery_kind"], m["eval_classes"]) for ms in matrices.values() for m in ms},
                  key=lambda k: (k[0] != "recall@1", k))
    for metric, kind, classes in keys:
        shown = []
        for e in experiments:
            ms = [m for m in matrices.get(e["id"], ())
                  if (m["metric"], m["gallery_kind"], m["eval_classes"]) == (metric, kind, classes)]
            pick = ([m for m in ms if m["view"] == main_view(e["method"])]
                    or [m for m in ms if m["view"] == "encoder"] or ms)
            if pick:
                shown.append((e, pick[0]))
        if not shown:
            continue
        line = convention(shown[0][0]["config"], metrics=metric, views=[m["view"] for _, m in shown], gallery=kind,
                          eval_classes=classes, ties=stored_ties(shown[0][1]["summary"]))
        table = render_summary_table([(_label(e, m), {**m["summary"], "update_gain": gain_json(np.asarray(m["values"], float)),
                                                      "matrix": np.asarray(m["values"], float)})  # Γ where ECC holds
                                      for e, m in shown], fmt="markdown")  # Γ under one rule, whatever an older row stored
        parts.append(f"## {metric} · {kind} gallery · {classes} classes\n\n" + annotate(table, "markdown", line))
        for e, m in shown:
            C = np.asarray(m["values"], dtype=np.float64)
            s = m["summary"]
            gain = np.array([[np.nan if v is None else v for v in r] for r in s["update_gain"]], dtype=np.float64) \
                if s.get("update_gain") else None
            parts.append(render_matrix(C, fmt="markdown", title=_label(e, m), paired=s.get("paired"), gain=gain,
                                       comparable=np.asarray(s["comparable"], bool) if s.get("comparable") else None,
                                       ties=stored_ties(s), metric=m["metric"], tie_readings=s.get("tie_readings"),
                                       replaced=replaced_steps(e["config"]), names=_names(e, C.shape[0], given or {})))
    return "\n".join(parts)


def study_bundle(experiments: Sequence[Mapping[str, Any]], matrices: Mapping[int, Sequence[Mapping[str, Any]]], *,
                 title: str, names: Given | None = None) -> bytes:
    """The zip of ``BUNDLE_FILES`` for these experiments (``matrices``: experiment id -> its stored matrices;
    ``names``: experiment id -> {step: the user's model name}, used wherever a model is named)."""
    given = names or {}
    if not experiments:
        raise ValueError("a study bundle needs at least one experiment")
    config = study_config(experiments)
    toml, why = None, ("these experiments were not trained from a run config (checkpoints or feature folders), or "
                       "their configs differ beyond method and seed; experiments.json has each stored config")
    if config is not None:
        try:
            toml = dump_toml(config_from_dict(config))
        except ValueError as exc:
            why = f"the stored configs do not form a valid run config ({exc})"
    readme = ("Compatibility Lab study export.\n"
              "study.toml: rerun with `python -m engine run study.toml`.\n" if toml else
              f"Compatibility Lab study export.\nNo study.toml: {why}.\n") + (
        "experiments.json: stored configs. matrices.csv: one row per lower-triangle cell (value = fraction, "
        "ecc_pass = cross-test > gallery model's self-test). matrices.json: the matrices (null = undefined) and their "
        "summaries. summary.md: tables per metric.\n")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("README.txt", readme)
        if toml:
            z.writestr("study.toml", toml)
        z.writestr("experiments.json", json.dumps(json_ready(
            [{k: e[k] for k in ("id", "name", "method", "config")} for e in experiments]), indent=2, allow_nan=False))
        z.writestr("matrices.csv", csv_text(_csv_rows(experiments, matrices, given), BUNDLE_CSV_COLUMNS))
        z.writestr("matrices.json", json.dumps(_matrices_json(experiments, matrices, given), indent=1, allow_nan=False))
        z.writestr("summary.md", summary_markdown(experiments, matrices, title=title, given=given))
    return buffer.getvalue()
