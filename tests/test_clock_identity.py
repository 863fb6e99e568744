"""One clock and a real identity (issue 24, item 8): heartbeats, leases and staleness use the database's clock, so a
worker whose clock is off cannot fail a healthy job; the supervisor fails only jobs its own dead child (host, boot id,
pid) claimed. SQLite and PostgreSQL."""
from datetime import timedelta

import pytest

import storage.jobs
import storage.types
from run_app import record_worker_death
from storage import Job, claim_next_job, enqueue_job, fail_stale_jobs, heartbeat, session_scope
from storage.clock import db_now
from storage.identity import WorkerIdentity, identity

pytestmark = pytest.mark.both_databases  # tests/conftest.py: SQLite and a throw-away PostgreSQL
SKEW_S = 150.0


def _skew(monkeypatch, seconds: float) -> None:
    """This process's clock runs ``seconds`` ahead (behind when negative), wherever storage reads the local time."""
    shifted = lambda: storage.types.datetime.now(storage.types.timezone.utc) + timedelta(seconds=seconds)  # noqa: E731
    for module in (storage.types, storage.jobs):
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
