"""What the pages read, and the writes the app makes (enqueue, cancel or retry a job, cancel one experiment, name models).

Reads go through the storage repository in short transactions and return plain values (dicts,
numpy arrays) that ``st.cache_data`` can keep. Every cached function takes the database URL first,
so two databases never share an entry. Fast-changing things (jobs, the experiment list) live for a
second or two; results of an experiment are cached for an hour under a *stamp* that changes when the
experiment does (status + finish time), so a page showing stored results reads them from the
database once.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

import numpy as np
import streamlit as st
from sqlalchemy import Engine

from engine.core.contract import JOB_LANES, JOB_PRIORITY, analysis_key, available_views, job_label, main_view
from storage import (
    QueuePlace,
    TASK_JOB_KINDS,
    cancel_experiment as cancel_experiment_row,
    default_db_url,
    enqueue_job,
    get_engine,
    init_db,
    list_experiments,
    list_feature_views,
    list_jobs,
    list_model_versions,
    load_analysis,
    load_source_check,
    load_source_check_trec,
    payload_hash,
    load_matrices,
    queue_positions,
    queue_start_estimates,
    rename_model_version,
    request_cancel,
    retry_job,
    session_scope,
    study_remaining_s,
    write_problem,
)

ACTIVE = ("queued", "running")
RESULT_TTL = 3600


def db_url() -> str:
    """The database the app shows: ``$COMPATLAB_DB_URL`` (set by run_app.py ``--db``) or the default file."""
    return default_db_url()


@st.cache_resource(show_spinner=False)
def db_engine(url: str) -> Engine:
    """One SQLAlchemy engine per database URL, with the tables created if the database is new.

    A read-only database still opens (its results are shown; :func:`read_only` disables launching)."""
    engine = get_engine(url)
    init_db(engine, writable=False)
    return engine


@st.cache_data(ttl=30, show_spinner=False)
def read_only(url: str) -> str | None:
    """None when jobs can be queued, else the one line saying why the database takes no writes."""
    return write_problem(db_engine(url))


# ---------------------------------------------------------------------------------------------- jobs


@st.cache_data(ttl=1, show_spinner=False)
def jobs(url: str, limit: int = 200) -> list[dict[str, Any]]:
    """The newest jobs as dicts, with a human label; ``old_tasks``: a job of the removed task layer (no retry)."""
    with session_scope(db_engine(url)) as s:
        rows = list_jobs(s, limit=limit)
        return [{
            "id": j.id, "kind": j.kind, "payload": dict(j.payload), "label": job_label(j.kind, j.payload),
            "status": j.status, "progress": float(j.progress or 0.0), "message": j.message or "", "error": j.error,
            "experiment_id": j.experiment_id, "study_id": j.study_id, "cancel_requested": bool(j.cancel_requested),
            "created_at": j.created_at, "started_at": j.started_at, "finished_at": j.finished_at,
            "heartbeat_at": j.heartbeat_at, "old_tasks": j.kind in TASK_JOB_KINDS,
        } for j in rows]


def enqueue(url: str, kind: str, payload: dict[str, Any], *, experiment_id: int | None = None,
            force: bool = False) -> int:
    """Queue a job for the engine worker; returns its id.

    Raises :class:`storage.IdenticalJob` when an identical job is queued, running or done, unless ``force``.
    """
    with session_scope(db_engine(url)) as s:
        job_id = enqueue_job(s, kind, payload, experiment_id=experiment_id, allow_identical=force)
    jobs.clear()
    queue_places.clear()
    queue_starts_s.clear()
    return job_id


@st.cache_data(ttl=1, show_spinner=False)
def queue_places(url: str) -> dict[int, QueuePlace]:
    """Each queued job's lane (``engine.core.contract.JOB_LANES``) and position in it."""
    with session_scope(db_engine(url)) as s:
        return queue_positions(s, JOB_LANES, "main", priority=JOB_PRIORITY)


@st.cache_data(ttl=2, show_spinner=False)
def queue_starts_s(url: str) -> dict[int, float | None]:
    """Each queued job's expected start in seconds from now, None when unknown (``storage.queue_start_estimates``)."""
    with session_scope(db_engine(url)) as s:
        return queue_start_estimates(s, JOB_LANES, "main", priority=JOB_PRIORITY)


@st.cache_data(ttl=2, show_spinner=False)
def study_eta_s(url: str, study_id: int) -> float | None:
    """Seconds until the whole study's queued and running jobs are done (``storage.study_remaining_s``), or None."""
    with session_scope(db_engine(url)) as s:
        return study_remaining_s(s, study_id)


def cancel(url: str, job_id: int) -> str:
    """Ask a job to stop (a queued one is cancelled at once); returns its status afterwards."""
    with session_scope(db_engine(url)) as s:
        status = request_cancel(s, job_id)
    jobs.clear()
    return status


def cancel_experiment(url: str, experiment_id: int) -> str:
    """Stop one running experiment of a study run (the run goes on with the others); returns its status afterwards."""
    with session_scope(db_engine(url)) as s:
        status = cancel_experiment_row(s, experiment_id)
    experiments.clear()
    return status


def retry(url: str, job_id: int) -> int:
    """Queue a finished job again; returns the new job's id."""
    with session_scope(db_engine(url)) as s:
        new_id = retry_job(s, job_id)
    jobs.clear()
    return new_id


def source_check(url: str, kind: str, payload: dict[str, Any]) -> dict[str, Any] | None:
    """The report a finished ``sources_check`` job stored (under its payload hash), or None (read each time: one row)."""
    with session_scope(db_engine(url)) as s:
        return load_source_check(s, payload_hash(kind, payload))


def source_check_trec(url: str, kind: str, payload: dict[str, Any]) -> bytes:
    """The zip of TREC run files and qrels stored with a finished ``sources_check`` job's report (empty when none was
    kept); read when its download button is pressed, never cached."""
    with session_scope(db_engine(url)) as s:
        return load_source_check_trec(s, payload_hash(kind, payload)) or b""


def analysis_job(url: str, experiment_id: int, kind: str, key: str) -> dict[str, Any] | None:
    """The newest ``analysis`` job computing (experiment, kind, key), or None."""
    for job in jobs(url):
        p = job["payload"]
        if job["kind"] != "analysis" or p.get("experiment_id") != experiment_id or p.get("kind") != kind:
            continue
        try:
            if analysis_key(kind, p.get("params", {})) == key:
                return job
        except ValueError:
            continue
    return None


# ---------------------------------------------------------------------------------------------- experiments


@st.cache_data(ttl=2, show_spinner=False)
def experiments(url: str) -> list[dict[str, Any]]:
    """Every experiment, newest first, with its study's name."""
    with session_scope(db_engine(url)) as s:
        return [{
            "id": e.id, "name": e.name, "method": e.method, "status": e.status, "config": dict(e.config),
            "study_id": e.study_id, "study": e.study.name if e.study is not None else None,
            "created_at": e.created_at, "finished_at": e.finished_at, "error": e.error,
        } for e in list_experiments(s)]


def stamp(experiment: dict[str, Any]) -> str:
    """Changes whenever an experiment's stored results may have changed (every 5 s while it runs)."""
    live = f"|{int(time.time() // 5)}" if experiment["status"] in ACTIVE else ""
    return f"{experiment['status']}|{experiment['finished_at']}{live}"


@st.cache_data(ttl=RESULT_TTL, max_entries=512, show_spinner=False)
def matrices(url: str, experiment_id: int, stamp: str) -> list[dict[str, Any]]:
    """The experiment's compatibility matrices (values, query counts, AC/AA/ACA summary)."""
    with session_scope(db_engine(url)) as s:
        return [{
            "metric": m.metric, "gallery_kind": m.gallery_kind, "view": m.view, "eval_classes": m.eval_classes,
            "values": np.asarray(m.values), "valid_queries": np.asarray(m.valid_queries),
            "no_positive": np.asarray(m.no_positive), "summary": dict(m.summary),
        } for m in load_matrices(s, experiment_id)]


@st.cache_data(ttl=RESULT_TTL, max_entries=512, show_spinner=False)
def model_versions(url: str, experiment_id: int, stamp: str) -> list[dict[str, Any]]:
    """The experiment's model versions by step, with the views each can show (stored + PSP/LSP)."""
    with session_scope(db_engine(url)) as s:
        out = []
        for v in list_model_versions(s, experiment_id):
            stored = list_feature_views(s, v.id, "gallery")
            out.append({"id": v.id, "step": v.step, "method": v.method, "architecture": v.architecture,
                        "num_classes": len(v.classes), "class_names": v.class_names, "feature_dim": v.feature_dim,
                        "num_outputs": v.num_outputs, "replaced": v.replaced, "name": v.name,
                        "views": available_views(stored), "query_views": list_feature_views(s, v.id, "query")})
        return out


def rename_models(url: str, names: dict[int, str]) -> None:
    """Give model versions the user's names (``{version id: name}``; blank clears) in one transaction."""
    with session_scope(db_engine(url)) as s:
        for version_id in names:
            rename_model_version(s, version_id, None)  # free the names first, so v1 <-> v2 can swap
        for version_id, name in names.items():
            rename_model_version(s, version_id, name)
    model_versions.clear()


class _Missing(LookupError):
    """Raised inside the cached loader on a miss, so that misses are never cached."""


@st.cache_data(ttl=RESULT_TTL, max_entries=128, show_spinner=False)
def _stored_analysis(url: str, experiment_id: int, kind: str, key: str, stamp: str) -> dict[str, Any]:
    with session_scope(db_engine(url)) as s:
        row = load_analysis(s, experiment_id, kind, key)
        if row is None:
            raise _Missing(key)
        return {"payload": dict(row.payload), "array": None if row.array is None else np.asarray(row.array),
                "created_at": row.created_at}


def stored_analysis(url: str, experiment_id: int, kind: str, key: str, stamp: str) -> dict[str, Any] | None:
    """A stored analysis result (cached once found), or None while it has not been computed."""
    try:
        return _stored_analysis(url, experiment_id, kind, key, stamp)
    except _Missing:
        return None


@st.cache_data(ttl=RESULT_TTL, max_entries=256, show_spinner=False)
def neighbours(url: str, query_version_id: int, gallery_version_id: int, view: str, query_index: int,
               k: int) -> dict[str, Any]:
    """Cross-model nearest neighbours of one query (engine.analysis.neighbours), numpy-only, in this process."""
    from engine.read.samples import nearest_neighbours

    return nearest_neighbours(db_engine(url), query_version_id, gallery_version_id, view, query_index, k)


# ---------------------------------------------------------------------------------------------- helpers


def pick_main(matrices_: list[dict[str, Any]], method: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """The headline matrix of an experiment: Recall@1 (else the first metric), its main view, its gallery kind."""
    if not matrices_:
        return None
    ev = config.get("eval", {})
    metric = "recall@1" if any(m["metric"] == "recall@1" for m in matrices_) else matrices_[0]["metric"]
    views = {m["view"] for m in matrices_}
    view = main_view(method) if main_view(method) in views else ("encoder" if "encoder" in views else sorted(views)[0])
    candidates = [m for m in matrices_ if m["metric"] == metric and m["view"] == view]
    preferred = [m for m in candidates if m["gallery_kind"] == ev.get("gallery", m["gallery_kind"])
                 and m["eval_classes"] == ev.get("eval_classes", m["eval_classes"])]
    return (preferred or candidates or [None])[0]


def ago(when: datetime | None) -> str:
    """'12 s ago', '3 min ago', ... for a UTC timestamp."""
    if when is None:
        return ""
    seconds = (datetime.now(timezone.utc) - when).total_seconds()
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h ago"
    return when.strftime("%Y-%m-%d %H:%M")
