"""The background worker (``python -m engine worker``): claims queued jobs and runs them one at a time.

Job kinds (payload formats):
* ``run``: ``{"config": RunConfig dict}`` or ``{"preset": NAME}``: train/evaluate a study.
* ``analysis``: ``{"experiment_id": id, "kind": ..., "params": {...}}``: see ``engine.analysis``.
* ``checkpoints``: ``{"spec": {...}}``: see ``engine.checkpoints.compare`` (bring-your-own models).
* ``adapters``: the fields of ``engine.adapt.AdapterJob`` (old/new model version ids, kind, view, ...).

The worker writes progress and a heartbeat; a job whose worker died is marked failed by the next
worker (``fail_stale_jobs``) with its last message, and can be retried. A cancel request stops a
run at the next batch; the run's rows are removed.
"""
from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from storage import (
    claim_next_job,
    fail_job,
    fail_stale_jobs,
    finish_job,
    heartbeat,
    init_db,
    is_cancel_requested,
    session_scope,
    update_job_progress,
)

HEARTBEAT_S = 5.0
STALE_AFTER_S = 60.0


def _run_job(db: Engine, payload: dict, progress: Callable[[float, str], None], should_stop: Callable[[], bool],
             checkpoint_dir: Path) -> str:
    from engine.config import config_from_dict
    from engine.pipeline import RunContext, run_study
    from engine.presets import preset_config

    cfg = preset_config(payload["preset"]) if "preset" in payload else config_from_dict(payload["config"])
    study_id, ids = run_study(cfg, RunContext(db, checkpoint_dir, progress, should_stop))
    return f"study {study_id}: experiments {', '.join(map(str, ids))}"


def _analysis_job(db: Engine, payload: dict, progress, should_stop, checkpoint_dir: Path) -> str:
    from engine.analysis import run_analysis

    progress(0.1, f"computing {payload['kind']} for experiment {payload['experiment_id']}")
    run_analysis(db, int(payload["experiment_id"]), payload["kind"], payload.get("params", {}), progress=progress)
    return f"{payload['kind']} ready"


def _adapters_job(db: Engine, payload: dict, progress, should_stop, checkpoint_dir: Path) -> str:
    from engine.adapt import AdapterJob, run_adapters

    job = AdapterJob(**{**payload, "orderings": tuple(payload.get("orderings", AdapterJob.orderings))})
    progress(0.1, f"fitting {job.kind} adapters {job.key}")
    result = run_adapters(db, job)
    best = next(r for r in result["table"] if r["row"] == "B(new)/F(old)" or r["row"] == "B(new)/old")
    return f"adapters {job.key} ready: {best['row']} Recall@1 {100 * best['recall@1']:.1f}%"


def _checkpoints_job(db: Engine, payload: dict, progress, should_stop, checkpoint_dir: Path) -> str:
    from engine.checkpoints.compare import checkpoint_job

    return checkpoint_job(db, payload, progress, should_stop, checkpoint_dir)


HANDLERS: dict[str, Callable[..., str]] = {"run": _run_job, "analysis": _analysis_job, "adapters": _adapters_job,
                                           "checkpoints": _checkpoints_job}


class _Beat(threading.Thread):
    """Keeps the job's heartbeat fresh while a long step (e.g. feature extraction) runs."""

    def __init__(self, db: Engine, job_id: int):
        super().__init__(daemon=True)
        self.db, self.job_id, self.stop = db, job_id, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            with session_scope(self.db) as s:
                heartbeat(s, self.job_id)


def run_one(db: Engine, *, checkpoint_dir: Path = Path("data") / "checkpoints") -> int | None:
    """Claim and run the next queued job; return its id, or None when the queue is empty."""
    from engine.training import Cancelled

    with session_scope(db) as s:
        fail_stale_jobs(s, STALE_AFTER_S)
    job = claim_next_job(db, os.getpid())
    if job is None:
        return None
    handler = HANDLERS.get(job.kind)
    beat = _Beat(db, job.id)
    beat.start()

    def progress(fraction: float, message: str) -> None:
        with session_scope(db) as s:
            update_job_progress(s, job.id, max(0.0, min(1.0, fraction)), message[:500])

    def should_stop() -> bool:
        with session_scope(db) as s:
            return is_cancel_requested(s, job.id)

    try:
        if handler is None:
            raise ValueError(f"unknown job kind {job.kind!r}; known kinds: {', '.join(HANDLERS)}")
        message = handler(db, job.payload, progress, should_stop, checkpoint_dir)
        with session_scope(db) as s:
            finish_job(s, job.id, message)
    except Cancelled as exc:
        with session_scope(db) as s:
            finish_job(s, job.id, str(exc), status="cancelled")
    except Exception as exc:  # the job fails, the worker lives on
        with session_scope(db) as s:
            fail_job(s, job.id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}", str(exc)[:500])
    finally:
        beat.stop.set()
    return job.id


def serve(db: Engine, *, poll_s: float = 1.0, once: bool = False, checkpoint_dir: Path = Path("data") / "checkpoints") -> None:
    """Run jobs until interrupted (``once``: until the queue is empty)."""
    init_db(db)
    while True:
        ran = run_one(db, checkpoint_dir=checkpoint_dir)
        if ran is None:
            if once:
                return
            time.sleep(poll_s)
