"""Backfilling: retrieval while the old gallery is re-embedded by the new model, for several orderings."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app import charts
from app.exports import download_buttons
from app import queries as q
from app.widgets import (MISSING, analysis_result, follow_jobs, launch, pick_experiment, pick_steps, plain,
                         state_convention)
from engine.core.contract import ADAPTER_KINDS, analysis_key, DEFAULT_ORDERINGS, ORDERING_HELP, ORDERINGS, adapter_key, adapters_payload, same_set_of
from engine.core.conventions import metric_name
from engine.core.kinds import adapter_label
from engine.read.verdicts import artefact_note, best_by_area, metric_order, needs_lines

url = q.db_url()

st.title("Backfilling")
st.caption("New-model queries against a gallery that starts embedded by the old model; gallery items are re-embedded "
           "by the new model in the chosen order. 0% = the cross-test, 100% = the new model's self-test. "
           "M̃ is the area under the curve (the expected metric over a uniformly random backfilling fraction).")

picked = pick_experiment(url, key="bf_experiment")
if picked is None:
    st.stop()
experiment, versions = picked
c = st.columns([1, 1, 1, 3])
old, new = pick_steps(versions, key="bf_steps", columns=[c[0], c[1]])
views = [v for v in old["views"] if v in new["views"] and v not in ("softmax",)]
main = q.main_view(experiment["method"])
view = c[2].selectbox("View", views, index=views.index(main) if main in views else 0,
                      key=f"bf_view_{experiment['id']}")  # each experiment starts on its main view
orderings = c[3].multiselect("Orderings", ORDERINGS, default=list(DEFAULT_ORDERINGS),
                             key="bf_orderings", help="; ".join(f"{k}: {v}" for k, v in ORDERING_HELP.items()))
if not orderings:
    st.info("Choose at least one ordering.")
    st.stop()
params = {"step_a": old["step"], "step_b": new["step"], "view": view, "orderings": orderings,
          "metrics": ["recall@1", "map"]}
if st.checkbox("Roll-out curves: rank merge and candidate re-scoring", key="bf_rollout",
               help="Also the rank merge of the old index (old-model queries) and the new index (new-model queries) "
                    "while items move in each ordering, and the old index's top K re-ranked by the new model (a curve "
                    "over K as a fraction of the gallery); each with its M̃ and the share needed to reach either "
                    "self-test. Computed once per choice; re-scoring sorts every query block once per point."):
    params["rollout"] = True

with st.expander("Mapping adapters (paper 004): align the two models, then backfill in the adapted spaces"):
    st.caption("Trains a forward adapter F (old → new) and a backward adapter B (new → old) on the stored training "
               "features of the two frozen models; B⊥ is strictly orthogonal, B_λ affine with the λ-orthogonality "
               "regulariser, FCT maps forward only. The adapted views are stored as F(...) / B(...) on the models.")
    a1, a2 = st.columns([1, 3])
    kind = a1.selectbox("Adapter", ADAPTER_KINDS, key="bf_adapter_kind",
                        format_func=adapter_label)
    adapters_key = adapter_key(old["id"], new["id"], kind, view)
    same_set = same_set_of(experiment["config"])
    adapted = q.stored_analysis(url, experiment["id"], "adapters", adapters_key, q.stamp(experiment))
    if a2.button("Train adapters", key="bf_adapter_train", disabled=old["step"] >= new["step"]):
        launch(url, "adapters", adapters_payload(old["id"], new["id"], kind=kind, view=view, same_set=same_set),
               experiment_id=experiment["id"])
    follow_jobs(url, "adapters", experiment_id=experiment["id"])  # progress here; the table appears when done
    if adapted is None:
        st.caption("Not trained yet for these steps, view and adapter.")
    else:
        ap = adapted["payload"]
        state_convention(experiment["config"], metrics=("recall@1", "map"), views=view, gallery="instance",
                         eval_classes="all", ecc=False)
        table = pd.DataFrame([{"query / gallery": r["row"], "Recall@1 %": 100 * r["recall@1"], "mAP %": 100 * r["map"]}
                              for r in ap["table"]])
        st.dataframe(table, hide_index=True, placeholder=MISSING,
                     column_config={c: st.column_config.NumberColumn(format="%.2f") for c in ("Recall@1 %", "mAP %")})
        st.dataframe(pd.DataFrame([{"ordering": o, "M̃ Recall@1 %": 100 * c["area"]["recall@1"],
                                    "M̃ mAP %": 100 * c["area"]["map"]} for o, c in ap["backfill"].items()]),
                     hide_index=True, placeholder=MISSING)

result = analysis_result(url, experiment, "backfill", params, what="the backfilling curves", button_key="bf_compute")
if result is None:
    st.stop()
p = result["payload"]
for note in p.get("notes", []):
    st.info(plain(note))
st.caption(f"Steps {old['step']} → {new['step']} · {p['n_gallery']} gallery items · {p['n_valid']} of {p['n_queries']} "
           f"queries scored" + (f" ({p['n_no_positive']} have no positive in the gallery and are left out)"
                                if p["n_no_positive"] else "")
           + (" · closed-set: each query's own image excluded" if p["same_set"] else ""))
conv = state_convention(experiment["config"], metrics=p["params"]["metrics"], views=view, gallery="instance",
                        ecc=False, extra=[f"random-order seed {p['params'].get('seed', 0)}"])

metrics = metric_order(p["params"]["metrics"])  # the metric that does not flatter (mAP) first
cols = st.columns(len(metrics))
for col, metric in zip(cols, metrics):
    name = metric_name(metric)
    curves = pd.DataFrame([{"ordering": o, "fraction": f, "value": v}
                           for o, by_metric in p["curves"].items() for f, v in zip(p["fractions"], by_metric[metric])])
    refs = pd.DataFrame([{"kind": "self", "label": f"new model's self-test {charts.percent(p['self_test'][metric])}",
                          "value": p["self_test"][metric]},
                         {"kind": "cross", "label": f"cross-test (nothing backfilled) {charts.percent(p['cross_test'][metric])}",
                          "value": p["cross_test"][metric]}]).dropna()
    col.altair_chart(chart := charts.with_convention(charts.backfill_chart(curves, refs, metric=name), conv, 70),
                     width="stretch")
    with col:
        download_buttons(chart, f"backfill_{metric}", key=f"dl_backfill_{metric}")

st.subheader("M̃ and the backfilling needed")
rows = []
for o in p["curves"]:
    row = {"ordering": o}
    for metric in metrics:
        name = metric_name(metric)
        row[f"M̃ {name} %"] = None if p["area"][o][metric] is None else 100 * p["area"][o][metric]
        reach = p["reach"][o][metric]
        row[f"{name}: backfilled to match new"] = reach.get("1")
        row[f"{name}: to reach 99% of it"] = reach.get("0.99")
    rows.append(row)
table = pd.DataFrame(rows)
config = {c: st.column_config.NumberColumn(format="%.2f") for c in table.columns if c.startswith("M̃")}
config.update({c: st.column_config.NumberColumn(format="percent") for c in table.columns if ": " in c})
st.dataframe(table, hide_index=True, placeholder=MISSING, width="stretch", column_config=config)
first = metric_name(metrics[0])
best = best_by_area({o: p["area"][o][metrics[0]] for o in p["curves"]})
reach = None if best is None else p["reach"][best][metrics[0]].get("1")
named = "" if best is None else (f"**{best}** has the largest area under its {first} curve "
                                 f"(M̃ {charts.percent(p['area'][best][metrics[0]])})")
if best is None:
    st.markdown(f"No ordering has a {first} curve to compare.")
elif reach is None:
    st.markdown(f"{named}, but no fraction of it reaches the new model's {first} "
                f"({charts.percent(p['self_test'][metrics[0]])}).")
elif reach == 0:
    st.markdown(f"{named}; the cross-test already matches the new model's {first} "
                f"({charts.percent(p['self_test'][metrics[0]])}): no backfilling is needed.")
else:
    st.markdown(f"{named}; it reaches the new model's {first} ({charts.percent(p['self_test'][metrics[0]])}) after "
                f"backfilling **{100 * reach:.0f}%** of the gallery.")
if best is not None:
    st.markdown("In that order, per metric: " + "; ".join(
        needs_lines({m: p["reach"][best][m].get("1") for m in metrics}, "the new model")) + ".")
decision = q.stored_analysis(url, experiment["id"], "upgrade",
                             analysis_key("upgrade", {"step_a": old["step"], "step_b": new["step"], "view": view}),
                             q.stamp(experiment))  # the decision's metric by default (engine.core.vocab.decision_metric)
if decision and (plan := decision["payload"].get("plan")) and "headline" in plan:
    st.info(plain(f"Decision (Upgrade check, {plan['metric']}): {plan['headline']}. {plan['reason']}"),
            icon=":material/route:")
else:
    st.caption("What to do (ship, adapt, or backfill how much in which order) is the Upgrade check's one decision: it "
               "reads the backfill to the old model's self-test on a metric that does not flatter backfilling.")
if note := artefact_note(metrics):
    st.caption(note)
st.caption("The fraction columns: the smallest share of the gallery to backfill for the curve to reach the new "
           "model's self-test (or 99% of it), reading the curve as piecewise linear.")

if roll := p.get("rollout"):
    st.subheader("Roll-out: rank merge and candidate re-scoring")
    st.caption("Rank merge: each item lives in one index, the old one (searched with old-model queries) until it is "
               "moved, then the new one (new-model queries); results merged by similarity. Candidate re-scoring: the "
               "old index's top K re-ranked by the new model, K as a share of the gallery. 0% = old-model queries on "
               "the old gallery, 100% = the new model's self-test.")
    named = {**{f"rank merge, {o}": c for o, c in roll["rank_merge"].items()}, "candidate re-scoring": roll["rescoring"]}
    grids = {k: (roll["rescoring"]["fractions"] if k == "candidate re-scoring" else p["fractions"]) for k in named}
    cols = st.columns(len(metrics))
    for col, metric in zip(cols, metrics):
        name = metric_name(metric)
        curves = pd.DataFrame([{"ordering": k, "fraction": f, "value": v} for k, c in named.items()
                               for f, v in zip(grids[k], c["curves"][metric])])
        refs = pd.DataFrame([{"kind": "self", "label": f"new model's self-test {charts.percent(roll['self_test']['new'][metric])}",
                              "value": roll["self_test"]["new"][metric]},
                             {"kind": "cross", "label": f"old model's self-test {charts.percent(roll['self_test']['old'][metric])}",
                              "value": roll["self_test"]["old"][metric]}]).dropna()
        col.altair_chart(charts.with_convention(charts.backfill_chart(curves, refs, metric=name), conv, 70), width="stretch")
    rows = []
    summaries = {**{f"item replacement, {o}": s for o, s in roll["replacement_summary"].items()},
                 **{k: c["summary"] for k, c in named.items()}}
    for k, summary in summaries.items():
        row = {"curve": k}
        for metric in metrics:
            name = metric_name(metric)
            row[f"M̃ {name} %"] = None if summary[metric]["area"] is None else 100 * summary[metric]["area"]
            row[f"{name}: to reach old"] = summary[metric]["reach_old"]
            row[f"{name}: to reach new"] = summary[metric]["reach_new"]
        rows.append(row)
    table = pd.DataFrame(rows)
    config = {c: st.column_config.NumberColumn(format="%.2f") for c in table.columns if c.startswith("M̃")}
    config.update({c: st.column_config.NumberColumn(format="percent") for c in table.columns if ": " in c})
    st.dataframe(table, hide_index=True, placeholder=MISSING, width="stretch", column_config=config)
    st.caption("To reach old / new: the smallest share of the gallery (moved, or re-scored per query) at which the "
               "curve reaches the old model's / the new model's self-test, empty when it never does.")
