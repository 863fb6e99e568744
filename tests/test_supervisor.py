"""End to end: a killed worker under ``run_app.py`` and a paused worker past the stale limit (real processes).

(a) kill -9 of the worker while it runs a job: the dashboard keeps answering, the job and its experiment
read "failed" with the signal, a new worker takes the next job. (b) SIGSTOP of a worker until its job is
failed as stale and retried by a second worker, then SIGCONT: the late worker changes nothing.
Every wait is on a condition (a database row, a log line, an HTTP answer), with a deadline.
"""
from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import select

from engine.core.config import config_from_dict
from storage import Experiment, Job, enqueue_job, get_engine, init_db, retry_job, session_scope

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 300  # a loaded 2-core machine: imports of torch and streamlit alone take tens of seconds
T = TypeVar("T")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]


def _config(name: str, epochs: int) -> dict:
    """A digits run of two steps; ``epochs`` sets how long it trains."""
    return config_from_dict({"name": name, "methods": ["independent"], "dataset": {"name": "digits"},
                             "scenario": {"initial_classes": 5, "increment": 5, "num_steps": 2},
                             "model": {"width": 8}, "training": {"epochs": epochs, "batch_size": 32}}).to_dict()


def wait_for(what: str, check: Callable[[], T], log: Path | None = None) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` (and the log's tail) at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while not (value := check()):
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
            pytest.fail(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.2)
    return value


def _job(db, job_id: int) -> Job:
    with session_scope(db) as s:
        return s.get(Job, job_id)


def _experiments(db, study_id: int | None) -> list[Experiment]:
    with session_scope(db) as s:
        return list(s.scalars(select(Experiment).where(Experiment.study_id == study_id).order_by(Experiment.id)))


def _running_with_experiment(db, job_id: int) -> Job | None:
    """The job once it runs and its experiment (found through the study the worker linked) runs too."""
    job = _job(db, job_id)
    if job.status == "running" and any(e.status == "running" for e in _experiments(db, job.study_id)):
        return job
    return None


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/_stcore/health", timeout=5) as r:
            return r.status == 200 and r.read().strip() == b"ok"
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COMPATLAB_SECRET"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_killed_worker_fails_its_job_and_experiment_and_is_replaced(tmp_path):
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    db = get_engine(url)
    init_db(db)
    with session_scope(db) as s:
        long_job = enqueue_job(s, "run", {"config": _config("long", epochs=200)})
        next_job = enqueue_job(s, "run", {"config": _config("next", epochs=1)})
    port, log = _free_port(), tmp_path / "run_app.log"
    base = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        app = subprocess.Popen([sys.executable, "run_app.py", "--no-browser", "--no-demo", "--port", str(port),
                                "--db", url], cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        wait_for("the dashboard to answer", lambda: _healthy(base), log)
        job = wait_for("the long job to run its experiment", lambda: _running_with_experiment(db, long_job), log)
        os.kill(job.worker_pid, signal.SIGKILL)

        failed = wait_for("the killed job to be failed",
                          lambda: (j := _job(db, long_job)).status == "failed" and j, log)
        reason = "worker killed by signal 9 (SIGKILL), probably out of memory"
        assert failed.message.startswith(reason + "; last message: ") and failed.error == failed.message
        (experiment,) = _experiments(db, failed.study_id)
        assert (experiment.status, experiment.error) == ("failed", failed.message)

        done = wait_for("a new worker to run the next job", lambda: (j := _job(db, next_job)).status == "done" and j,
                        log)
        assert done.worker_pid != job.worker_pid
        assert [e.status for e in _experiments(db, done.study_id)] == ["done"]
        assert app.poll() is None and _healthy(base), "the dashboard stayed up"
        assert f"{reason}; failed job(s): #{long_job}; restarting the worker in 1 s" in log.read_text()
    finally:
        _stop(app)


def _writer_idle(path: Path) -> bool:
    """Whether no process holds SQLite's write lock (a stopped worker must not block the others)."""
    connection = sqlite3.connect(path, timeout=0.5)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        connection.close()


def _pause_outside_a_write(proc: subprocess.Popen, path: Path) -> bool:
    os.kill(proc.pid, signal.SIGSTOP)
    if _writer_idle(path):
        return True
    os.kill(proc.pid, signal.SIGCONT)  # it was stopped inside a write transaction: let it finish, try again
    return False


def test_a_paused_worker_cannot_overwrite_the_job_its_successor_finished(tmp_path):
    path = tmp_path / "lab.db"
    url = f"sqlite:///{path}"
    db = get_engine(url)
    init_db(db)
    with session_scope(db) as s:
        job_id = enqueue_job(s, "run", {"config": _config("paused", epochs=6)})
    env = _env(COMPATLAB_HEARTBEAT_S="0.2", COMPATLAB_STALE_AFTER_S="3")
    command = [sys.executable, "-m", "engine", "worker", "--db", url, "--checkpoints", str(tmp_path / "ckpt")]
    logs = [tmp_path / "worker1.log", tmp_path / "worker2.log"]
    workers: list[subprocess.Popen] = []
    try:
        with open(logs[0], "w") as out:
            workers.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True))
        wait_for("the first worker to train", lambda: "epoch" in _job(db, job_id).message, logs[0])
        wait_for("a pause outside a write", lambda: _pause_outside_a_write(workers[0], path), logs[0])

        with open(logs[1], "w") as out:
            workers.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True))
        stale = wait_for("the paused job to be failed as stale",
                         lambda: (j := _job(db, job_id)).status == "failed" and j, logs[1])
        assert stale.message.startswith("worker stopped (no heartbeat for ")
        with session_scope(db) as s:
            retried = retry_job(s, job_id)
        new = wait_for("the second worker to finish the retry",
                       lambda: (j := _job(db, retried)).status == "done" and j, logs[1])
        assert new.worker_pid == workers[1].pid
        (before,) = _experiments(db, new.study_id)
        assert before.status == "done"

        os.kill(workers[0].pid, signal.SIGCONT)
        wait_for("the late worker to notice", lambda: f"job {job_id} is no longer this worker's" in logs[0].read_text(),
                 logs[0])
        old, again = _job(db, job_id), _job(db, retried)
        assert (old.status, old.message, old.finished_at) == ("failed", stale.message, stale.finished_at)
        assert (again.status, again.message, again.finished_at) == ("done", new.message, new.finished_at)
        (after,) = _experiments(db, new.study_id)
        assert (after.status, after.error, after.finished_at) == ("done", None, before.finished_at)
    finally:
        for proc in workers:
            _stop(proc)
