"""A killed ``run --tasks`` (issue 24, item 8): the process that fanned a matrix out as tasks dies by SIGKILL mid-job;
once its owner lease runs out (by the database's clock) the next worker that looks fails the task job and the
experiment and cancels the remaining tasks, so nobody finishes them for nothing."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from storage import Experiment, Job, fail_stale_jobs, get_engine, init_db, session_scope
from storage.models import Task
from storage.tasks import claim_task

ROOT = Path(__file__).resolve().parents[1]


def _wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


@pytest.mark.slow
def test_a_killed_run_tasks_fails_its_experiment_and_cancels_its_tasks(tmp_path):
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    db = get_engine(url)
    init_db(db)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COMPATLAB_OWNER_LEASE_S": "5"}
    run = subprocess.Popen([sys.executable, "-m", "engine", "run", "--preset", "digits-tiny", "--tasks",
                            "--task-block-rows", "50", "--task-shard-rows", "100", "--db", url],
                           cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def first_task_done():
            with session_scope(db) as s:
                return s.scalar(select(Task.job_id).where(Task.state == "done").limit(1))

        job_id = _wait_for(lambda: first_task_done() or run.poll() is not None, 600, "the first task to finish")
        assert run.poll() is None, run.stderr.read().decode()[-2000:]
        run.send_signal(signal.SIGKILL)
        run.wait()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    with session_scope(db) as s:
        job = s.get(Job, job_id)
        assert job.kind == "search" and job.status == "running" and job.worker_pid == run.pid
        exp_id = job.experiment_id
        assert s.get(Experiment, exp_id).status == "running"
        unfinished = s.scalar(select(func.count()).select_from(Task).where(Task.job_id == job_id,
                                                                           Task.state.in_(("queued", "running"))))
    assert unfinished > 0  # killed mid-job

    def swept():  # what every worker does before it claims a job
        with session_scope(db) as s:
            return fail_stale_jobs(s, 3600.0)

    assert _wait_for(swept, 120, "the owner's lease to expire") == [job_id]
    with session_scope(db) as s:
        job, experiment = s.get(Job, job_id), s.get(Experiment, exp_id)
        assert job.status == "failed" and job.error.startswith("worker stopped")
        assert experiment.status == "failed" and experiment.error == job.error
        states = dict(s.execute(select(Task.state, func.count()).where(Task.job_id == job_id).group_by(Task.state)).all())
    assert set(states) <= {"done", "cancelled"} and states["cancelled"] == unfinished
    assert claim_task(db, "helper:1", has_gpu=False, lease_s=60.0) is None  # nothing left to do for nobody
