"""The Upgrade check's "from a table or store" form: queue a ``sources_check`` job and show the report it stored.

The page computes nothing: the engine worker reads the sources (``engine.upgrade.from_sources``) and stores the
report under the job's payload hash (``storage.save_source_check``); this module reads it back.
"""
from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app import queries as q
from app.plan_view import decision_box, plan_section
from app.report_download import report_button
from app.widgets import MISSING, follow_jobs, pick_rule, plain
from engine.core.contract import sources_check_payload
from engine.core.conventions import metric_name
from engine.core.kinds import DEFAULT_RANK_TIES, LIST_RANK_TIES, QRELS_HELP, RANK_TIES, SOURCE_HELP
from engine.core.vocab import RELEVANCE, RELEVANCE_K
from engine.read.verdicts import NOT_JUDGED, interval, sentence, share
from storage import IdenticalJob

KIND = "sources_check"
VERDICT_BOX = {"compatible": st.success, "not compatible": st.error, "too close to call": st.warning}
RELEVANCE_WORDS = {"labels": "labels (same class label)", "qrels": "qrels (judgements: query id, item id, grade)",
                   "none": "none (label-free: the new model's top-k on the new gallery)"}
RANK_TIES_HELP = ("How equal scores in a top-k list rank (check-upgrade --rank-ties): "
                  + "; ".join(f"{RANK_TIES[r].label}: {RANK_TIES[r].help}" for r in LIST_RANK_TIES))
FIELDS = (("old_gallery", "Old gallery (old model)", True), ("new_gallery", "New gallery (new model, optional)", False),
          ("old_queries", "Old queries (old model)", True), ("new_queries", "New queries (new model)", True))


def _label(job: dict[str, Any]) -> str:
    return f"#{job['id']} · {job['label']}"  # app.queries: the source text masked


def _form(url: str) -> None:
    with st.form("up_sources_form"):
        c = st.columns(2)
        texts = {side: c[i % 2].text_input(label, key=f"up_src_{side}", help=SOURCE_HELP,
                                           placeholder="data/….parquet" if required else "(optional)")
                 for i, (side, label, required) in enumerate(FIELDS)}
        texts["qrels"] = st.text_input("Qrels (with relevance qrels)", key="up_src_qrels", placeholder="(optional)",
                                       help=QRELS_HELP)
        r = st.columns([3, 1, 2, 2])
        relevance = r[0].selectbox("Relevance", RELEVANCE, format_func=RELEVANCE_WORDS.get, key="up_src_relevance")
        k = r[1].number_input("k", min_value=1, max_value=1000, value=RELEVANCE_K, step=1, key="up_src_k",
                              help="Depth of the top-k lists (Recall@k, nDCG@k, neighbour recall@k)")
        names = (r[2].text_input("Old model's name", "old", max_chars=40, key="up_src_old_name"),
                 r[3].text_input("New model's name", "new", max_chars=40, key="up_src_new_name"))
        rule = st.columns([1, 2, 1])
        margin, ties = pick_rule(key="up_src", columns=rule[:2])
        rank_ties = rule[2].selectbox("Rank ties", LIST_RANK_TIES, index=LIST_RANK_TIES.index(DEFAULT_RANK_TIES),
                                      format_func=lambda r: RANK_TIES[r].label, key="up_src_rank_ties",
                                      help=RANK_TIES_HELP)
        submitted = st.form_submit_button("Check the upgrade", type="primary")
    if not submitted:
        return
    try:
        payload = sources_check_payload(texts, relevance=relevance, k=int(k), names=names, margin=margin, ties=ties,
                                        rank_ties=rank_ties)
    except ValueError as exc:
        st.error(plain(str(exc)))
        return
    # The check picker below keeps its own value across runs (its index= only seeds it), so the submission sets it.
    try:
        st.session_state["up_src_pick"] = q.enqueue(url, KIND, payload)
    except IdenticalJob as exc:  # the same check was asked before: show it (its report, or its progress)
        st.session_state["up_src_pick"] = exc.job_id
        st.info(f"The same check is already queued or done (job #{exc.job_id}); showing it.")


def _report(report: dict[str, Any], *, url: str, job: dict[str, Any]) -> None:
    c, b = report["compatibility"], report["better"]
    VERDICT_BOX[report["verdict"]](plain(sentence(report)))
    decision_box(report.get("plan"))  # the one decision; its details close the report
    st.caption(plain(f"{metric_name(report['metric'])} · {report['convention']} · {report['n_queries']:,} queries, "
                     f"{report['n_gallery']:,} gallery items · paired percentile bootstrap over "
                     f"{report['bootstrap']['paired_over']}, {report['resamples']:,} resamples, seed {report['seed']}"))
    k = st.columns(3)
    k[0].metric(plain(f"ECC gain ({report['new_name']} / {report['old_name']} − {report['old_name']} / "
                      f"{report['old_name']})"), f"{100 * c['diff']:+.1f} pts")
    k[1].metric(f"{100 * report['level']:g}% CI of the gain", f"{100 * c['lo']:+.1f} to {100 * c['hi']:+.1f}")
    judged = b["verdict"] != NOT_JUDGED
    k[2].metric(plain(f"{report['new_name']} on its own vs {report['old_name']}"),
                f"{100 * b['diff']:+.1f} pts" if judged else "not judged", b["verdict"] if judged else None,
                delta_color="off", delta_arrow="off", help=interval(b, report["level"]) if judged else None)
    shown = [report["metric"]] + [m for m in next(iter(report.get("means", {}).values()), {})
                                  if m.endswith(f"@{report['k']}") and m != report["metric"]]
    rows = [{"query / gallery": cell, **{metric_name(m): None if means.get(m) is None else 100 * means[m] for m in shown}}
            for cell, means in report.get("means", {}).items()]
    st.dataframe(pd.DataFrame(rows), hide_index=True, placeholder=MISSING,
                 column_config={col: st.column_config.NumberColumn(format="%.1f") for col in rows[0] if col != "query / gallery"}
                 if rows else None)
    _backfill(report)
    for note in report.get("notes", []):
        st.info(plain(note))
    st.caption(plain(" · ".join(report.get("sources", {}).values())))
    plan_section(report.get("plan"), report["level"], key="up_src_plan")
    report_button(report.get("plan"), {k: v for k, v in report.items() if k != "plan"}, key="up_src_report",
                  inputs={"sources": report.get("sources") or {}, "relevance": report.get("relevance"),
                          "k": report.get("k"), "rank ties": RANK_TIES[_rank_ties(report)].label,
                          "backfill depth": report.get("backfill_depth")})
    _trec_download(report, url=url, job=job)


def _rank_ties(report: dict[str, Any]) -> str:
    return report.get("rank_ties") or DEFAULT_RANK_TIES  # a report stored before the rule was a choice: the default


def _trec_download(report: dict[str, Any], *, url: str, job: dict[str, Any]) -> None:
    """The check's TREC run files and qrels (the files ``check-upgrade --export trec`` writes), zipped and stored with
    the report by the worker; read from the database only when the button is pressed."""
    trec = report.get("trec")
    if trec is None:
        st.caption("This check was stored before its TREC run files were kept; run it again to download them.")
        return
    if "error" in trec:
        st.caption(plain(f"No TREC run files for this check: {trec['error']}"))
        return
    st.download_button("TREC run files (.zip)", lambda: q.source_check_trec(url, KIND, job["payload"]),
                       file_name=f"trec-runs-job{job['id']}.zip", mime="application/zip", on_click="ignore",
                       key="up_src_trec", icon=":material/download:",
                       help=plain(f"{', '.join(trec['files'])}: each cell's top-k lists as a TREC run and the judgements "
                                  "the check used (what check-upgrade --export trec writes), so trec_eval, pytrec_eval, "
                                  "ranx or ir-measures recompute every number above (the check's rank-tie rule: "
                                  f"{RANK_TIES[_rank_ties(report)].label})"))
    if trec.get("note"):
        st.caption(plain(trec["note"]))


def _backfill(report: dict[str, Any]) -> None:
    """The stored backfill needs, as the features check shows them, with each curve's worst share of decided queries."""
    if not report.get("backfill"):
        return
    old, new = report["old_name"], report["new_name"]
    decided = report.get("backfill_decided") or {}
    st.subheader("Backfilling curves")
    st.markdown(plain(f"Not compatible: the curves of re-embedding part of the gallery with {new} "
                      f"(top-{report.get('backfill_depth')} lists merged by score at each point). M̃ is the area under a "
                      "curve (the metric averaged over a uniformly random backfilled share); the migration plan below "
                      f"picks the ordering that reaches {old}'s self-test with the fewest items."))
    rows = [{"ordering": n["ordering"],
             "M̃ %": None if n["area"] is None else 100 * n["area"], f"to reach {old}'s self-test": share(n["to_old_self"]),
             f"to reach {new}'s self-test": share(n["to_new_self"]),
             "queries decided % (worst point)": 100 * min(decided[n["ordering"]]) if decided.get(n["ordering"]) else None}
            for n in report["backfill"]]
    st.dataframe(pd.DataFrame(rows), hide_index=True, placeholder=MISSING,
                 column_config={c: st.column_config.NumberColumn(format="%.2f")
                                for c in ("M̃ %", "queries decided % (worst point)")})


def sources_section(url: str) -> None:
    """The form, then the chosen check: its progress while it runs, its error, or its stored report."""
    st.markdown("Point at the embeddings where they live: the old model's gallery, the queries embedded by both models "
                "(joined by id) and, optionally, the new model's gallery. The gallery is read in blocks; nothing is "
                "written to your store.")
    _form(url)
    checks = [j for j in q.jobs(url) if j["kind"] == KIND]
    if not checks:
        st.info("No check from a table or store yet: fill in the form above.")
        return
    ids = [j["id"] for j in checks]  # newest first; a picked id no longer listed falls back to the newest
    job_id = st.selectbox("Check", ids, format_func=lambda i: _label(next(j for j in checks if j["id"] == i)),
                          key="up_src_pick")
    job = next(j for j in checks if j["id"] == job_id)
    if job["status"] in q.ACTIVE:
        follow_jobs(url, KIND)
        return
    if job["status"] == "failed":
        st.error(f"The check failed (job #{job['id']}): {plain(job['message'] or job.get('error') or '')}")
        return
    if job["status"] == "cancelled":
        st.warning(f"The check was cancelled (job #{job['id']}).")
        return
    report = q.source_check(url, KIND, job["payload"])
    if report is None:
        st.warning(f"Job #{job['id']} finished but stored no report; run the check again.")
        return
    _report(report, url=url, job=job)
