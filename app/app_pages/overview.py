"""Overview: what the tool answers and where to start, jobs with progress / cancel / retry, and every experiment
with AC / AA / ACA (in percent) at a glance."""
from __future__ import annotations

from datetime import datetime, timezone

import pandas as pd
import streamlit as st

from app import queries as q
from app.charts import number, summary_percent
from app.learn import LEARN_PAGES
from app.widgets import MISSING, empty_state, job_heading, job_timing, plain, summary_columns, table
from engine.read.verdicts import matrix_verdict
from storage import crashed_worker

STALE_S = 60
FINISHED_SHOWN = 15

# (heading, what it answers, page, link label, icon) of the three ways in
ENTRY_POINTS = (
    ("Run the demo", "Train a short sequence of models with six methods and compare them (the *quick-demo* preset, "
     "a few minutes on a CPU).", "app_pages/new_experiment.py", "New experiment", ":material/add_circle:"),
    ("Check my upgrade", "Pick an old and a new model (two steps of an experiment, or v1 and v2 uploaded on the "
     "Checkpoints page) and see whether the new one can search the old gallery, or how much of it to re-embed.",
     "app_pages/upgrade.py", "Upgrade check", ":material/verified:"),
    ("Learn", "Five small interactive demos: what compatibility means, the probability simplex, stationarity, "
     "and aligning two feature spaces.", f"learn/{LEARN_PAGES[0][0]}", LEARN_PAGES[0][1], LEARN_PAGES[0][2]),
)

url = q.db_url()
st.title("Overview")
st.markdown("**Can a new model search the gallery that the old model embedded, without re-embedding it?** "
            "Compatibility Lab trains or loads sequences of models, tests every new-query / old-gallery pair "
            "against the papers' compatibility criterion, and shows how much of the gallery to backfill when a "
            "pair fails.")
for column, (heading, text, target, label, icon) in zip(st.columns(len(ENTRY_POINTS)), ENTRY_POINTS):
    with column.container(border=True, height="stretch"):
        st.markdown(f"**{heading}**")
        st.caption(text)
        st.page_link(target, label=label, icon=icon)
st.caption("Jobs run in the engine worker, not in this page: closing the browser does not stop them. "
           "This page refreshes every 2 seconds.")


def notify(message: str) -> None:
    """Redraw with the new job states, and say what happened (a toast does not survive a rerun by itself)."""
    st.session_state["overview_toast"] = message
    st.rerun()


def crash_warning(job: dict) -> str:
    """What to say before retrying a job whose worker died (it may die the same way again)."""
    reason = job["error"].split("; last message")[0]
    return (f"Job #{job['id']} did not fail by itself: its {reason}. Retrying runs the same job again and may take "
            "the worker down the same way (out of memory: choose smaller images, input size or batch size).")


def running_experiments(job: dict) -> list[dict]:
    """The experiments a running study job is training now: each can be stopped on its own."""
    if job["kind"] != "run" or job["study_id"] is None or job["status"] != "running":
        return []
    return [e for e in q.experiments(url) if e["study_id"] == job["study_id"] and e["status"] == "running"]


def confirm_cancel(job: dict) -> None:
    """The confirmation of a Cancel: stop the whole job (a study: every method and seed still to run), or only the
    experiment a study is training now (the study goes on with the next method or seed), or keep it running."""
    key = f"confirm_cancel_{job['id']}"

    @st.dialog(f"Cancel job #{job['id']}?", on_dismiss=lambda: st.session_state.pop(key, None))
    def dialog() -> None:
        st.markdown(f"**{plain(job['label'])}** — {job['status']}")
        one = running_experiments(job)
        whole = "Stop the whole study" if job["study_id"] is not None else "Cancel the job"
        if job["status"] == "queued":
            st.caption("It has not started: cancelling removes it from the queue.")
        elif job["study_id"] is not None:
            st.caption("Stopping the whole study discards the experiment in training and runs none of the methods or "
                       "seeds still to come; finished experiments are kept, and Retry resumes from them. Stopping one "
                       "method discards only that experiment; the study goes on with the others.")
        else:
            st.caption("The worker stops at its next check; what the job had not finished is discarded.")
        if st.button(whole, key=f"cancel_all_{job['id']}", type="primary", icon=":material/stop_circle:"):
            st.session_state.pop(key, None)
            status = q.cancel(url, job["id"])
            notify(f"Job #{job['id']}: {'cancelled' if status == 'cancelled' else 'cancel requested'}")
        for e in one:
            seed = e["config"].get("seed")
            if st.button(f"Stop only {plain(e['method'])} (seed {seed}, experiment #{e['id']})",
                         key=f"cancel_experiment_{e['id']}"):
                st.session_state.pop(key, None)
                q.cancel_experiment(url, e["id"])
                notify(f"Experiment #{e['id']} ({e['method']}, seed {seed}) cancelled; the study goes on")
        if st.button("Keep it running", key=f"cancel_keep_{job['id']}"):
            st.session_state.pop(key, None)
            st.rerun()

    dialog()


def job_card(job: dict) -> None:
    """A queued or running job (progress, Cancel) or a failed / cancelled one (last message, error, Retry).

    Cancel asks first (:func:`confirm_cancel`); Retry of a job whose worker died asks first and says why.
    """
    active = job["status"] in q.ACTIVE
    confirm_key = f"confirm_retry_{job['id']}"
    cancel_key = f"confirm_cancel_{job['id']}"
    with st.container(border=True):
        left, right = st.columns([5, 1], vertical_alignment="center")
        with left:
            when = f"queued {q.ago(job['created_at'])}" if active else q.ago(job["finished_at"])
            job_heading(url, job, when)
            job_timing(url, job)
            if job["status"] == "running":
                st.progress(min(max(job["progress"], 0.0), 1.0),
                            text=f"{100 * job['progress']:.0f}% · {plain(job['message'] or 'started')}")
                beat = job["heartbeat_at"] or job["started_at"]
                if beat is not None and (datetime.now(timezone.utc) - beat).total_seconds() > STALE_S:
                    st.warning(f"No heartbeat from the worker for {q.ago(beat).replace(' ago', '')}: "
                               "it may have stopped (the job is failed when the next worker sees it silent).")
            elif active:
                st.caption("Waiting for the engine worker to pick it up.")
            else:
                st.caption(f"Last message: {plain(job['message'] or '(none)')}")
                if job["error"]:
                    with st.expander("Error"):
                        st.code(job["error"], language=None)
                if st.session_state.get(confirm_key):
                    st.warning(crash_warning(job), icon=":material/warning:")
            if active and job["cancel_requested"]:
                st.caption("Cancel requested — the worker stops at the next epoch (a Dask fan-out within a second, "
                           "its tasks cancelled on the cluster).")
        with right:
            if active and st.button("Cancel", key=f"cancel_{job['id']}", disabled=job["cancel_requested"],
                                    help="Stop this job, or one method of a study, after a confirmation"):
                st.session_state[cancel_key] = True
            if active and st.session_state.get(cancel_key) and not job["cancel_requested"]:
                confirm_cancel(job)
            if not active and st.session_state.get(confirm_key):
                if st.button("Retry anyway", key=f"retry_anyway_{job['id']}", type="primary"):
                    st.session_state.pop(confirm_key)
                    notify(f"Queued job #{q.retry(url, job['id'])} (retry of #{job['id']})")
                if st.button("Keep", key=f"retry_keep_{job['id']}", help="Do not retry"):
                    st.session_state.pop(confirm_key)
                    st.rerun()
            elif not active and job.get("old_tasks"):
                st.caption("Ran as tasks of an older version: rerun what queued it")
            elif not active and st.button("Retry", key=f"retry_{job['id']}", help="Queue the same job again"):
                if crashed_worker(job["error"]):
                    st.session_state[confirm_key] = True
                    st.rerun()
                notify(f"Queued job #{q.retry(url, job['id'])} (retry of #{job['id']})")


def experiment_rows(experiments: list[dict]) -> pd.DataFrame:
    """One row per experiment; AC / AA / ACA in percent (None until the experiment has a matrix)."""
    rows = []
    for e in experiments:
        stamp = q.stamp(e)
        versions = q.model_versions(url, e["id"], stamp)
        main = q.pick_main(q.matrices(url, e["id"], stamp), e["method"], e["config"])
        s = main["summary"] if main else {}
        data = e["config"].get("dataset", {}).get("name", "features" if e["method"] == "features" else "?")
        rows.append({
            "id": e["id"], "study": e["study"] or None, "experiment": e["name"], "method": e["method"],
            "dataset": data, "status": e["status"], "steps": len(versions),
            "view": main["view"] if main else None, **summary_percent(s),
            "verdict": matrix_verdict(s["paired"]["verdict"], s.get("tie_readings")) if s.get("paired") else None,
            "finished": q.ago(e["finished_at"]) if e["finished_at"] else None,
        })
    return pd.DataFrame(rows)


@st.fragment(run_every=2)
def live() -> None:
    if "overview_toast" in st.session_state:
        st.toast(st.session_state.pop("overview_toast"))
    jobs = q.jobs(url)
    experiments = q.experiments(url)
    if not jobs and not experiments:
        empty_state(url, "experiments")
        return
    active = [j for j in jobs if j["status"] in q.ACTIVE]
    running, queued = sum(j["status"] == "running" for j in active), sum(j["status"] == "queued" for j in active)
    done = sum(e["status"] == "done" for e in experiments)
    cols = st.columns(4)
    cols[0].metric("Running jobs", running)
    cols[1].metric("Queued jobs", queued)
    cols[2].metric("Finished experiments", done)
    cols[3].metric("Failed jobs", sum(j["status"] == "failed" for j in jobs))

    st.subheader("Jobs in progress")
    if active:
        for job in sorted(active, key=lambda j: (j["status"] != "running", j["id"])):
            job_card(job)
    else:
        st.caption("Nothing running. Launch an experiment on **New experiment**.")

    st.subheader("Experiments")
    if experiments:
        rows = experiment_rows(experiments)
        table(rows, column_config={
            "id": st.column_config.NumberColumn("id", width="small"),
            "steps": st.column_config.NumberColumn("steps", width="small"),
            "experiment": st.column_config.TextColumn("experiment", width="medium"),
            **summary_columns(),
            "verdict": st.column_config.TextColumn(
                "verdict", help="The paired verdict of the cross-tests (interval of cross − self over the same "
                "queries), in the words of the Upgrade check and check-upgrade: compatible / not compatible / too close "
                "to call. AC counts the criterion on point estimates; a tie-close cross-test can pass it and still be "
                "too close to call. A dash: no paired test stored.")},
            caption=f"AC, AA and ACA in percent, on Recall@1 in the method's main view; a dash ({MISSING}) means not computed "
                    "yet (a running experiment, or one without a stored matrix)."
            if rows[["AC %", "AA %", "ACA %", "study", "view", "finished"]].isna().any(axis=None) else
            "AC, AA and ACA in percent, on Recall@1 in the method's main view.")
        if any(e["status"] == "done" for e in experiments):
            links = st.columns(4)
            links[0].caption("Explore the results:")
            links[1].page_link("app_pages/compatibility.py", label="Compatibility", icon=":material/grid_on:")
            links[2].page_link("app_pages/geometry.py", label="Feature geometry", icon=":material/scatter_plot:")
            links[3].page_link("app_pages/backfilling.py", label="Backfilling", icon=":material/stacked_line_chart:")
        failed = [e for e in experiments if e["status"] == "failed" and e["error"]]
        for e in failed[:3]:
            st.caption(f":red[:material/error:] #{e['id']} {plain(e['name'])} failed: {plain(e['error'])}")
    else:
        st.caption("No experiments yet: the first one appears when a run job starts.")

    finished = [j for j in jobs if j["status"] not in q.ACTIVE][:FINISHED_SHOWN]
    retryable = [j for j in finished if j["status"] in ("failed", "cancelled")]
    if retryable:
        st.subheader("Failed or cancelled jobs")
        for job in retryable:
            job_card(job)
    if finished:
        with st.expander(f"Recent jobs ({len(finished)})"):
            table(pd.DataFrame([{
                "id": j["id"], "job": j["label"], "status": j["status"], "message": j["message"] or None,
                "finished": q.ago(j["finished_at"]) if j["finished_at"] else None, "took": number(
                    (j["finished_at"] - j["started_at"]).total_seconds(), 0) + " s"
                if j["finished_at"] and j["started_at"] else None,
            } for j in finished]), column_config={"id": st.column_config.NumberColumn("id", width="small")})


live()
