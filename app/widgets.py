"""UI pieces the pages share: the empty-database message, experiment/step pickers, the analysis block."""
from __future__ import annotations

import re
import string
from datetime import datetime, timezone
from collections.abc import Sequence
from typing import Any

import streamlit as st

from app import queries as q
from engine.contract import analysis_key, analysis_payload
from engine.results.conventions import SEPARATOR, convention, step_label

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
    """Caption the convention of what follows (``engine.results.conventions.convention``, then ``extra`` parts).

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


def pick_steps(versions: list[dict[str, Any]], *, key: str, columns: list | None = None) -> tuple[dict, dict]:
    """Old and new model (step a < step b); defaults to the last two steps. A replaced step says it was retrained."""
    steps = [v["step"] for v in versions]
    by_step = {v["step"]: v for v in versions}
    label = lambda t: step_label(t, bool(by_step[t].get("replaced")))  # noqa: E731
    col_a, col_b = columns or st.columns(2)
    a = col_a.selectbox("Old model (step a)", steps[:-1], index=len(steps) - 2, key=f"{key}_a", format_func=label)
    later = [s for s in steps if s > a]
    b = col_b.selectbox("New model (step b)", later, index=len(later) - 1, key=f"{key}_b", format_func=label)
    return by_step[a], by_step[b]


def _job_state(job: dict[str, Any]) -> None:
    waited = (datetime.now(timezone.utc) - job["created_at"]).total_seconds()
    if job["status"] == "queued":
        hint = (" If it stays queued, is the engine worker running? `python run_app.py` starts it."
                if waited > QUEUED_HINT_S else "")
        st.info(f"Queued as job #{job['id']} ({q.ago(job['created_at'])}).{hint}", icon=":material/schedule:")
    else:
        st.progress(min(max(job["progress"], 0.0), 1.0), text=f"Computing… job #{job['id']}: {plain(job['message'])}")


def analysis_result(url: str, experiment: dict[str, Any], kind: str, params: dict[str, Any], *,
                    what: str, button_key: str) -> dict[str, Any] | None:
    """The stored analysis for ``params``; otherwise its job's progress (polled) or a button to compute it."""
    key = analysis_key(kind, params)
    stamp = q.stamp(experiment)
    hit = q.stored_analysis(url, experiment["id"], kind, key, stamp)
    if hit is not None:
        return hit
    job = q.analysis_job(url, experiment["id"], kind, key)
    if job is not None and job["status"] in q.ACTIVE:
        @st.fragment(run_every=2)
        def poll() -> None:
            current = q.analysis_job(url, experiment["id"], kind, key)
            if current is None or current["status"] not in q.ACTIVE:
                st.rerun()  # finished (or gone): redraw the whole page with the result
            _job_state(current)
        poll()
        return None
    if job is not None and job["status"] == "failed":
        st.error(f"Computing {what} failed (job #{job['id']}): {plain(job['message'])}")
        if job.get("error"):
            with st.expander("Error details"):
                st.code(job["error"], language=None)
    elif job is not None and job["status"] == "cancelled":
        st.warning(f"Computing {what} was cancelled (job #{job['id']}).")
    elif job is not None and job["status"] == "done":
        st.warning(f"Job #{job['id']} finished but stored no {what}; compute it again.")
    else:
        st.info(f"Not computed yet for these settings: {what}. The engine worker computes it in the background "
                "and this page updates when it is ready.")
    if st.button(f"Compute {what}", type="primary", key=button_key):
        q.enqueue(url, "analysis", analysis_payload(experiment["id"], kind, params),
                  experiment_id=experiment["id"])
        st.rerun()
    return None
