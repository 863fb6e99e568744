"""The task mechanism (engine.tasks.loop): handlers are passed in, the loop is the only one that completes a task
(once, with what the handler returned), one heartbeat renews both leases, and task jobs are jobs of their own kind
(search, extract) known by their tasks, rows written before as kind "cell" included."""
from __future__ import annotations

import ast
import threading
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import update

import engine.tasks.loop as loop
from engine.jobs.task_handlers import TASK_HANDLERS
from engine.tasks.loop import Done, Heartbeat, run_one_task, run_tasks
from storage import Job, fail_stale_jobs, request_cancel, session_scope
from storage.clock import db_now
from storage.models import LEGACY_TASK_JOB_KIND, TASK_KINDS, Task
from storage.tasks import NewTask, create_task_job, job_result, task_kinds_of_jobs

ROOT = Path(__file__).resolve().parents[1]


def _graph(engine, payload=None) -> int:
    """Two searches and a reduce waiting for both."""
    with session_scope(engine) as s:
        return create_task_job(s, payload or {}, [NewTask("search", {"n": 0}), NewTask("search", {"n": 1}),
                                                  NewTask("reduce", {}, after=(0, 1))])


def _rows(engine, job_id):
    with session_scope(engine) as s:
        return (s.get(Job, job_id), list(s.query(Task).filter(Task.job_id == job_id).order_by(Task.id)))


def test_the_loop_completes_each_task_once_with_what_its_handler_returned(engine, monkeypatch):
    job_id = _graph(engine)
    calls = []
    real = loop.complete_task

    def counted(session, task_id, lease, **kw):
        calls.append(task_id)
        return real(session, task_id, lease, **kw)

    monkeypatch.setattr(loop, "complete_task", counted)
    handlers = {"search": lambda db, task: ({"n": task.payload["n"]}, {"x": np.full(2, task.payload["n"] + 0.5)}),
                "reduce": lambda db, task: Done({"message": "reduced"})}
    assert run_tasks(engine, "w", False, threading.Event(), handlers=handlers, poll_s=0.01, until_idle=True) == 3
    job, tasks = _rows(engine, job_id)
    assert sorted(calls) == [t.id for t in tasks]  # each task completed exactly once, by the loop
    assert [t.state for t in tasks] == ["done"] * 3
    assert [t.result for t in tasks] == [{"n": 0}, {"n": 1}, {"message": "reduced"}]
    np.testing.assert_array_equal(tasks[1].arrays["x"], [1.5, 1.5])
    assert tasks[2].arrays is None
    assert job.status == "done" and job.message == "reduced"
    with session_scope(engine) as s:
        assert job_result(s, job_id) == {"message": "reduced"}


def test_a_handlers_writes_go_with_its_done_and_nowhere_once_its_job_is_cancelled(engine):
    with session_scope(engine) as s:
        kept = create_task_job(s, {}, [NewTask("commit", {})])
        dropped = create_task_job(s, {}, [NewTask("commit", {})])
    written = []

    def commit(db, task):
        if task.job_id == dropped:  # the job is cancelled while its handler runs
            with session_scope(db) as s:
                request_cancel(s, task.job_id)
        return Done({"message": "committed"}, None, lambda s: written.append((task.job_id, s.is_active)))

    for job_id in (kept, dropped):
        assert run_one_task(engine, "w", handlers={"commit": commit}, has_gpu=False, job_id=job_id) is not None
    assert written == [(kept, True)]
    assert [t.state for t in _rows(engine, kept)[1]] == ["done"]
    job, tasks = _rows(engine, dropped)
    assert job.status == "cancelled" and [(t.state, t.result) for t in tasks] == [("cancelled", None)]


def test_a_failing_write_fails_the_attempt_and_leaves_the_task_not_done(engine):
    with session_scope(engine) as s:
        job_id = create_task_job(s, {}, [NewTask("commit", {})], max_attempts=2)

    def boom(s):
        raise OSError("store gone")

    run_one_task(engine, "w", handlers={"commit": lambda db, task: Done({"x": 1}, None, boom)}, has_gpu=False)
    job, (task,) = _rows(engine, job_id)
    assert (task.state, task.result, task.attempts) == ("queued", None, 1)
    assert task.error.startswith("OSError: store gone") and job.status == "running"


def test_no_handler_completes_its_own_task():
    """Only the mechanism calls ``complete_task``; the handlers and the rest of the engine never do."""
    callers = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name) and node.id == "complete_task" or \
                    isinstance(node, ast.alias) and node.name == "complete_task":
                callers.append(str(path.relative_to(ROOT)))
    assert set(callers) == {"engine/tasks/loop.py"}


def test_the_registry_is_one_plain_dict_of_every_task_kind():
    assert type(TASK_HANDLERS) is dict and sorted(TASK_HANDLERS) == sorted(TASK_KINDS)


def test_one_heartbeat_stops_when_its_lease_is_lost():
    beats = []
    renewed_twice = threading.Event()

    def renew():
        beats.append(1)
        if len(beats) == 2:
            renewed_twice.set()
        return len(beats) < 3

    beat = Heartbeat(renew, 0.01)
    beat.start()
    beat.join(30)
    assert not beat.is_alive() and len(beats) == 3 and renewed_twice.is_set()
    idle = Heartbeat(lambda: pytest.fail("renewed after stop"), 3600)
    idle.start()
    idle.stop()
    idle.join(30)
    assert not idle.is_alive()


def test_task_jobs_have_their_tasks_kind_and_old_cell_rows_still_read(engine):
    cells = _graph(engine)
    with session_scope(engine) as s:
        extract = create_task_job(s, {"kind": "extract"}, [NewTask("extract", {"rows": [0, 5]}),
                                                           NewTask("commit", {}, after=(0,))])
        old = create_task_job(s, {}, [NewTask("search", {}), NewTask("reduce", {}, after=(0,))])
        s.execute(update(Job).where(Job.id == old).values(kind=LEGACY_TASK_JOB_KIND))  # a row from before
        assert {j: s.get(Job, j).kind for j in (cells, extract, old)} == {cells: "search", extract: "extract",
                                                                           old: "cell"}
        assert task_kinds_of_jobs(s, [cells, extract, old, 999]) == {
            cells: {"search": 2, "reduce": 1}, extract: {"extract": 1, "commit": 1}, old: {"search": 1, "reduce": 1}}
        # an old row is still a task job: not failed for a silent heartbeat, and a cancel settles its tasks
        s.execute(update(Job).where(Job.id == old).values(heartbeat_at=db_now(s) - timedelta(hours=1)))
        assert fail_stale_jobs(s, 60) == []
        assert request_cancel(s, old) == "cancelled"
    assert {t.state for t in _rows(engine, old)[1]} == {"cancelled"}
