"""One clock and a real identity (issue 24, item 8): heartbeats, leases and staleness use the database's clock, so a
worker whose clock is off cannot fail a healthy job or take over a fresh task; the supervisor fails only jobs its own
dead child (host, boot id, pid) claimed; a task job whose owner died is failed with its experiment and its tasks are
cancelled. SQLite and PostgreSQL."""
from datetime import timedelta

import pytest

import storage.jobs
import storage.tasks
import storage.types
from run_app import record_worker_death
from storage import Experiment, Job, claim_next_job, enqueue_job, fail_stale_jobs, heartbeat, session_scope
from storage.clock import db_now
from storage.identity import WorkerIdentity, identity
from storage.models import Task
from storage.tasks import (NewTask, claim_task, create_task_job, extend_lease, fail_orphaned_task_jobs,
                           renew_owner_lease)

pytestmark = pytest.mark.both_databases  # tests/conftest.py: SQLite and a throw-away PostgreSQL
SKEW_S = 150.0


def _skew(monkeypatch, seconds: float) -> None:
    """This process's clock runs ``seconds`` ahead (behind when negative), wherever storage reads the local time."""
    shifted = lambda: storage.types.datetime.now(storage.types.timezone.utc) + timedelta(seconds=seconds)  # noqa: E731
    for module in (storage.types, storage.jobs, storage.tasks):
        monkeypatch.setattr(module, "utcnow", shifted, raising=False)


def _job(engine, job_id: int) -> Job:
    with session_scope(engine) as s:
        return s.get(Job, job_id)


@pytest.mark.parametrize("skew", [SKEW_S, -SKEW_S])
def test_a_skewed_worker_cannot_fail_a_healthy_job(engine, monkeypatch, skew):
    with session_scope(engine) as s:
        job_id = enqueue_job(s, "run", {"preset": "digits-tiny"})
    job = claim_next_job(engine, 1)
    _skew(monkeypatch, skew)  # the healthy worker's heartbeat and the other worker's check both run skewed
    with session_scope(engine) as s:
        assert heartbeat(s, job_id, lease=job.lease)
        assert fail_stale_jobs(s, 60.0) == []
    monkeypatch.undo()
    with session_scope(engine) as s:  # an honest clock sees a fresh heartbeat too
        assert fail_stale_jobs(s, 60.0) == []
    assert _job(engine, job_id).status == "running"
    with session_scope(engine) as s:  # silent for longer than the limit by the database's clock: stale
        assert fail_stale_jobs(s, 60.0, now=db_now(s) + timedelta(seconds=61)) == [job_id]


@pytest.mark.parametrize("skew", [SKEW_S, -SKEW_S])
def test_a_skewed_worker_cannot_take_over_a_fresh_task(engine, monkeypatch, skew):
    with session_scope(engine) as s:
        job_id = create_task_job(s, {"test": True}, [NewTask("search", {"n": 0})])
    _skew(monkeypatch, skew)
    held = claim_task(engine, "honest:1", has_gpu=False, lease_s=60.0)
    assert held is not None
    assert claim_task(engine, "skewed:2", has_gpu=False, lease_s=60.0) is None
    with session_scope(engine) as s:
        assert extend_lease(s, held.id, held.lease, 60.0)
        lease_until, now = s.get(Task, held.id).lease_until, db_now(s)
    assert timedelta(seconds=55) < lease_until - now <= timedelta(seconds=60)  # written by the database's clock
    monkeypatch.undo()
    assert claim_task(engine, "honest:2", has_gpu=False, lease_s=60.0) is None
    later = claim_task(engine, "honest:3", has_gpu=False, lease_s=60.0, now=lease_until + timedelta(seconds=1))
    assert later is not None and later.id == held.id  # expired by the database's clock: taken over
    assert _job(engine, job_id).status == "running"


def test_the_supervisor_fails_only_its_own_childs_jobs(engine, db_url):
    me = identity(4242)
    others = [WorkerIdentity("another-host", me.boot_id, me.pid), WorkerIdentity(me.host, "an-earlier-boot", me.pid)]
    with session_scope(engine) as s:
        ids = [enqueue_job(s, "run", {"preset": "digits-tiny", "n": n}) for n in range(3)]
    claimed = [claim_next_job(engine, who).id for who in [*others, me.pid]]
    assert claimed == ids
    line = record_worker_death(db_url, 4242, -9)
    assert line.endswith(f"failed job(s): #{ids[2]}")
    assert [_job(engine, i).status for i in ids] == ["running", "running", "failed"]
    row = _job(engine, ids[2])
    assert (row.worker_host, row.worker_boot_id, row.worker_pid) == tuple(me)
    assert row.error.startswith("worker killed by signal 9")


def test_a_task_job_whose_owner_died_fails_with_its_experiment(engine):
    with session_scope(engine) as s:
        exp = Experiment(name="owned", method="independent", config={}, config_hash="x" * 64, status="running")
        s.add(exp)
        s.flush()
        exp_id = exp.id
        job_id = create_task_job(s, {"test": True}, [NewTask("search", {"n": n}) for n in range(3)],
                                 experiment_id=exp_id, owner_lease_s=30.0)
    owned = _job(engine, job_id)
    assert (owned.worker_host, owned.worker_boot_id, owned.worker_pid) == tuple(identity())
    running = claim_task(engine, "w:1", has_gpu=False, lease_s=600.0)
    with session_scope(engine) as s:  # a live owner renews; before its lease ends nothing happens
        assert renew_owner_lease(s, job_id, owned.lease, 30.0)
        assert not renew_owner_lease(s, job_id, "not-the-lease", 30.0)
        until = s.get(Job, job_id).lease_until
        assert fail_orphaned_task_jobs(s, until - timedelta(seconds=1)) == []
        assert fail_stale_jobs(s, 60.0, now=until - timedelta(seconds=1)) == []
    assert _job(engine, job_id).status == "running"
    with session_scope(engine) as s:  # the owner stopped renewing: the next worker that looks fails the job
        assert fail_stale_jobs(s, 60.0, now=until + timedelta(seconds=1)) == [job_id]
    job = _job(engine, job_id)
    assert job.status == "failed" and job.error.startswith("worker stopped") and f"task job {job_id}" in job.error
    with session_scope(engine) as s:
        assert s.get(Experiment, exp_id).status == "failed"
        assert s.get(Experiment, exp_id).error == job.error
        assert sorted(t.state for t in s.query(Task).filter(Task.job_id == job_id)) == ["cancelled"] * 3
        assert not renew_owner_lease(s, job_id, owned.lease, 30.0)
        assert not extend_lease(s, running.id, running.lease, 600.0)  # the running task's worker stops
    assert claim_task(engine, "w:2", has_gpu=False, lease_s=60.0, now=until + timedelta(hours=1)) is None


def test_an_unowned_task_job_outlives_any_silence(engine):
    with session_scope(engine) as s:
        job_id = create_task_job(s, {"test": True}, [NewTask("search", {"n": 0})])
        assert fail_orphaned_task_jobs(s, db_now(s) + timedelta(days=30)) == []
    assert _job(engine, job_id).status == "running" and _job(engine, job_id).lease_until is None
