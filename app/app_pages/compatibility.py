"""Compatibility: the lower-triangular matrices (failing cross-tests marked), AC / AA / ACA and their curves.

A study run with several seeds shows one row per method and view (mean and sample std over its seeds) and its
heatmaps averaged over the seeds (each seed's verdict per cross-test in a table) or one per seed. The numbers over
the seeds come from the read model ``engine.read.matrices``; the page picks, lays out and draws."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from app import charts
from app.exports import download_buttons, study_download
from app import queries as q
from app.widgets import empty_state, experiment_label, plain, state_convention, summary_columns, table
from engine.core.conventions import annotate, convention, model_names, replaced_note, replaced_steps, settings, stored_ties
from engine.core.vocab import EVAL_CLASSES
from engine.read.matrices import (ecc_pass, gain_cells, gain_text, judged, matrix_download, paired_range,
                                  render_summary_table, seed_verdicts, spread_summary, stacked_mean, summarize,
                                  summary_row, verdict_total, view_row)
from engine.read.verdicts import tie_lines

url = q.db_url()
MAIN = "main view of each method"
METRIC_NAMES = {"recall@1": "Recall@1", "map": "mAP"}
AVERAGED, PER_SEED = "averaged over the seeds", "one per seed"

st.title("Compatibility")
st.caption("Row = query model (new), column = gallery model (old). A cross-test passes the empirical compatibility "
           "criterion when C[t, k] > C[k, k]; failing cells are boxed in red and marked ✗, as in the papers. "
           "AC = share of passing cross-tests, AA = mean of the lower triangle, ACA = accuracy of the passing ones. "
           "Where a paired test is stored, each cross-test is also judged on its interval: ✓ passes, ✗ fails, "
           "? too close to call; AC's range runs from the sure passes to every cell not a sure failure.")


def metric_name(metric: str) -> str:
    return METRIC_NAMES.get(metric, metric)


@st.cache_data(ttl=q.RESULT_TTL, show_spinner=False)
def ecc_cells(values: np.ndarray, ties: str) -> np.ndarray:
    """The compatibility criterion per cell under the tie rule stored with the matrix (a seed's or a mean's)."""
    return ecc_pass(values, ties=ties)


experiments = [e for e in q.experiments(url) if e["status"] == "done"]
if not experiments:
    empty_state(url, "finished experiments")
    st.stop()

# ---- what to show: a study (its methods side by side, every seed) or a single experiment
groups: dict[str, list[dict[str, Any]]] = {}
for e in experiments:
    label = f"Study: {e['study']} (#{e['study_id']})" if e["study_id"] is not None else f"Experiment: {experiment_label(e)}"
    groups.setdefault(label, []).append(e)
group = st.selectbox("Study or experiment", list(groups), key="cm_group",
                     format_func=lambda g: f"{g} — {len(groups[g])} experiment(s)" if g.startswith("Study") else g)
by_method: dict[str, list[dict[str, Any]]] = {}
for e in sorted(groups[group], key=lambda e: e["id"]):
    by_method.setdefault(e["method"], []).append(e)
chosen = st.multiselect("Methods", list(by_method), default=list(by_method), key=f"cm_methods_{group}",
                        help="Each method with every seed the study ran")
if not chosen:
    st.info("Choose at least one method.")
    st.stop()
selected = [e for method in chosen for e in by_method[method]]
stored = {e["id"]: q.matrices(url, e["id"], q.stamp(e)) for e in selected}
everything = [m for ms in stored.values() for m in ms]
if not everything:
    st.warning("These experiments have no stored compatibility matrices yet.")
    st.stop()
study_download(selected, stored, title=group, key="cm_bundle",
               names={e["id"]: {v["step"]: v.get("name") for v in q.model_versions(url, e["id"], q.stamp(e))}
                      for e in selected})

c = st.columns(4)
metrics = sorted({m["metric"] for m in everything}, key=lambda m: (m != "recall@1", m))
metric = c[0].selectbox("Metric", metrics, format_func=metric_name, key="cm_metric")
gallery_kinds = sorted({m["gallery_kind"] for m in everything})
gallery_kind = c[1].selectbox("Gallery", gallery_kinds, key="cm_gallery")
configured_classes = {settings(e["config"]).eval_classes for e in selected}  # the run's own convention first
classes = sorted({m["eval_classes"] for m in everything}, key=lambda c: (c not in configured_classes, c))
eval_classes = c[2].selectbox("Evaluation classes", classes, key="cm_classes")
views = [MAIN] + sorted({m["view"] for m in everything})
view_choice = c[3].selectbox("Feature view", views, key="cm_view",
                             help="The main view is the one a method is meant to be used with (e.g. PSP for psp)")


def matrix_for(e: dict[str, Any]) -> dict[str, Any] | None:
    ms = [m for m in stored[e["id"]] if m["metric"] == metric and m["gallery_kind"] == gallery_kind
          and m["eval_classes"] == eval_classes]
    if view_choice == MAIN:
        main = q.main_view(e["method"])
        pick = [m for m in ms if m["view"] == main] or [m for m in ms if m["view"] == "encoder"] or ms
    else:
        pick = [m for m in ms if m["view"] == view_choice]
    return pick[0] if pick else None


shown = [(e, matrix_for(e)) for e in selected]
missing = sorted({e["method"] for e, m in shown if m is None})
shown = [(e, m) for e, m in shown if m is not None]
if missing:
    st.caption("No matrix for this metric / gallery / view: " + plain(", ".join(missing)))
if not shown:
    st.warning("No stored matrix matches these choices; try another view or gallery.")
    st.stop()


# ---- summary table and curves: one row per method and view, mean ± std over its seeds
def seed_of(e: dict[str, Any]) -> str:
    return str(e["config"].get("seed", "?"))


FAMILY = {"none": "each cell alone (95 %)", "holm": "Holm over the matrix", "bonferroni": "Bonferroni simultaneous intervals"}


def view_label(e: dict[str, Any], m: dict[str, Any]) -> str:
    main = q.main_view(e["method"])
    if view_choice == MAIN and main and m["view"] != main:
        return f"{m['view']} ({main} not stored)"
    return m["view"]


runs: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}  # (method, view) -> its seeds
for e, m in shown:
    runs.setdefault((e["method"], view_label(e, m)), []).append((e, m))
many_seeds = any(len(r) > 1 for r in runs.values())


family = "none"
if any(m["summary"].get("paired") for _, m in shown):
    family = st.radio("Cross-tests judged", list(FAMILY), format_func=FAMILY.get, horizontal=True, key="cm_family",
                      help="Each cell alone: every cross-test's own 95 % paired interval. A T x T matrix judges "
                           "T(T-1)/2 cells at once; Holm (step-down on the cells' p-values) or Bonferroni-level "
                           "simultaneous intervals keep the chance that any verdict of the matrix is wrong at 5 %.")
summary = pd.DataFrame([summary_row(method, view, [m for _, m in seeds], family)
                        for (method, view), seeds in runs.items()])
st.subheader(f"{metric_name(metric)} · {gallery_kind} gallery · {eval_classes} classes")
conv = state_convention(selected[0]["config"], metrics=metric, views=[m["view"] for _, m in shown], gallery=gallery_kind,
                        eval_classes=eval_classes, ties=stored_ties(shown[0][1]["summary"]))
std_help = "Sample standard deviation over the seeds (n − 1); a dash for a single seed"
table(summary, column_config={**summary_columns(),
    **{f"{name} % std": st.column_config.NumberColumn(f"{name} % std", format="%.1f", help=std_help)
       for name in ("AC", "AA", "ACA")},
    "seeds": st.column_config.NumberColumn("seeds", width="small", help="Runs of the method (one per seed) in the row; "
                                           "AC / AA / ACA are their mean"),
    **{f"{name} % 95% CI": st.column_config.TextColumn(help="Student-t interval of the mean over the seeds "
                                                        "(n − 1 degrees of freedom); a dash for a single seed")
       for name in ("AC", "AA", "ACA")},
    "mean Γ %": st.column_config.TextColumn(help="Update gain (CoReS Eq. 3) averaged over the cross-tests (and the seeds): "
                                            "(cross-test - old self-test) / (new self-test - old self-test), only where "
                                            "the new model beats the old one on its own by at least a point"),
    "cells ✓/✗/?": st.column_config.TextColumn(help="Cross-tests that pass / fail / are too close to call, added over "
                                                "the seeds: by the paired interval (cross - self, same queries; judged as "
                                                "chosen above) where stored, else by the criterion on point estimates "
                                                "(– = not tested)"),
    "AC % range (paired)": st.column_config.TextColumn(help="AC counting only the sure passes, to AC counting every "
                                                        "cross-test that is not a sure failure (mean over the seeds)"),
    "queries without a positive": st.column_config.NumberColumn(
        help="Queries whose class has no image in the gallery, summed over the cells; they are left out of the means"),
}, caption="AC / AA / ACA: mean over the seeds, with their sample standard deviation." if many_seeds else None)
curves = pd.DataFrame([{"method": e["method"], "step": t + 1, "AC_t": ac, "AA_t": aa}
                       for e, m in shown
                       for t, (ac, aa) in enumerate(zip(m["summary"].get("AC_curve", []), m["summary"].get("AA_curve", [])))],
                      columns=["method", "step", "AC_t", "AA_t"])
curves[["AC_t", "AA_t"]] = curves[["AC_t", "AA_t"]].astype(float)
curves = curves.groupby(["method", "step"], as_index=False, sort=False)[["AC_t", "AA_t"]].mean()  # over the seeds
if len(curves) and curves["step"].max() >= 3:
    over = " (mean over the seeds)" if many_seeds else ""
    left, right = st.columns(2)
    for col, value, title, frame in (
            (left, "AC_t", f"AC_t: compatibility of the first t models{over}", curves.dropna(subset=["AC_t"])),
            (right, "AA_t", f"AA_t: mean {metric_name(metric)} of the first t models{over}", curves)):
        with col:
            curve = charts.with_convention(charts.step_curves(frame, value=value, title=title, y_title=charts.axis_title(value),
                                                              percent_axis=True), conv, 60)
            st.altair_chart(curve, width="stretch")
            download_buttons(curve, f"{value}_{metric}", key=f"dl_{value}")

# ---- the same models in every stored view, side by side (the view picker above chooses the matrices below)
by_view = [view_row(e["method"], m) for e in selected for m in stored[e["id"]]
           if m["metric"] == metric and m["gallery_kind"] == gallery_kind and m["eval_classes"] == eval_classes]
if len({r["view"] for r in by_view}) > 1:
    st.subheader("Feature views side by side")
    st.caption("Every stored view of the chosen methods: the encoder and the output-space views (PSP/LSP) of the same "
               "models, same metric, gallery and classes" + (", each the mean over the seeds." if many_seeds else "."))
    values = ["AC %", "AA %", "ACA %", "failing cross-tests"]
    side = pd.DataFrame(by_view).astype({v: float for v in values}).groupby(["method", "view"], sort=False)[values] \
        .mean().unstack("view")
    side.columns = [f"{v} · {k}" for k, v in side.columns]
    table(side[sorted(side.columns)].reset_index(),
          column_config={c: st.column_config.NumberColumn(format="%.1f") for c in side.columns})


summary_rows = [(method if len(runs) == len({k[0] for k in runs}) else f"{method} ({view})",
                 spread_summary([m for _, m in seeds], family)) for (method, view), seeds in runs.items()]
with st.expander("Download the summary table"):
    d = st.columns(3)
    for col, (fmt, ext, mime) in zip(d, (("csv", "csv", "text/csv"), ("markdown", "md", "text/markdown"),
                                         ("latex", "tex", "application/x-tex"))):
        col.download_button(f"Summary ({fmt})", annotate(render_summary_table(summary_rows, fmt=fmt), fmt, conv),
                            file_name=f"summary_{metric}.{ext}", mime=mime, on_click="ignore", key=f"sum_{fmt}")


# ---- the matrices, side by side: one per seed, or each method's mean over its seeds
def given_names(e: dict[str, Any], steps: int) -> list[str]:
    """The models' names: the user's (v1, v2, ...) where given, else M1, M2, ... (a replaced step marked)."""
    given = {v["step"]: v.get("name") for v in q.model_versions(url, e["id"], q.stamp(e))}
    return [given.get(t) or n for t, n in enumerate(model_names(steps, replaced_steps(e["config"])), 1)]


st.subheader("Matrices")
mode = PER_SEED
if many_seeds:
    mode = st.radio("Heatmaps", (AVERAGED, PER_SEED), horizontal=True, key="cm_seed_mode",
                    help="Averaged: each cell is the mean over the seeds, judged by the compatibility criterion, with "
                         "every seed's verdict in the table under it. One per seed: each run's own matrix.")
panels: list[dict[str, Any]] = []
for (method, view), seeds in runs.items():
    shapes = {m["values"].shape for _, m in seeds}
    if mode == AVERAGED and len(seeds) > 1 and len(shapes) == 1:
        e, m = seeds[0]
        panels.append({"e": e, "m": m, "C": stacked_mean([m2["values"] for _, m2 in seeds]), "seeds": seeds,
                       "title": f"{method} · {m['view']} · mean of {len(seeds)} seeds", "paired": None,
                       "valid": None, "key": f"avg_{e['id']}"})
    else:
        for e, m in seeds:
            seed = f" · seed {seed_of(e)}" if many_seeds else ""
            panels.append({"e": e, "m": m, "C": m["values"], "seeds": None, "title": f"{method}{seed} · {m['view']}",
                           "paired": m["summary"].get("paired"),
                           "valid": m["valid_queries"], "key": str(e["id"])})

per_row = 2 if len(panels) > 1 else 1
defined = np.concatenate([p["C"][~np.isnan(p["C"])] for p in panels])
domain = (float(defined.min()), float(defined.max())) if len(defined) else None  # one colour scale for all
for start in range(0, len(panels), per_row):
    cols = st.columns(per_row)
    for col, p in zip(cols, panels[start:start + per_row]):
        e, m, C = p["e"], p["m"], p["C"]
        replaced = replaced_steps(e["config"])
        names = given_names(e, C.shape[0])
        comparable = np.asarray(m["summary"]["comparable"], bool) if m["summary"].get("comparable") else None
        ties = stored_ties(m["summary"])
        ecc = ecc_cells(C, ties)
        shown_test = p["paired"] and {**p["paired"], "verdict": judged(m, family)}  # as judged above the table
        tied = None if p["seeds"] else m["summary"].get("tie_readings")  # one run's ties (a mean has none of its own)
        frame = charts.matrix_frame(C, ecc, names, comparable, p["valid"], shown_test, gain_cells(C)[0].tolist(), tied)
        chart = charts.matrix_heatmap(frame, names, title=p["title"], metric=metric_name(metric),
                                      size=None if per_row == 1 else 400, domain=domain)
        with col:
            line = convention(e["config"], metrics=metric, views=m["view"], gallery=m["gallery_kind"],
                              eval_classes=m["eval_classes"], ties=ties)
            if line != conv:  # said once above when every matrix shares the table's convention
                st.caption(plain(line))
            chart = charts.with_convention(chart, line, 60)
            st.altair_chart(chart, width="content")
            if replaced:
                st.caption(replaced_note(replaced))
            fails = int((frame["status"] == "fail").sum())
            if p["seeds"] is None:
                s = m["summary"]
                span = paired_range([m], family)
                st.markdown(f"{charts.summary_line(s)} · {fails} failing cross-test(s) · cells ✓/✗/? "
                            f"{verdict_total([m], family)}" + (f" · AC range {span} %" if span else "")
                            + (f" ({FAMILY[family]})" if s.get("paired") else ""))
            else:
                st.markdown(f"Mean matrix: {charts.summary_line(summarize(C, ties=ties))} · {fails} failing cross-test(s)")
                st.caption("Each seed's verdict per cross-test (✓ passes the criterion, ✗ fails; the value in %):")
                table(pd.DataFrame(seed_verdicts([(seed_of(se), sm) for se, sm in p["seeds"]], names)))
            if gained := gain_text(C, names):
                st.caption("Update gain Γ: " + plain(gained))
            if tie_words := tie_lines(tied, names, metric):
                st.caption("  \n".join(plain(w) for w in tie_words))
            with st.expander("Download"):
                base = f"{e['name'].replace('/', '_')}_{metric}_{m['view']}" + ("_mean" if p["seeds"] else "")
                d = st.columns(3)
                for dcol, (fmt, ext, mime) in zip(d, (("csv", "csv", "text/csv"), ("markdown", "md", "text/markdown"),
                                                      ("latex", "tex", "application/x-tex"))):
                    dcol.download_button(fmt.upper() if fmt == "csv" else fmt.capitalize(),
                                         lambda C=C, fmt=fmt, t=p["title"], cm=comparable, r=replaced, line=line, m=m,
                                         n=names, pr=p["paired"], tr=tied: annotate(
                                             matrix_download(C, fmt, m, title=t, comparable=cm, replaced=r, names=n,
                                                             paired=pr, family=family, tie_readings=tr), fmt, line),
                                         file_name=f"{base}.{ext}", mime=mime, on_click="ignore",
                                         key=f"dl_{p['key']}_{fmt}")
                download_buttons(chart, f"{base}_chart", key=f"dl_{p['key']}_chart")


# ---- the same cells under both evaluation conventions (a run stores the second with eval.also_eval_classes)
def under_both(e: dict[str, Any], m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The experiment's matrices of ``m``'s metric, gallery and view by evaluation classes (one when only one is stored)."""
    return {o["eval_classes"]: o for o in stored[e["id"]] if (o["metric"], o["gallery_kind"], o["view"])
            == (m["metric"], m["gallery_kind"], m["view"])}


both = [(e, m) for e, m in shown if set(EVAL_CLASSES) <= set(under_both(e, m))]
if both:
    st.subheader("The same cells under seen and all classes")
    pick = 0
    if len(both) > 1:
        pick = st.selectbox("Experiment", range(len(both)), key="cm_both",
                            format_func=lambda i: f"{both[i][0]['method']} · seed {seed_of(both[i][0])} · {both[i][1]['view']}")
    e, m = both[pick]
    configured = settings(e["config"]).eval_classes
    pair = under_both(e, m)
    order = sorted(EVAL_CLASSES, key=lambda c: c != configured)  # the configured convention first
    cells = np.concatenate([pair[c]["values"][~np.isnan(pair[c]["values"])] for c in order])
    scale = (float(cells.min()), float(cells.max())) if len(cells) else None  # one colour scale for both
    names = given_names(e, m["values"].shape[0])
    panels_both = []
    for c in order:
        o = pair[c]
        comparable = np.asarray(o["summary"]["comparable"], bool) if o["summary"].get("comparable") else None
        frame = charts.matrix_frame(o["values"], ecc_cells(o["values"], stored_ties(o["summary"])), names, comparable,
                                    o["valid_queries"], None, gain_cells(o["values"])[0].tolist())
        mark = " (configured)" if c == configured else ""
        panels_both.append(charts.matrix_heatmap(frame, names, title=f"{c} classes{mark} · {charts.summary_line(o['summary'], bold=False)}",
                                                 metric=metric_name(metric), size=360, domain=scale))
    figure = charts.with_convention(charts.side_by_side(panels_both, f"{e['method']} · {m['view']} · seen vs all classes"),
                                    convention(e["config"], metrics=metric, views=m["view"], gallery=m["gallery_kind"],
                                               eval_classes="seen and all", ties=stored_ties(m["summary"])), 100)
    st.altair_chart(figure, width="content")
    st.caption(f"This run was configured with eval_classes = {configured}; the other convention is stored beside it "
               "(eval.also_eval_classes). **seen** counts only the queries and gallery images of the classes the "
               "gallery (old) model was trained on: both models of a cross-test trained them. **all** counts every "
               "test class, so a cell also holds classes only the newer model learned, which the old gallery has no "
               "direction for. Neither is the papers' open-set protocol, whose test classes no model trained on: "
               "under seen a newer model that must also tell the old classes from its new ones can be worse on them "
               "than the old model was (then no cross-test beats the old self-test); under all its gain comes from "
               "classes the old model never learned. Read both; docs/results.md measures how far each moves the "
               "papers' claims.")
    download_buttons(figure, f"{e['name'].replace('/', '_')}_{metric}_{m['view']}_seen_vs_all", key="dl_both_chart")
