"""Upgrade check: can the new model ship without re-indexing the gallery, and if not, how much must be re-embedded?"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app import queries as q
from app.evidence_view import evidence_expander
from app.plan_view import decision_box, plan_section
from app.report_download import report_button
from app.sources_form import sources_section
from app.text_upgrade_view import text_task
from app.widgets import MISSING, analysis_result, model_label, pick_experiment, pick_rule, pick_steps, plain
from engine.core.contract import ADAPTER_KINDS, adapter_key, adapters_payload, analysis_key, same_set_of
from engine.core.conventions import metric_name
from engine.core.kinds import adapter_label
from engine.read.verdicts import (artefact_note, interval, metric_order, needs_lines, pick_rollout, sentence, share,
                                  tie_line)

url = q.db_url()
METRICS = ("map", "recall@1", "recall@5")  # the decision's metric first (engine.core.vocab.decision_metric)
VERDICT_BOX = {"compatible": st.success, "not compatible": st.error, "too close to call": st.warning}

st.title("Upgrade check")
st.caption("Paper 002's empirical compatibility criterion: new-model queries searched against the gallery the old model "
           "embedded must score above the old model on its own. Paired over the queries, with a seeded percentile "
           "bootstrap interval that resamples the queries and, for Recall@k, the gallery items too (both are "
           "samples): when it straddles 0 the answer is *too close to call*.")
st.page_link("app_pages/checkpoints.py", label="Upload your own v1 and v2 on Checkpoints; each comparison is an "
             "experiment you can pick here", icon=":material/upload_file:")
evidence_expander()  # docs/evidence/summary.json: sampled decisions against whole-corpus ones
FROM_STORE = "From a table or store"
if st.radio("Embeddings", ("From a stored experiment", FROM_STORE), horizontal=True, key="up_mode") == FROM_STORE:
    sources_section(url)  # app/sources_form.py: queue a check on sources, show its stored report
    st.stop()

picked = pick_experiment(url, key="up_experiment")
if picked is None:
    st.stop()
experiment, versions = picked
if text_task(experiment["config"]) is not None:  # a text comparison: its summary of every pair lives on Checkpoints
    st.page_link("app_pages/checkpoints.py", icon=":material/fact_check:", label="A text comparison: every pair, every "
                 "metric and the adapters in one summary under Text-embedding upgrade results on Checkpoints")
c = st.columns(4)
old, new = pick_steps(versions, key="up_steps", columns=[c[0], c[1]])
metric = c[2].selectbox("Metric", METRICS, format_func=metric_name, key="up_metric")
views = [v for v in old["views"] if v in new["views"] and v not in ("logits", "softmax")]
main = q.main_view(experiment["method"])
view = c[3].selectbox("View", views, index=views.index(main) if main in views else 0, key=f"up_view_{experiment['id']}")
margin, ties = pick_rule(key="up_rule", columns=st.columns([1, 2, 1])[:2])
old_name, new_name = model_label(old), model_label(new)


def arrow(diff: float) -> str:
    """A metric's delta arrow for a signed difference: up, down, or none for 0."""
    return "up" if diff > 0 else "down" if diff < 0 else "off"

with st.expander("Name these models (v1, v2, ...)"):
    n1, n2, n3 = st.columns([2, 2, 1])
    given = (n1.text_input(f"Name of step {old['step']}", old.get("name") or "", max_chars=40, key="up_name_old"),
             n2.text_input(f"Name of step {new['step']}", new.get("name") or "", max_chars=40, key="up_name_new"))
    if n3.button("Save names", key="up_rename"):
        try:
            q.rename_models(url, {old["id"]: given[0], new["id"]: given[1]})
            st.rerun()
        except ValueError as exc:
            st.error(plain(str(exc)))

params = {"step_a": old["step"], "step_b": new["step"], "view": view, "metric": metric, "margin": margin, "ties": ties}
result = analysis_result(url, experiment, "upgrade", params, what="the upgrade verdict", button_key="up_compute")
if result is None:
    st.stop()
p = result["payload"]
r = {**p["report"], "old_name": old_name, "new_name": new_name}  # names as they are now (renames apply at once)
comp, better = r["compatibility"], r["better"]
VERDICT_BOX[r["verdict"]](plain(sentence(r)))
decision_box(p.get("plan"))  # the one decision; its details close the page
for note in p.get("notes", []):
    st.info(plain(note))

k = st.columns(4)
k[0].metric(plain(f"ECC gain ({new_name} / {old_name} − {old_name} / {old_name})"), f"{100 * comp['diff']:+.1f} pts",
            help="New-model queries against the old gallery minus the old model's self-test, in points")
k[1].metric(f"{100 * r['level']:g}% CI of the gain", f"{100 * comp['lo']:+.1f} to {100 * comp['hi']:+.1f}")
# a word as the delta: its arrow follows the sign of the difference (a text delta would always point up)
k[2].metric(plain(f"{new_name} on its own vs {old_name}"), f"{100 * better['diff']:+.1f} pts", better["verdict"],
            delta_color="off", delta_arrow=arrow(round(100 * better["diff"], 1)))  # the shown number's sign
k[3].metric("Queries scored", f"{comp['n']}", f"{r['n_no_positive']} without a positive" if r["n_no_positive"] else None,
            delta_color="off", delta_arrow="off")
if r["verdict"] == "too close to call":  # the interval contains the rule's threshold (0, or minus the margin)
    threshold = f"−{r['margin']:g} points (the margin)" if r.get("margin") else "0"
    decide = (p.get("plan") or {}).get("margin_to_decide")
    st.warning(f"Too close to call: the {100 * r['level']:g}% interval of the gain ({interval(comp, r['level'])}) "
               f"contains {threshold}. More queries would decide it"
               + (f", or a non-inferiority margin of {decide:g} points (the new model's queries may lose up to that "
                  "much against the old model alone)." if decide else "."))
st.caption(plain(f"{metric_name(r['metric'])} · view {view} · {r['n_queries']} queries, {r['n_gallery']} gallery items"
                 f"{' · closed-set: each query’s own image excluded' if r['same_set'] else ''} · paired percentile "
                 f"bootstrap over {r.get('bootstrap', {}).get('paired_over', 'queries')}, {r['resamples']:,} resamples, "
                 f"seed {r['seed']}"))  # what the stored interval resampled (older analyses: queries)
if tied := tie_line(r):  # Recall@k: each cell's ties and its value under each reading
    st.caption(plain(tied))
st.dataframe(pd.DataFrame([{"query / gallery": f"{a} / {b}", f"{metric_name(r['metric'])} %": 100 * v}
                           for a, b, v in ((old_name, old_name, r["old_old"]), (new_name, old_name, r["new_old"]),
                                           (new_name, new_name, r["new_new"]))]), hide_index=True, placeholder=MISSING,
             column_config={f"{metric_name(r['metric'])} %": st.column_config.NumberColumn(format="%.1f")})

def stored_reports() -> dict[str, dict]:
    """The upgrade verdicts stored for these two models and view under each metric (this one included)."""
    out = {metric: r}
    for m in METRICS:
        key = analysis_key("upgrade", {**params, "metric": m})
        if m != metric and (hit := q.stored_analysis(url, experiment["id"], "upgrade", key, q.stamp(experiment))):
            out[m] = hit["payload"]["report"]
    return out


def backfill_needs() -> str:
    """The backfilling needed per stored metric, the one that does not flatter (mAP) first, each in the ordering the
    plan's rule picks (:func:`engine.upgrade.plan.pick_rollout`: fewest items to reach the old self-test); a metric under
    which the pair is already compatible needs none; mAP named when not computed."""
    parts = []
    reach = {m: (pick_rollout(rep["backfill"]) or {}).get("to_old_self") for m, rep in reports.items() if rep["backfill"]}
    lines = dict(zip(metric_order(reach), needs_lines(reach, old_name)))
    for m in metric_order(reports):
        parts.append(lines.get(m) or f"{metric_name(m)}: no backfilling needed ({reports[m]['verdict']})")
    missing = "" if "map" in reports else " (mAP, which does not flatter, is not computed yet: choose it as the metric)"
    return "Backfilling needed, per metric: " + "; ".join(parts) + "." + missing


reports = stored_reports()
if r["backfill"]:
    st.subheader("Backfilling curves")
    st.markdown(plain(f"Not compatible: the curves of re-embedding part of the gallery with {new_name}, under "
                      f"{metric_name(r['metric'])}. M̃ is the area under a curve (the metric averaged over a uniformly "
                      "random backfilled share); the migration plan below picks the ordering that reaches "
                      f"{old_name}'s self-test with the fewest items, read on a metric that does not flatter backfilling."))
    st.dataframe(pd.DataFrame([{"ordering": n["ordering"],
                                "M̃ %": 100 * n["area"], f"to reach {old_name}'s self-test": share(n["to_old_self"]),
                                f"to reach {new_name}'s self-test": share(n["to_new_self"])} for n in r["backfill"]]),
                 hide_index=True, placeholder=MISSING,
                 column_config={"M̃ %": st.column_config.NumberColumn(format="%.2f")})
    st.markdown(plain(backfill_needs()))
    if note := artefact_note(reports):
        st.caption(note)

    st.subheader("Without backfilling: mapping adapters (paper 004)")
    adapters = {kind: hit["payload"] for kind in ADAPTER_KINDS
                if (hit := q.stored_analysis(url, experiment["id"], "adapters", adapter_key(old["id"], new["id"], kind, view),
                                             q.stamp(experiment))) is not None}
    if adapters:
        rows = [{"adapter": adapter_label(kind), "query / gallery": row["row"],
                 "Recall@1 %": 100 * row["recall@1"], "mAP %": 100 * row["map"]}
                for kind, a in adapters.items() for row in a["table"]]
        st.dataframe(pd.DataFrame(rows), hide_index=True, placeholder=MISSING)
    else:
        st.caption("No adapters stored for these two models and view yet. Fitting them trains a forward and a backward "
                   "adapter on the stored training features; they appear here when the job is done.")
        kind = st.selectbox("Adapter", ADAPTER_KINDS, format_func=adapter_label, key="up_adapter_kind")
        if st.button("Fit adapters", key="up_fit_adapters"):
            job_id = q.enqueue(url, "adapters", adapters_payload(old["id"], new["id"], kind=kind, view=view,
                                                                 same_set=same_set_of(experiment["config"])),
                               experiment_id=experiment["id"])
            st.toast(f"Adapter job #{job_id} queued; the Overview page shows its progress.")

plan_section(p.get("plan"), r["level"])
report_button(p.get("plan"), {**r, "sentence": sentence(r)}, inputs={
    "experiment": f"#{experiment['id']} {experiment.get('name') or ''}".strip(), "old step": old["step"],
    "new step": new["step"], "view": view}, notes=p.get("notes", []), key="up_report")
