"""storage.tasks and engine.tasks.loop: many worker processes share one job's tasks exactly once; a killed worker's
task finishes elsewhere after its lease expires; a failing task stops after its bound; dependencies are counted;
a cell fanned out over blocks and shards equals the single-shot metrics. SQLite and PostgreSQL."""
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from engine.evaluate.search_tasks import fan_out_cell
from engine.jobs.task_handlers import TASK_HANDLERS
from engine.tasks.loop import run_one_task, run_tasks
from engine.metrics.retrieval import retrieval_metrics
from storage import Job, add_model_version, retry_job, create_experiment, fail_stale_jobs, get_engine, init_db, save_feature_set, session_scope
from storage.models import Task
from storage.tasks import NewTask, claim_task, complete_task, create_task_job, job_result, task_board
from support.sharded import _cell  # exact float32 similarities with many ties, queries without positives

pytestmark = pytest.mark.both_databases  # tests/conftest.py: SQLite and a throw-away PostgreSQL
FORK = multiprocessing.get_context("fork")


def _job(engine, count: int, **kw) -> int:
    with session_scope(engine) as s:
        return create_task_job(s, {"test": True}, [NewTask("search", {"n": n}) for n in range(count)], **kw)


def _tasks(engine, job_id: int) -> list[Task]:
    with session_scope(engine) as s:
        return list(s.query(Task).filter(Task.job_id == job_id).order_by(Task.id))


def _get_job(engine, job_id: int) -> Job:
    with session_scope(engine) as s:
        return s.get(Job, job_id)


def _signed(db, task):
    """A handler whose result says who ran it."""
    return {"by": task.worker}, {"id": np.array([task.id])}


def _wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _worker_process(url: str, name: str, handlers: dict, lease_s: float = 30.0) -> None:
    db = get_engine(url)
    db.dispose(close=False)  # a forked child opens its own connections
    run_tasks(db, name, False, threading.Event(), lease_s=lease_s, poll_s=0.05, until_idle=True, handlers=handlers)


def test_four_worker_processes_claim_each_of_200_tasks_exactly_once(engine, db_url):
    job_id = _job(engine, 200)
    workers = [FORK.Process(target=_worker_process, args=(db_url, f"w{i}", {"search": _signed})) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
        assert w.exitcode == 0
    tasks = _tasks(engine, job_id)
    assert len(tasks) == 200
    assert {t.state for t in tasks} == {"done"}
    assert [t.attempts for t in tasks] == [1] * 200  # a second claim would have counted a second attempt
    assert all(t.result == {"by": t.worker} and t.arrays["id"].tolist() == [t.id] for t in tasks)
    assert {t.worker for t in tasks} <= {"w0", "w1", "w2", "w3"}
    job = _get_job(engine, job_id)
    assert (job.status, job.progress) == ("done", 1.0)


def _block_when_victim(marker: Path):
    def handler(db, task):
        if task.worker == "victim":
            marker.write_text(task.lease)  # mid-task: tell the test, then hang until killed
            threading.Event().wait()
        return _signed(db, task)
    return handler


def test_a_killed_workers_task_finishes_elsewhere_after_its_lease_expires(engine, db_url, tmp_path):
    job_id = _job(engine, 1)
    marker = tmp_path / "victim-started"
    victim = FORK.Process(target=_worker_process, args=(db_url, "victim", {"search": _block_when_victim(marker)}, 1.0))
    victim.start()
    _wait_for(marker.exists)
    _wait_for(lambda: marker.read_text() != "")
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=30)
    assert victim.exitcode == -signal.SIGKILL
    [task] = _tasks(engine, job_id)
    assert (task.state, task.worker, task.result, task.arrays) == ("running", "victim", None, None)  # nothing half-written

    ran = run_tasks(engine, "survivor", False, threading.Event(), lease_s=30, poll_s=0.05, until_idle=True,
                    handlers={"search": _block_when_victim(marker)})
    assert ran == 1
    [task] = _tasks(engine, job_id)
    assert (task.state, task.worker, task.attempts, task.result) == ("done", "survivor", 2, {"by": "survivor"})
    with session_scope(engine) as s:  # the victim's lease can write nothing any more
        assert not complete_task(s, task.id, marker.read_text(), result={"by": "victim"})
    assert _tasks(engine, job_id)[0].result == {"by": "survivor"}
    assert _get_job(engine, job_id).status == "done"


def test_a_failing_task_stops_after_its_bound_and_fails_its_job_with_the_error(engine):
    job_id = _job(engine, 3, max_attempts=3)

    def failing(db, task):
        if task.payload["n"] == 1:
            raise RuntimeError("disk on fire")
        return _signed(db, task)

    run_tasks(engine, "w", False, threading.Event(), poll_s=0.01, until_idle=True, handlers={"search": failing})
    tasks = _tasks(engine, job_id)
    bad = tasks[1]
    assert (bad.state, bad.attempts) == ("failed", 3)
    assert bad.error.startswith("RuntimeError: disk on fire")
    assert {t.state for t in (tasks[0], tasks[2])} <= {"done", "cancelled"}
    job = _get_job(engine, job_id)
    assert job.status == "failed"
    assert job.error.startswith(f"task {bad.id} (search) failed after 3 attempt(s): RuntimeError: disk on fire")
    with session_scope(engine) as s:
        assert job_result(s, job_id) is None
        # no worker claims a task job's row: a copy of it would wait forever, so a retry is refused in one line
        with pytest.raises(ValueError, match=f"job {job_id} ran as tasks; rerun the command"):
            retry_job(s, job_id)
        assert s.query(Job).count() == 1


def test_a_lease_that_expires_on_the_last_attempt_fails_the_task_and_its_job(engine):
    job_id = _job(engine, 2, max_attempts=1)
    task = claim_task(engine, "gone:1", has_gpu=False, lease_s=5)
    later = task.lease_until + timedelta(seconds=1)
    other = claim_task(engine, "w:2", has_gpu=False, lease_s=5, now=later)
    assert other is None  # the expired task is failed, not retried; its job's other task is cancelled with it
    assert [(t.state, t.attempts) for t in _tasks(engine, job_id)] == [("failed", 1), ("cancelled", 0)]
    assert "worker gone:1 stopped answering (lease expired) on attempt 1 of 1" in _get_job(engine, job_id).error


def test_a_task_job_waiting_for_workers_is_not_failed_as_stale(engine):
    job_id = _job(engine, 1)
    with session_scope(engine) as s:
        assert fail_stale_jobs(s, 1.0, now=_get_job(engine, job_id).heartbeat_at + timedelta(hours=1)) == []
    assert _get_job(engine, job_id).status == "running"


def test_worker_tasks_command_runs_a_cell_until_none_is_left(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    db = get_engine(url)
    init_db(db)
    q, ql, g, gl = _cell(seed=5, n=60, nq=20)
    ids = _store(db, {"query": (q, ql), "gallery": (g, gl)})
    job_id = fan_out_cell(db, query=ids["query"], gallery=ids["gallery"], ks=(1,), block_rows=8, shard_rows=25)
    done = subprocess.run([sys.executable, "-m", "engine", "worker", "--tasks", "--once", "--db", url],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with session_scope(db) as s:
        assert job_result(s, job_id)["metrics"] == pytest.approx(retrieval_metrics(q, ql, g, gl, ks=(1,)), abs=1e-12)
        assert {line.worker.split(":")[0] for line in task_board(s, job_id).lines} == {socket.gethostname()}


def test_dependencies_gpu_tasks_and_the_task_board(engine):
    with session_scope(engine) as s:
        job_id = create_task_job(s, {}, [NewTask("search", {"n": 0}), NewTask("search", {"n": 1}, needs_gpu=True),
                                          NewTask("reduce", {}, after=(0, 1))])
    first = claim_task(engine, "cpu:1", has_gpu=False, lease_s=30)
    assert first.payload == {"n": 0}
    assert claim_task(engine, "cpu:1", has_gpu=False, lease_s=30) is None  # GPU task: not for this worker; reduce waits
    gpu = claim_task(engine, "gpu:2", has_gpu=True, lease_s=30)
    assert gpu.payload == {"n": 1} and gpu.needs_gpu
    with session_scope(engine) as s:
        board = task_board(s, job_id)
    assert board.counts == {"running": 2, "queued": 1}
    assert [(line.state, line.kind, line.worker, line.count) for line in board.lines] == [
        ("running", "search", "cpu:1", 1), ("running", "search", "gpu:2", 1), ("queued", "reduce", None, 1)]
    with session_scope(engine) as s:
        assert complete_task(s, first.id, first.lease, result={"a": 1})
    assert claim_task(engine, "cpu:1", has_gpu=False, lease_s=30) is None  # the reduce still waits for the GPU task
    with session_scope(engine) as s:
        assert complete_task(s, gpu.id, gpu.lease)
    reduce = claim_task(engine, "cpu:1", has_gpu=False, lease_s=30)
    assert reduce.kind == "reduce" and reduce.upstream == [first.id, gpu.id] and reduce.deps_left == 0
    with session_scope(engine) as s:
        assert complete_task(s, reduce.id, reduce.lease, result={"metrics": {"x": 1}, "message": "all good"})
        assert job_result(s, job_id) == {"metrics": {"x": 1}, "message": "all good"}
    job = _get_job(engine, job_id)
    assert (job.status, job.message) == ("done", "all good")


def _store(engine, features: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, int]:
    with session_scope(engine) as s:
        exp = create_experiment(s, name="big", method="none", config={}, config_hash="h")
        mv = add_model_version(s, exp.id, 1, architecture="x", method="none", classes=[0], num_outputs=1, feature_dim=64)
        return {split: save_feature_set(s, mv.id, split, "encoder", f, y) for split, (f, y) in features.items()}


@pytest.mark.parametrize("same_set", [False, True])
def test_a_fanned_out_cell_equals_the_single_shot_metrics(engine, same_set):
    q, ql, g, gl = _cell(seed=3)
    if same_set:
        q, ql = g, gl
    ids = _store(engine, {"query": (q, ql), "gallery": (g, gl)})
    job_id = fan_out_cell(engine, query=ids["gallery" if same_set else "query"], gallery=ids["gallery"],
                          same_set=same_set, ks=(1, 5), map_at=10, block_rows=130 if same_set else 33, shard_rows=70)
    with session_scope(engine) as s:  # 3 uneven query blocks x 5 gallery shards (4 x 70 + 20), two passes, one reduce
        assert task_board(s, job_id).counts == {"queued": 3 * 5 * 2 + 1}
    while run_one_task(engine, "w", has_gpu=False, handlers=TASK_HANDLERS) is not None:
        pass
    with session_scope(engine) as s:
        got = job_result(s, job_id)["metrics"]
    want = retrieval_metrics(q, ql, g, gl, ks=(1, 5), map_at=10, same_set=same_set)
    assert got == pytest.approx(want, rel=0, abs=1e-12)
    assert got["recall@1"] == want["recall@1"]


def test_fan_out_refuses_bad_cells_before_writing(engine):
    q, ql, g, gl = _cell()
    ids = _store(engine, {"query": (q, ql), "gallery": (g, gl)})
    for kw, match in [({"query": 999}, "feature set 999 is missing"), ({"same_set": True}, "same_set needs"),
                      ({"ks": (0,)}, "every k must be >= 1"), ({"shard_rows": 0}, "must be >= 1"),
                      ({"ties": "coin"}, "unknown tie rule")]:
        with pytest.raises(ValueError, match=match):
            fan_out_cell(engine, **({"query": ids["query"], "gallery": ids["gallery"]} | kw))
    with session_scope(engine) as s:
        assert s.query(Job).count() == 0 and s.query(Task).count() == 0
