"""Compatibility: the lower-triangular matrices (failing cross-tests marked), AC / AA / ACA and their curves."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from app import charts
from app.exports import download_buttons, study_download
from app import queries as q
from app.widgets import empty_state, experiment_label, plain, state_convention, summary_columns, table
from engine.results.conventions import annotate, convention, model_names, replaced_note, replaced_steps

url = q.db_url()
MAIN = "main view of each method"
METRIC_NAMES = {"recall@1": "Recall@1", "map": "mAP"}

st.title("Compatibility")
st.caption("Row = query model (new), column = gallery model (old). A cross-test passes the empirical compatibility "
           "criterion when C[t, k] > C[k, k]; failing cells are boxed in red and marked ✗, as in the papers. "
           "AC = share of passing cross-tests, AA = mean of the lower triangle, ACA = accuracy of the passing ones.")


def metric_name(metric: str) -> str:
    return METRIC_NAMES.get(metric, metric)


@st.cache_data(ttl=q.RESULT_TTL, show_spinner=False)
def ecc_cells(values: np.ndarray) -> np.ndarray:
    from engine.metrics import ecc_pass

    return ecc_pass(values)


def export(C: np.ndarray, fmt: str, title: str, comparable: np.ndarray | None, replaced: tuple[int, ...],
           m: dict[str, Any]) -> str:
    from engine.results.report import render_matrix

    return render_matrix(C, fmt=fmt, title=title, comparable=comparable, replaced=replaced, metric=m["metric"],
                         view=m["view"], protocol=m["protocol"], eval_classes=m["eval_classes"],
                         paired=m["summary"].get("paired") if fmt == "csv" else None)


experiments = [e for e in q.experiments(url) if e["status"] == "done"]
if not experiments:
    empty_state(url, "finished experiments")
    st.stop()

# ---- what to show: a study (its methods side by side) or a single experiment
groups: dict[str, list[dict[str, Any]]] = {}
for e in experiments:
    label = f"Study: {e['study']} (#{e['study_id']})" if e["study_id"] is not None else f"Experiment: {experiment_label(e)}"
    groups.setdefault(label, []).append(e)
group = st.selectbox("Study or experiment", list(groups), key="cm_group",
                     format_func=lambda g: f"{g} — {len(groups[g])} method(s)" if g.startswith("Study") else g)
members = sorted(groups[group], key=lambda e: e["id"])
by_label = {f"{e['method']} (#{e['id']})": e for e in members}
chosen = st.multiselect("Methods", list(by_label), default=list(by_label), key=f"cm_methods_{group}")
if not chosen:
    st.info("Choose at least one method.")
    st.stop()
selected = [by_label[m] for m in chosen]
stored = {e["id"]: q.matrices(url, e["id"], q.stamp(e)) for e in selected}
everything = [m for ms in stored.values() for m in ms]
if not everything:
    st.warning("These experiments have no stored compatibility matrices yet.")
    st.stop()
study_download(selected, stored, title=group, key="cm_bundle")

c = st.columns(4)
metrics = sorted({m["metric"] for m in everything}, key=lambda m: (m != "recall@1", m))
metric = c[0].selectbox("Metric", metrics, format_func=metric_name, key="cm_metric")
protocols = sorted({m["protocol"] for m in everything})
protocol = c[1].selectbox("Gallery protocol", protocols, key="cm_protocol")
classes = sorted({m["eval_classes"] for m in everything})
eval_classes = c[2].selectbox("Evaluation classes", classes, key="cm_classes")
views = [MAIN] + sorted({m["view"] for m in everything})
view_choice = c[3].selectbox("Feature view", views, key="cm_view",
                             help="The main view is the one a method is meant to be used with (e.g. PSP for psp)")


def matrix_for(e: dict[str, Any]) -> dict[str, Any] | None:
    ms = [m for m in stored[e["id"]] if m["metric"] == metric and m["protocol"] == protocol
          and m["eval_classes"] == eval_classes]
    if view_choice == MAIN:
        main = q.main_view(e["method"])
        pick = [m for m in ms if m["view"] == main] or [m for m in ms if m["view"] == "encoder"] or ms
    else:
        pick = [m for m in ms if m["view"] == view_choice]
    return pick[0] if pick else None


shown = [(e, matrix_for(e)) for e in selected]
missing = [e for e, m in shown if m is None]
shown = [(e, m) for e, m in shown if m is not None]
if missing:
    st.caption("No matrix for this metric / protocol / view: " + ", ".join(e["method"] for e in missing))
if not shown:
    st.warning("No stored matrix matches these choices; try another view or protocol.")
    st.stop()

# ---- summary table and curves
def mean_gain(summary: dict[str, Any]) -> float | None:
    """The update gain Γ in %, averaged over the defined cross-tests (None when not stored or undefined)."""
    g = np.array([[np.nan if v is None else v for v in row] for row in summary.get("update_gain") or []], dtype=float)
    g = g[~np.isnan(g)] if g.size else g
    return float(100 * g.mean()) if g.size else None


def verdict_counts(summary: dict[str, Any]) -> str:
    """``pass/fail/unresolved`` counts of the stored paired test, or ``-`` for matrices stored without one."""
    from engine.metrics.paired import count_verdicts

    p = summary.get("paired")
    if not p:
        return "-"
    n = count_verdicts(p["verdict"])
    return f"{n['pass']}/{n['fail']}/{n['unresolved']}"


def view_label(e: dict[str, Any], m: dict[str, Any]) -> str:
    main = q.main_view(e["method"])
    if view_choice == MAIN and main and m["view"] != main:
        return f"{m['view']} ({main} not stored)"
    return m["view"]


summary = pd.DataFrame([{
    "method": e["method"], "view": view_label(e, m), "steps": m["values"].shape[0], **charts.summary_percent(m["summary"]),
    "mean Γ %": mean_gain(m["summary"]),
    "paired ✓/✗/?": verdict_counts(m["summary"]),
    "queries without a positive": int(np.nansum(np.tril(m["no_positive"]))),
} for e, m in shown])
st.subheader(f"{metric_name(metric)} · {protocol} gallery · {eval_classes} classes")
conv = state_convention(selected[0]["config"], metrics=metric, views=[m["view"] for _, m in shown], gallery=protocol,
                        eval_classes=eval_classes)
table(summary, column_config={**summary_columns(),
    "mean Γ %": st.column_config.NumberColumn(format="%.1f", help="Update gain (CoReS Eq. 3) averaged over the cross-tests: "
                                              "(cross-test - old self-test) / (new self-test - old self-test)"),
    "paired ✓/✗/?": st.column_config.TextColumn(help="Cross-tests whose paired bootstrap interval (cross - self, same "
                                                 "queries) lies above 0 / below 0 / straddles 0"),
    "queries without a positive": st.column_config.NumberColumn(
        help="Queries whose class has no image in the gallery, summed over the cells; they are left out of the means"),
})
curves = pd.DataFrame([{"method": e["method"], "step": t + 1, "AC_t": ac, "AA_t": aa}
                       for e, m in shown
                       for t, (ac, aa) in enumerate(zip(m["summary"].get("AC_curve", []), m["summary"].get("AA_curve", [])))])
if len(curves) and curves["step"].max() >= 3:
    left, right = st.columns(2)
    for col, value, title, frame in (
            (left, "AC_t", "AC_t: compatibility of the first t models", curves.dropna(subset=["AC_t"])),
            (right, "AA_t", f"AA_t: mean {metric_name(metric)} of the first t models", curves)):
        with col:
            curve = charts.with_convention(charts.step_curves(frame, value=value, title=title, y_title=value,
                                                              percent_axis=True), conv, 60)
            st.altair_chart(curve, width="stretch")
            download_buttons(curve, f"{value}_{metric}", key=f"dl_{value}")

# ---- the same models in every stored view, side by side (the view picker above chooses the matrices below)
by_view = [{"method": e["method"], "view": m["view"],
            **{f"{k} %": None if m["summary"].get(k) is None else 100 * m["summary"][k] for k in ("AC", "AA", "ACA")},
            "failing cross-tests": int(np.sum(ecc_cells(m["values"]) == 0))}
           for e in selected for m in stored[e["id"]]
           if m["metric"] == metric and m["protocol"] == protocol and m["eval_classes"] == eval_classes]
if len({r["view"] for r in by_view}) > 1:
    st.subheader("Feature views side by side")
    st.caption("Every stored view of the chosen methods: the encoder and the output-space views (PSP/LSP) of the same "
               "models, same metric, protocol and classes.")
    side = pd.DataFrame(by_view).pivot(index="method", columns="view", values=["AC %", "AA %", "ACA %", "failing cross-tests"])
    side.columns = [f"{v} · {k}" for k, v in side.columns]
    table(side[sorted(side.columns)].reset_index(),
          column_config={c: st.column_config.NumberColumn(format="%.1f") for c in side.columns})
summary_rows = [(e["method"], m["summary"]) for e, m in shown]
with st.expander("Download the summary table"):
    from engine.results.report import render_summary_table

    d = st.columns(3)
    for col, (fmt, ext, mime) in zip(d, (("csv", "csv", "text/csv"), ("markdown", "md", "text/markdown"),
                                         ("latex", "tex", "application/x-tex"))):
        col.download_button(f"Summary ({fmt})", annotate(render_summary_table(summary_rows, fmt=fmt), fmt, conv),
                            file_name=f"summary_{metric}.{ext}", mime=mime, on_click="ignore", key=f"sum_{fmt}")

# ---- the matrices, side by side
st.subheader("Matrices")
per_row = 2 if len(shown) > 1 else 1
defined = np.concatenate([m["values"][~np.isnan(m["values"])] for _, m in shown])
domain = (float(defined.min()), float(defined.max())) if len(defined) else None  # one colour scale for all
for start in range(0, len(shown), per_row):
    cols = st.columns(per_row)
    for col, (e, m) in zip(cols, shown[start:start + per_row]):
        C = m["values"]
        replaced = replaced_steps(e["config"])
        names = model_names(C.shape[0], replaced)
        given = {v["step"]: v.get("name") for v in q.model_versions(url, e["id"], q.stamp(e))}
        names = [given.get(t) or n for t, n in enumerate(names, 1)]  # the user's names (v1, v2, ...) where given
        comparable = np.asarray(m["summary"]["comparable"], bool) if m["summary"].get("comparable") else None
        s = m["summary"]
        frame = charts.matrix_frame(C, ecc_cells(C), names, comparable, m["valid_queries"], s.get("paired"),
                                    s.get("update_gain"))
        title = f"{e['method']} · {m['view']}"
        chart = charts.matrix_heatmap(frame, names, title=title, metric=metric_name(metric),
                                      size=None if per_row == 1 else 400, domain=domain)
        with col:
            line = convention(e["config"], metrics=metric, views=m["view"], gallery=m["protocol"],
                              eval_classes=m["eval_classes"])
            if line != conv:  # said once above when every matrix shares the table's convention
                st.caption(plain(line))
            chart = charts.with_convention(chart, line, 60)
            st.altair_chart(chart, width="content")
            if replaced:
                st.caption(replaced_note(replaced))
            fails = int((frame["status"] == "fail").sum())
            st.markdown(f"{charts.summary_line(s)} · {fails} failing cross-test(s)"
                        + (f" · paired ✓/✗/? {verdict_counts(s)}" if s.get("paired") else ""))
            gains = frame.dropna(subset=["gain"])
            if len(gains):
                st.caption("Update gain Γ: " + ", ".join(f"{r.query}→{r.gallery} {100 * r.gain:.1f} %" for r in gains.itertuples()))
            with st.expander("Download"):
                base = f"{e['name'].replace('/', '_')}_{metric}_{m['view']}"
                d = st.columns(3)
                for dcol, (fmt, ext, mime) in zip(d, (("csv", "csv", "text/csv"), ("markdown", "md", "text/markdown"),
                                                      ("latex", "tex", "application/x-tex"))):
                    dcol.download_button(fmt.upper() if fmt == "csv" else fmt.capitalize(),
                                         lambda C=C, fmt=fmt, t=title, cm=comparable, r=replaced, line=line, m=m:
                                         annotate(export(C, fmt, t, cm, r, m), fmt, line),
                                         file_name=f"{base}.{ext}", mime=mime, on_click="ignore",
                                         key=f"dl_{e['id']}_{fmt}")
                download_buttons(chart, f"{base}_chart", key=f"dl_{e['id']}_chart")
