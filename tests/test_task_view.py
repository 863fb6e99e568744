"""Cancelling a task job (storage.tasks through storage.jobs.request_cancel): its queued tasks are cancelled at once,
a running task stops at its next lease renewal (or completion, or failure) and writes nothing, and the job ends
"cancelled" once no task runs. SQLite and PostgreSQL."""
import threading
import time
from datetime import timedelta

import numpy as np
import pytest

from engine.tasks.loop import run_one_task
from storage import Job, request_cancel, session_scope
from storage.models import Task
from storage.tasks import NewTask, claim_task, complete_task, create_task_job, extend_lease, fail_task, task_board
from storage.types import utcnow

pytestmark = pytest.mark.both_databases  # tests/conftest.py: SQLite and a throw-away PostgreSQL


def _job(engine, count: int = 3) -> int:
    with session_scope(engine) as s:
        return create_task_job(s, {"query": 1, "gallery": 2}, [NewTask("search", {"n": n}) for n in range(count)])


def _states(engine, job_id: int) -> tuple[str, list[str]]:
    with session_scope(engine) as s:
        tasks = s.query(Task).filter(Task.job_id == job_id).order_by(Task.id)
        return s.get(Job, job_id).status, [t.state for t in tasks]


def _cancel(engine, job_id: int) -> str:
    with session_scope(engine) as s:
        return request_cancel(s, job_id)


def _wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_cancel_with_no_task_running_cancels_every_task_and_the_job_at_once(engine):
    job_id = _job(engine)
    assert _cancel(engine, job_id) == "cancelled"
    assert _states(engine, job_id) == ("cancelled", ["cancelled"] * 3)
    assert claim_task(engine, "w", has_gpu=False, lease_s=30) is None


def test_a_running_task_is_cancelled_at_its_next_lease_renewal_then_the_job(engine):
    job_id = _job(engine)
    task = claim_task(engine, "w", has_gpu=False, lease_s=30)
    assert _cancel(engine, job_id) == "running"  # one task still runs
    assert _states(engine, job_id) == ("running", ["running", "cancelled", "cancelled"])
    assert claim_task(engine, "other", has_gpu=False, lease_s=30) is None
    with session_scope(engine) as s:
        assert extend_lease(s, task.id, task.lease, 30) is False
    assert _states(engine, job_id) == ("cancelled", ["cancelled"] * 3)
    with session_scope(engine) as s:  # the worker's late result is written nowhere
        assert complete_task(s, task.id, task.lease, result={"x": 1}, arrays={"a": np.ones(2)}) is False
        row = s.get(Task, task.id)
        assert (row.state, row.result, row.arrays) == ("cancelled", None, None)


@pytest.mark.parametrize("ending", ["complete", "fail"])
def test_a_task_finishing_after_the_cancel_writes_nothing(engine, ending):
    job_id = _job(engine, 2)
    first = claim_task(engine, "w1", has_gpu=False, lease_s=30)
    second = claim_task(engine, "w2", has_gpu=False, lease_s=30)
    _cancel(engine, job_id)
    with session_scope(engine) as s:
        if ending == "complete":
            assert complete_task(s, first.id, first.lease, result={"x": 1}) is False
        else:
            assert fail_task(s, first.id, first.lease, "boom") == "cancelled"
    assert _states(engine, job_id) == ("running", ["cancelled", "running"])  # w2 still runs
    with session_scope(engine) as s:
        assert s.get(Task, first.id).result is None and s.get(Task, first.id).error is None
        assert complete_task(s, second.id, second.lease, result={"x": 2}) is False
    assert _states(engine, job_id) == ("cancelled", ["cancelled", "cancelled"])


def test_a_dead_workers_task_of_a_cancelled_job_is_settled_when_its_lease_expires(engine):
    job_id = _job(engine, 2)
    claim_task(engine, "dead", has_gpu=False, lease_s=5)
    _cancel(engine, job_id)
    assert _states(engine, job_id) == ("running", ["running", "cancelled"])
    later = utcnow() + timedelta(seconds=10)
    assert claim_task(engine, "w", has_gpu=False, lease_s=5, now=later) is None  # a worker's poll settles it
    assert _states(engine, job_id) == ("cancelled", ["cancelled", "cancelled"])


def test_a_worker_running_a_task_notices_the_cancel_at_its_heartbeat(engine):
    """run_one_task with a short lease: the heartbeat cancels the task while the handler still runs; the handler's
    result is then written nowhere and the job ends cancelled."""
    job_id = _job(engine, 3)
    started, release = threading.Event(), threading.Event()

    def handler(db, task):
        started.set()
        release.wait(30)
        return {"late": True}, {"a": np.ones(3)}

    worker = threading.Thread(target=run_one_task, args=(engine, "w"),
                              kwargs={"has_gpu": False, "lease_s": 0.3, "handlers": {"search": handler}})
    worker.start()
    assert started.wait(30)
    _cancel(engine, job_id)
    _wait_for(lambda: _states(engine, job_id) == ("cancelled", ["cancelled"] * 3))
    release.set()
    worker.join(30)
    assert not worker.is_alive()
    with session_scope(engine) as s:
        assert all(t.result is None and t.arrays is None for t in s.query(Task).filter(Task.job_id == job_id))
        board = task_board(s, job_id)
    assert board.counts == {"cancelled": 3}


def test_the_board_keeps_a_failed_tasks_first_error(engine):
    with session_scope(engine) as s:
        job_id = create_task_job(s, {}, [NewTask("search", {}), NewTask("search", {})], max_attempts=1)
    task = claim_task(engine, "host:7", has_gpu=False, lease_s=30)
    with session_scope(engine) as s:
        assert fail_task(s, task.id, task.lease, "ValueError: boom\ntraceback") == "failed"
        board = task_board(s, job_id)
    failed = [line for line in board.lines if line.state == "failed"]
    assert [(line.worker, line.count, line.error) for line in failed] == [("host:7", 1, "ValueError: boom\ntraceback")]
    assert board.counts == {"failed": 1, "cancelled": 1}
