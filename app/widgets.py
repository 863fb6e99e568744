"""UI pieces the pages share: the empty-database message, experiment/step pickers, the analysis block."""
from __future__ import annotations

import re
import string
from datetime import datetime, timezone
from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st

from app import queries as q
from engine.core.contract import analysis_key, analysis_payload
from engine.core.conventions import SEPARATOR, convention, step_label
from engine.core.kinds import TIE_RULES
from engine.core.vocab import Rule
from storage import IdenticalJob, QueuePlace

STATUS_BADGE = {"queued": ":blue[:material/schedule: queued]", "running": ":blue[:material/autorenew: running]",
                "done": ":green[:material/check_circle: done]", "failed": ":red[:material/error: failed]",
                "cancelled": ":gray[:material/block: cancelled]"}
QUEUED_HINT_S = 20
MISSING = "–"  # what a table shows for a value that is not defined (never the word None)
_ESCAPED = str.maketrans({c: "\\" + c for c in string.punctuation})
_JOINER = "\u2060"  # an invisible word joiner: breaks GFM's autolinking of bare URLs and e-mail addresses
_AUTOLINKED = re.compile(r"(?<=:)(?=//)|(?<=www)(?=\.)|(?<=@)", re.IGNORECASE)


def plain(text: object) -> str:
    """Stored, user-provided text (a name, a label, a job message) for Streamlit's markdown: shown literally.

    Every ASCII punctuation character is backslash-escaped (CommonMark allows exactly that), so no
    link, image, emphasis, HTML tag, ``$`` math or ``:color[...]`` directive can form; an invisible word
    joiner after ``:`` in ``://``, after ``www`` and after ``@`` stops bare URLs and addresses from
    becoming links (GFM links them after parsing, escapes or not). Use it wherever
    stored text goes into st.markdown / caption / info / success / error / warning / progress / a widget
    label; widget options, dataframes, st.code and chart titles show text as it is and need nothing.
    """
    return _AUTOLINKED.sub(_JOINER, str(text)).translate(_ESCAPED)


def summary_columns() -> dict[str, Any]:
    """Column formats for ``app.charts.summary_percent``'s AC % / AA % / ACA %: one unit, one decimal, a help each."""
    helps = {"AC %": "Share of the cross-tests passing the empirical compatibility criterion",
             "AA %": "Mean of the lower triangle (self- and cross-tests)",
             "ACA %": "Sum of the passing cross-tests over all cross-tests (failing ones count 0)"}
    return {name: st.column_config.NumberColumn(name, format="%.1f", help=text) for name, text in helps.items()}


def table(frame: Any, *, caption: str | None = None, **kwargs: Any) -> None:
    """A dataframe as wide as the page, without its index, missing values as ``MISSING`` (and what they mean)."""
    st.dataframe(frame, hide_index=True, width="stretch", placeholder=MISSING, **kwargs)
    if caption:
        st.caption(caption)


def state_convention(config: dict[str, Any], *, extra: Sequence[str] = (), **what: Any) -> str:
    """Caption the convention of what follows (``engine.core.conventions.convention``, then ``extra`` parts).

    Returns the line, for the charts' subtitles and the exports.
    """
    line = SEPARATOR.join([convention(config, **what), *extra])
    st.caption(plain(line))
    return line


def status_badge(status: str) -> str:
    """A coloured status with an icon, for st.markdown (tables show the plain word)."""
    return STATUS_BADGE.get(status, status)


def empty_state(url: str, what: str = "results") -> None:
    """The friendly message of a page with nothing to show yet."""
    demo = [j for j in q.jobs(url) if j["kind"] == "run" and j["status"] in q.ACTIVE]
    if demo:
        st.info(f"No {what} yet — **{plain(demo[-1]['label'])}** is {demo[-1]['status']}; "
                "its results appear here when it finishes. Follow it on the Overview page.", icon=":material/schedule:")
        st.page_link("app_pages/overview.py", label="Go to Overview", icon=":material/dashboard:")
    else:
        st.info(f"No {what} yet. Launch an experiment on **New experiment** (the *quick-demo* preset runs in a few "
                "minutes on a CPU).", icon=":material/science:")
        st.page_link("app_pages/new_experiment.py", label="New experiment", icon=":material/add_circle:")


def experiment_label(e: dict[str, Any]) -> str:
    study = f" · study {e['study']}" if e.get("study") else ""
    return f"#{e['id']} {e['name']} ({e['method']}){study}"


def pick_experiment(url: str, *, key: str, min_steps: int = 2) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """A selectbox of experiments that have at least ``min_steps`` model versions; None (and a message) if none."""
    candidates = []
    for e in q.experiments(url):
        versions = q.model_versions(url, e["id"], q.stamp(e))
        if len(versions) >= min_steps:
            candidates.append((e, versions))
    if not candidates:
        empty_state(url, "experiments with two trained steps")
        return None
    labels = [experiment_label(e) + ("" if e["status"] == "done" else f" — {e['status']}") for e, _ in candidates]
    index = st.selectbox("Experiment", range(len(candidates)), format_func=lambda i: labels[i], key=key)
    return candidates[index]


def model_label(version: dict[str, Any]) -> str:
    """How a model version is called on every page: its user name (``v2 (step 3)``) or ``step 3``."""
    step = step_label(version["step"], bool(version.get("replaced")))
    return f"{version['name']} ({step})" if version.get("name") else step


def pick_steps(versions: list[dict[str, Any]], *, key: str, columns: list | None = None) -> tuple[dict, dict]:
    """Old and new model (step a < step b); defaults to the last two steps. A replaced step says it was retrained."""
    steps = [v["step"] for v in versions]
    by_step = {v["step"]: v for v in versions}
    label = lambda t: model_label(by_step[t])  # noqa: E731
    col_a, col_b = columns or st.columns(2)
    a = col_a.selectbox("Old model (step a)", steps[:-1], index=len(steps) - 2, key=f"{key}_a", format_func=label)
    later = [s for s in steps if s > a]
    b = col_b.selectbox("New model (step b)", later, index=len(later) - 1, key=f"{key}_b", format_func=label)
    return by_step[a], by_step[b]


def pick_rule(*, key: str, columns: list | None = None) -> tuple[float, str]:
    """The upgrade check's rule, ``(margin in points, ties)``: 0 and "fail" are strict ECC, the papers' rule."""
    col_m, col_t = columns or st.columns(2)
    margin = col_m.number_input("Non-inferiority margin (points)", min_value=0.0, max_value=99.0, value=0.0, step=0.5,
                                key=f"{key}_margin", help="How many points the new model's queries on the old gallery "
                                "may score below the old model's self-test and still pass; 0 is strict ECC")
    ties = col_t.selectbox("Ties", TIE_RULES, key=f"{key}_ties", format_func=lambda t: Rule(0.0, t).name,
                           help="Whether a cross-test equal to the self-test (minus the margin) passes")
    return float(margin), ties


LANE_NAMES = {"short": "short-job lane (analyses, upgrade checks, adapters, checkpoint comparisons)",
              "main": "main lane (training)"}
POLL_S = 2


def duration(seconds: float) -> str:
    """'45 s', '12 min', '1.5 h' for a number of seconds."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def queue_caption(place: QueuePlace, starts_in_s: float | None) -> str:
    """A queued job's caption: its lane, its position there and when it should start (or that there is no basis
    for a number yet)."""
    ahead = f"{place.position - 1} job(s) ahead" if place.position > 1 else "next to start"
    if starts_in_s is None:
        when = ("start time unknown (the job(s) before it have not reported enough progress yet, or have never run "
                "before)")
    elif starts_in_s < 10:
        when = "starts within seconds"
    else:
        when = f"starts in about {duration(starts_in_s)} (estimate: the running job's progress, earlier identical runs)"
    return f"Position {place.position} in the {LANE_NAMES.get(place.lane, place.lane)}: {ahead}; {when}."


def job_timing(url: str, job: dict[str, Any]) -> None:
    """A caption with a queued job's position in its lane, or a running study's time left (the whole study's)."""
    place = q.queue_places(url).get(job["id"]) if job["status"] == "queued" else None
    if place is not None:
        st.caption(queue_caption(place, q.queue_starts_s(url).get(job["id"])))
    elif job["status"] == "running" and job["study_id"] is not None:
        left = q.study_eta_s(url, job["study_id"])
        st.caption("Whole study: " + (f"about {duration(left)} left (every method and seed, from its progress so far)."
                                      if left is not None else "time left is estimated once it has made some progress."))


def job_heading(url: str, job: dict[str, Any], when: str) -> None:
    """A job card's first line (id, label, status, when); a job that fans out on Dask says its partitions done and
    the Dask dashboard in its progress message."""
    st.markdown(f"**#{job['id']} · {plain(job['label'])}** — {status_badge(job['status'])} · {when}")


def _job_state(url: str, job: dict[str, Any]) -> None:
    waited = (datetime.now(timezone.utc) - job["created_at"]).total_seconds()
    if job["status"] == "queued":
        hint = (" If it stays queued, is the engine worker running? `python run_app.py` starts it."
                if waited > QUEUED_HINT_S else "")
        st.info(f"Queued as job #{job['id']} ({q.ago(job['created_at'])}).{hint}", icon=":material/schedule:")
    else:
        st.progress(min(max(job["progress"], 0.0), 1.0), text=f"Computing… job #{job['id']}: {plain(job['message'])}")
    job_timing(url, job)


def _follow(url: str, match: Callable[[dict[str, Any]], bool]) -> bool:
    """While jobs that ``match`` are queued or running, show their state (refreshed every ``POLL_S``) and redraw
    the whole page once one finishes; False (and nothing shown) when none is active."""
    def active() -> list[dict[str, Any]]:
        return [j for j in q.jobs(url) if j["status"] in q.ACTIVE and match(j)]

    ids = [j["id"] for j in active()]
    if not ids:
        return False

    @st.fragment(run_every=POLL_S)
    def poll() -> None:
        current = active()
        if [j["id"] for j in current] != ids:
            st.rerun()  # one finished (or another started): redraw the page with its results
        for job in current:
            _job_state(url, job)

    poll()
    return True


def follow_jobs(url: str, kind: str, *, experiment_id: int | None = None) -> bool:
    """Poll the queued/running jobs of ``kind`` (on ``experiment_id``) and redraw the page when one is done.

    One call after a page's launch button; returns whether any such job is active.
    """
    return _follow(url, lambda j: j["kind"] == kind and (experiment_id is None or j["experiment_id"] == experiment_id))


@st.dialog("An identical job exists")
def _identical(url: str, kind: str, payload: dict[str, Any], experiment_id: int | None, reason: str) -> None:
    st.warning(plain(reason[0].upper() + reason[1:]) + ".", icon=":material/content_copy:")
    st.caption("Its results are (or will be) on the pages already; the Overview page shows its state.")
    left, right = st.columns(2)
    if left.button("Launch anyway", type="primary"):
        job_id = q.enqueue(url, kind, payload, experiment_id=experiment_id, force=True)
        st.success(f"Queued job #{job_id}.")
    if right.button("Keep the existing one"):
        st.rerun()


def launch(url: str, kind: str, payload: dict[str, Any], *, experiment_id: int | None = None) -> int | None:
    """Queue a job and return its id; if an identical one is queued, running or done, say so in a dialog (which
    offers to launch it anyway) and return None."""
    try:
        return q.enqueue(url, kind, payload, experiment_id=experiment_id)
    except IdenticalJob as exc:
        _identical(url, kind, payload, experiment_id, str(exc))
        return None


def analysis_result(url: str, experiment: dict[str, Any], kind: str, params: dict[str, Any], *,
                    what: str, button_key: str) -> dict[str, Any] | None:
    """The stored analysis for ``params``; otherwise its job's progress (polled) or a button to compute it."""
    key = analysis_key(kind, params)
    stamp = q.stamp(experiment)
    # the job first, then the result: a job seen finished stored its result before it finished, so the read after
    # it sees the result (read the other way round, a job finishing in between looked as if it stored nothing)
    job = q.analysis_job(url, experiment["id"], kind, key)
    hit = q.stored_analysis(url, experiment["id"], kind, key, stamp)
    if hit is not None:
        return hit
    if job is not None and _follow(url, lambda j: j["id"] == job["id"]):
        return None
    if job is not None and job["status"] in q.ACTIVE:
        st.rerun()  # it finished between the two reads of the job list: read everything again
    if job is not None and job["status"] == "failed":
        st.error(f"Computing {what} failed (job #{job['id']}): {plain(job['message'])}")
        if job.get("error"):
            with st.expander("Error details"):
                st.code(job["error"], language=None)
    elif job is not None and job["status"] == "cancelled":
        st.warning(f"Computing {what} was cancelled (job #{job['id']}).")
    elif job is not None and job["status"] == "done":
        st.warning(f"Job #{job['id']} computed {what}, but it is no longer stored (its experiment was run again "
                   "since); compute it again.")
    else:
        st.info(f"Not computed yet for these settings: {what}. Press *Compute* to have the engine worker compute it; "
                "this page shows it when it is ready.")
    if st.button(f"Compute {what}", type="primary", key=button_key):
        # identical launches are told above (the stored result, or the queued/running job followed); what is left
        # is a done job that stored nothing (its experiment was re-run since): computing again is what was asked
        q.enqueue(url, "analysis", analysis_payload(experiment["id"], kind, params),
                  experiment_id=experiment["id"], force=True)
        st.rerun()
    return None
