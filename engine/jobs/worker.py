"""The background worker (``python -m engine worker``): claims queued jobs and runs them one at a time.

``--kinds`` restricts a worker to some job kinds: ``run_app.py`` starts one worker for every kind and a
second for the short lane (``engine.contract.SHORT_JOB_KINDS``: analysis, adapters, checkpoints), so a map,
an upgrade verdict or a checkpoint comparison is computed while a training run occupies the first worker.
Both claim the queued job they may take in ``engine.contract.JOB_PRIORITY`` order (analyses and adapters,
then comparisons, then training; the oldest among equals); the claim is atomic, so two workers never run
the same job.

Job kinds (payload formats):
* ``run``: ``{"config": RunConfig dict}`` or ``{"preset": NAME}``, optionally ``"tasks": {"block_rows": N,
  "shard_rows": N}`` (evaluate through tasks, ``engine.jobs.matrix``): train/evaluate a study.
* ``analysis``: ``{"experiment_id": id, "kind": ..., "params": {...}}``: see ``engine.analysis.run``.
* ``checkpoints``: ``{"spec": {...}}``: see ``engine.checkpoints.compare`` (bring-your-own models).
* ``adapters``: the fields of ``engine.jobs.adapt.AdapterJob`` (old/new model version ids, kind, view, ...).

The worker writes progress and a heartbeat under the lease of its claim; a job whose worker died is
marked failed by ``run_app.py`` (which saw it die) or by the next worker (``fail_stale_jobs``, no
heartbeat for ``STALE_AFTER_S``) with the reason and its last message, and can be retried. A cancel
request stops a run at the next batch; the run's rows are removed. ``COMPATLAB_HEARTBEAT_S`` and
``COMPATLAB_STALE_AFTER_S`` override the heartbeat period and the stale limit (seconds).
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection
from pathlib import Path

from sqlalchemy import Engine

from engine import threads
from engine.contract import JOB_PRIORITY
from storage import (
    LeaseLost,
    claim_next_job,
    fail_job,
    fail_stale_jobs,
    finish_job,
    heartbeat,
    init_db,
    is_cancel_requested,
    link_job_study,
    running_jobs_here,
    session_scope,
    update_job_progress,
)


def _env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment (tests shorten the heartbeat and stale limit)."""
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise SystemExit(f"{name} must be a positive number of seconds, got {raw!r}")
    return value


HEARTBEAT_S = _env_seconds("COMPATLAB_HEARTBEAT_S", 5.0)
STALE_AFTER_S = _env_seconds("COMPATLAB_STALE_AFTER_S", 60.0)


def _run_job(db: Engine, payload: dict, progress: Callable[[float, str], None], should_stop: Callable[[], bool],
             checkpoint_dir: Path | None, on_study: Callable[[int], None] | None = None) -> str:
    from engine.config import config_from_dict
    from engine.jobs.fan_out import FanOut
    from engine.run.pipeline import RunContext, run_study
    from engine.presets import preset_config

    cfg = preset_config(payload["preset"]) if "preset" in payload else config_from_dict(payload["config"])
    fan_out = FanOut(**payload["tasks"]) if payload.get("tasks") else None
    study_id, ids = run_study(cfg, RunContext(db, checkpoint_dir, progress, should_stop, on_study=on_study,
                                              fan_out=fan_out))
    return f"study {study_id}: experiments {', '.join(map(str, ids))}"


def _analysis_job(db: Engine, payload: dict, progress, should_stop, checkpoint_dir: Path | None, **_) -> str:
    from engine.analysis.run import run_analysis

    progress(0.1, f"computing {payload['kind']} for experiment {payload['experiment_id']}")
    run_analysis(db, int(payload["experiment_id"]), payload["kind"], payload.get("params", {}), progress=progress)
    return f"{payload['kind']} ready"


def _adapters_job(db: Engine, payload: dict, progress, should_stop, checkpoint_dir: Path | None, **_) -> str:
    from engine.jobs.adapt import AdapterJob, run_adapters

    job = AdapterJob(**{**payload, "orderings": tuple(payload.get("orderings", AdapterJob.orderings))})
    progress(0.1, f"fitting {job.kind} adapters {job.key}")
    result = run_adapters(db, job)
    best = next(r for r in result["table"] if r["row"] == "B(new)/F(old)" or r["row"] == "B(new)/old")
    return f"adapters {job.key} ready: {best['row']} Recall@1 {100 * best['recall@1']:.1f}%"


def _checkpoints_job(db: Engine, payload: dict, progress, should_stop, checkpoint_dir: Path | None, **_) -> str:
    from engine.checkpoints.compare import checkpoint_job

    return checkpoint_job(db, payload, progress, should_stop, checkpoint_dir)


HANDLERS: dict[str, Callable[..., str]] = {"run": _run_job, "analysis": _analysis_job, "adapters": _adapters_job,
                                           "checkpoints": _checkpoints_job}


class _Beat(threading.Thread):
    """Keeps the job's heartbeat fresh while a long step (e.g. feature extraction) runs; ends when the lease is lost."""

    def __init__(self, db: Engine, job_id: int, lease: str):
        super().__init__(daemon=True)
        self.db, self.job_id, self.lease, self.stop = db, job_id, lease, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            with session_scope(self.db) as s:
                if not heartbeat(s, self.job_id, lease=self.lease):
                    return


def run_one(db: Engine, *, checkpoint_dir: Path | None = None,
            kinds: Collection[str] | None = None, share_cores: bool = False) -> int | None:
    """Claim and run the next queued job (of ``kinds``, default any); return its id, or None when none is queued.

    ``share_cores``: run the job with ``cores // (jobs running on this machine)`` threads (``engine.threads``).
    ``checkpoint_dir``: where run jobs keep their ``experiment_<id>`` folders; None: the database's own folder
    (``storage.checkpoint_folders.checkpoint_root``), so two databases never share one.

    Every write about the job names the claim's lease: once the job is no longer this worker's
    (failed as stale while the worker was paused, taken over), the next progress report or cancel
    check raises :class:`storage.LeaseLost`, the job unwinds, and nothing about it is written.
    """
    from engine.run.training import Cancelled

    with session_scope(db) as s:
        fail_stale_jobs(s, STALE_AFTER_S)
    job = claim_next_job(db, os.getpid(), kinds=kinds, priority=JOB_PRIORITY)
    if job is None:
        return None
    if share_cores:  # this job included: the demo alone trains on every core, a check beside it splits them
        with session_scope(db) as s:
            threads.apply(threads.per_process(processes=running_jobs_here(s)))
    handler = HANDLERS.get(job.kind)
    lease = job.lease
    beat = _Beat(db, job.id, lease)
    beat.start()

    def progress(fraction: float, message: str) -> None:
        with session_scope(db) as s:
            if not update_job_progress(s, job.id, max(0.0, min(1.0, fraction)), message[:500], lease=lease):
                raise LeaseLost(job.id)

    def should_stop() -> bool:
        with session_scope(db) as s:
            return is_cancel_requested(s, job.id, lease=lease)

    def on_study(study_id: int) -> None:
        with session_scope(db) as s:
            if not link_job_study(s, job.id, study_id, lease=lease):
                raise LeaseLost(job.id)

    try:
        if handler is None:
            raise ValueError(f"unknown job kind {job.kind!r}; known kinds: {', '.join(HANDLERS)}")
        message = handler(db, job.payload, progress, should_stop, checkpoint_dir, on_study=on_study)
        with session_scope(db) as s:
            finish_job(s, job.id, message, lease=lease)
    except LeaseLost as exc:
        print(f"worker {os.getpid()}: {exc}", file=sys.stderr, flush=True)
    except Cancelled as exc:
        with session_scope(db) as s:
            finish_job(s, job.id, str(exc), lease=lease, status="cancelled")
    except Exception as exc:  # the job fails, the worker lives on
        with session_scope(db) as s:
            fail_job(s, job.id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}", str(exc)[:500],
                     lease=lease)
    finally:
        beat.stop.set()
    return job.id


def serve(db: Engine, *, poll_s: float = 1.0, once: bool = False, checkpoint_dir: Path | None = None,
          kinds: Collection[str] | None = None, share_cores: bool = False) -> None:
    """Run jobs (of ``kinds``, default any) until interrupted (``once``: until none is queued); ``share_cores``: see
    :func:`run_one`."""
    init_db(db)
    while True:
        ran = run_one(db, checkpoint_dir=checkpoint_dir, kinds=kinds, share_cores=share_cores)
        if ran is None:
            if once:
                return
            time.sleep(poll_s)
