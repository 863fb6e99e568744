"""storage job queue: exclusive claims, leases, progress and heartbeats, stale and dead workers, cancel and retry."""
import threading
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, event, inspect, select, text, update

from storage import (
    Experiment,
    Job,
    LeaseLost,
    claim_next_job,
    crashed_worker,
    create_experiment,
    create_study,
    enqueue_job,
    fail_job,
    fail_jobs_of_worker,
    fail_stale_jobs,
    finish_job,
    heartbeat,
    get_engine,
    init_db,
    is_cancel_requested,
    link_job_study,
    list_jobs,
    request_cancel,
    retry_job,
    session_scope,
    set_experiment_status,
    update_job_progress,
    worker_exit_reason,
)

pytestmark = pytest.mark.both_databases  # tests/conftest.py: SQLite and a throw-away PostgreSQL


def enqueue(engine, count: int = 1, **links) -> list[int]:
    with session_scope(engine) as session:
        return [enqueue_job(session, "train", {"n": n}, **links) for n in range(count)]


def get_job(engine, job_id: int) -> Job:
    with session_scope(engine) as session:
        return session.get(Job, job_id)


def test_claims_take_the_oldest_queued_job_once(engine):
    first, second = enqueue(engine, 2)
    job = claim_next_job(engine, worker_pid=101)
    assert (job.id, job.status, job.worker_pid, job.payload) == (first, "running", 101, {"n": 0})
    assert job.started_at is not None and job.heartbeat_at == job.started_at
    assert claim_next_job(engine, worker_pid=202).id == second
    assert claim_next_job(engine, worker_pid=303) is None
    assert get_job(engine, first).worker_pid == 101


def test_a_job_claimed_by_another_worker_in_between_is_skipped(engine):
    first, second = enqueue(engine, 2)
    rival = create_engine(engine.url)
    fired = []

    locking = engine.dialect.name == "postgresql"  # SELECT ... FOR UPDATE SKIP LOCKED: the rival skips our row
    rival_gets, we_get = (second, first) if locking else (first, second)

    @event.listens_for(engine, "before_cursor_execute")
    def rival_claims_first(connection, cursor, statement, parameters, context, executemany):
        if statement.startswith("UPDATE jobs") and not fired:
            fired.append(True)  # our worker has chosen its candidate; the rival commits a claim now
            assert claim_next_job(rival, worker_pid=2).id == rival_gets

    try:
        job = claim_next_job(engine, worker_pid=1)
    finally:
        event.remove(engine, "before_cursor_execute", rival_claims_first)
        rival.dispose()
    assert fired and (job.id, job.worker_pid) == (we_get, 1)
    assert get_job(engine, rival_gets).worker_pid == 2


def test_concurrent_workers_never_share_a_job(engine):
    job_ids = enqueue(engine, 200)  # 4 workers x 200 jobs: each claimed exactly once
    claimed: list[int] = []
    lock = threading.Lock()

    def worker(pid: int) -> None:
        while (job := claim_next_job(engine, worker_pid=pid)) is not None:
            with lock:
                claimed.append(job.id)

    threads = [threading.Thread(target=worker, args=(pid,)) for pid in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(claimed) == job_ids


def test_progress_updates_message_and_heartbeat_only_while_running(engine):
    (job_id,) = enqueue(engine)
    with session_scope(engine) as session:
        assert update_job_progress(session, job_id, 0.5, "epoch 5/10", lease="") is False  # still queued
    claimed = claim_next_job(engine, worker_pid=1)
    started, lease = claimed.heartbeat_at, claimed.lease
    with session_scope(engine) as session:
        assert update_job_progress(session, job_id, 0.5, "epoch 5/10", lease=lease) is True
        with pytest.raises(ValueError, match=r"progress must be a fraction in \[0, 1\], got 1.5"):
            update_job_progress(session, job_id, 1.5, "too far", lease=lease)
    job = get_job(engine, job_id)
    assert (job.progress, job.message) == (0.5, "epoch 5/10") and job.heartbeat_at >= started
    with session_scope(engine) as session:
        assert heartbeat(session, job_id, lease=lease) is True
        assert finish_job(session, job_id, lease=lease) is True
    job = get_job(engine, job_id)
    assert (job.status, job.progress) == ("done", 1.0) and job.finished_at is not None
    with session_scope(engine) as session:
        assert heartbeat(session, job_id, lease=lease) is False


def test_stale_running_jobs_fail_with_their_last_message(engine):
    with session_scope(engine) as session:
        experiment_id = create_experiment(session, name="e", method="bct", config={}, config_hash="h").id
        set_experiment_status(session, experiment_id, "running")
    stale_id, fresh_id, queued_id = enqueue(engine, 3, experiment_id=experiment_id)
    lease = claim_next_job(engine, worker_pid=1).lease
    claim_next_job(engine, worker_pid=2)
    with session_scope(engine) as session:
        update_job_progress(session, stale_id, 0.3, "epoch 3/10", lease=lease)
        last_beat = session.get(Job, stale_id).heartbeat_at
        session.get(Job, fresh_id).heartbeat_at = last_beat + timedelta(seconds=100)

    with session_scope(engine) as session:
        assert fail_stale_jobs(session, max_age_s=60, now=last_beat + timedelta(seconds=30)) == []
        assert fail_stale_jobs(session, max_age_s=60, now=last_beat + timedelta(seconds=120)) == [stale_id]

    stale = get_job(engine, stale_id)
    expected = "worker stopped (no heartbeat for 120 s); last message: epoch 3/10"
    assert (stale.status, stale.message, stale.error) == ("failed", expected, expected)
    assert get_job(engine, fresh_id).status == "running" and get_job(engine, queued_id).status == "queued"
    with session_scope(engine) as session:
        experiment = session.get(Experiment, experiment_id)
        assert (experiment.status, experiment.error) == ("failed", expected)
        # a late worker cannot revive it
        assert update_job_progress(session, stale_id, 0.4, "epoch 4/10", lease=lease) is False
        assert finish_job(session, stale_id, lease=lease) is False
    assert get_job(engine, stale_id).status == "failed"


def test_cancel_a_queued_job_at_once_and_flag_a_running_one(engine):
    running_id, queued_id = enqueue(engine, 2)
    claimed = claim_next_job(engine, worker_pid=1)
    assert claimed.id == running_id
    with session_scope(engine) as session:
        assert is_cancel_requested(session, running_id) is False
        assert request_cancel(session, queued_id) == "cancelled"
        assert request_cancel(session, running_id) == "running"
        assert is_cancel_requested(session, running_id) is True
        finish_job(session, running_id, "stopped at epoch 2", lease=claimed.lease, status="cancelled")
    assert claim_next_job(engine, worker_pid=1) is None
    job = get_job(engine, running_id)
    assert (job.status, job.message, job.progress) == ("cancelled", "stopped at epoch 2", 0.0)
    assert get_job(engine, queued_id).status == "cancelled"


def test_retry_queues_a_copy_of_a_finished_job(engine):
    (job_id,) = enqueue(engine)
    lease = claim_next_job(engine, worker_pid=1).lease
    with session_scope(engine) as session:
        with pytest.raises(ValueError, match=f"job {job_id} is still running"):
            retry_job(session, job_id)
        fail_job(session, job_id, "Traceback ...\nRuntimeError: NaN loss", lease=lease)
        new_id = retry_job(session, job_id)
    assert new_id != job_id
    old, new = get_job(engine, job_id), get_job(engine, new_id)
    assert (old.status, old.error) == ("failed", "Traceback ...\nRuntimeError: NaN loss")
    assert (new.status, new.kind, new.payload, new.progress, new.error) == ("queued", old.kind, old.payload, 0.0, None)
    assert claim_next_job(engine, worker_pid=2).id == new_id


def test_list_jobs_is_newest_first_and_filters(engine):
    with session_scope(engine) as session:
        experiment_id = create_experiment(session, name="e", method="bct", config={}, config_hash="h").id
        first = enqueue_job(session, "train", {})
        second = enqueue_job(session, "evaluate", {}, experiment_id=experiment_id)
    claim_next_job(engine, worker_pid=1)
    with session_scope(engine) as session:
        assert [job.id for job in list_jobs(session)] == [second, first]
        assert [job.id for job in list_jobs(session, status="queued")] == [second]
        assert [job.id for job in list_jobs(session, kind="train")] == [first]
        assert [job.id for job in list_jobs(session, experiment_id=experiment_id)] == [second]
        with pytest.raises(ValueError, match="status must be one of"):
            list_jobs(session, status="paused")
        with pytest.raises(ValueError, match="Experiment 99 does not exist"):
            enqueue_job(session, "train", {}, experiment_id=99)


# ------------------------------------------------------------------------------------------- leases


def test_a_worker_that_lost_its_lease_changes_nothing(engine):
    (job_id,) = enqueue(engine)
    old = claim_next_job(engine, worker_pid=1).lease
    with session_scope(engine) as session:  # the job is taken over: queued again and claimed by another worker
        session.execute(update(Job).where(Job.id == job_id).values(status="queued"))
    new = claim_next_job(engine, worker_pid=2).lease
    assert new != old and len(new) == 32
    with session_scope(engine) as session:
        assert update_job_progress(session, job_id, 0.9, "late", lease=old) is False
        assert heartbeat(session, job_id, lease=old) is False
        assert fail_job(session, job_id, "late failure", lease=old) is False
        assert finish_job(session, job_id, "late finish", lease=old) is False
        assert finish_job(session, job_id, "late cancel", lease=old, status="cancelled") is False
        with pytest.raises(LeaseLost, match=f"job {job_id} is no longer this worker's"):
            is_cancel_requested(session, job_id, lease=old)
        assert is_cancel_requested(session, job_id, lease=new) is False
        assert update_job_progress(session, job_id, 0.5, "new worker", lease=new) is True
    job = get_job(engine, job_id)
    assert (job.status, job.progress, job.message, job.error, job.worker_pid) == ("running", 0.5, "new worker", None, 2)
    with session_scope(engine) as session:
        assert finish_job(session, job_id, "done by the new worker", lease=new) is True
        assert finish_job(session, job_id, "late finish", lease=old) is False
        with pytest.raises(LeaseLost):  # finished: even the right lease no longer runs it
            is_cancel_requested(session, job_id, lease=new)
    assert (get_job(engine, job_id).status, get_job(engine, job_id).message) == ("done", "done by the new worker")


def test_a_dead_workers_jobs_and_running_experiments_fail_with_the_reason(engine):
    with session_scope(engine) as session:
        study = create_study(session, name="s", kind="compare", config={})
        running = [create_experiment(session, name=f"e{i}", method="bct", config={}, config_hash=f"h{i}",
                                     study_id=study.id).id for i in range(2)]
        done = create_experiment(session, name="d", method="bct", config={}, config_hash="hd", study_id=study.id).id
        other = create_experiment(session, name="o", method="bct", config={}, config_hash="ho").id
        for experiment_id in (*running, other):
            set_experiment_status(session, experiment_id, "running")
        set_experiment_status(session, done, "done")
    dead_job, alive_job = enqueue(engine, 2)
    dead_lease = claim_next_job(engine, worker_pid=41).lease
    claim_next_job(engine, worker_pid=42)
    reason = worker_exit_reason(-9)
    with session_scope(engine) as session:
        assert link_job_study(session, dead_job, study.id, lease=dead_lease) is True
        update_job_progress(session, dead_job, 0.2, "bct: step 1/3", lease=dead_lease)
        assert fail_jobs_of_worker(session, 41, reason) == [dead_job]
        assert fail_jobs_of_worker(session, 41, reason) == []  # already failed: nothing more
    expected = "worker killed by signal 9 (SIGKILL), probably out of memory; last message: bct: step 1/3"
    job = get_job(engine, dead_job)
    assert (job.status, job.message, job.error) == ("failed", expected, expected) and crashed_worker(job.error)
    assert get_job(engine, alive_job).status == "running"
    with session_scope(engine) as session:
        status = {e.id: (e.status, e.error) for e in session.scalars(select(Experiment))}
    assert [status[i] for i in running] == [("failed", expected)] * 2
    assert status[done] == ("done", None) and status[other] == ("running", None)


def test_worker_exit_reasons_and_crash_detection():
    assert worker_exit_reason(-9) == "worker killed by signal 9 (SIGKILL), probably out of memory"
    assert worker_exit_reason(-11) == "worker killed by signal 11 (SIGSEGV)"
    assert worker_exit_reason(3) == "worker exited with code 3"
    assert crashed_worker("worker stopped (no heartbeat for 80 s); last message: x")
    assert not crashed_worker("ValueError: loss became nan") and not crashed_worker(None)


def test_init_db_adds_the_lease_column_to_a_database_made_before_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with create_engine(url).begin() as connection:  # the jobs table as the first release created it
        connection.execute(text(
            "CREATE TABLE jobs (id INTEGER PRIMARY KEY, kind VARCHAR(50), payload JSON, status VARCHAR(20), "
            "progress FLOAT, message TEXT, error TEXT, experiment_id INTEGER, study_id INTEGER, worker_pid INTEGER, "
            "cancel_requested BOOLEAN, heartbeat_at DATETIME, created_at DATETIME NOT NULL, started_at DATETIME, "
            "finished_at DATETIME)"))
        connection.execute(text("INSERT INTO jobs (kind, payload, status, progress, message, cancel_requested, "
                                "created_at) VALUES ('run', '{}', 'queued', 0, 'queued', 0, '2026-01-01 00:00:00')"))
    old = get_engine(url)
    assert "lease" not in {c["name"] for c in inspect(old).get_columns("jobs")}
    init_db(old)
    init_db(old)  # a second start finds nothing to add
    assert "lease" in {c["name"] for c in inspect(old).get_columns("jobs")}
    claimed = claim_next_job(old, worker_pid=7)
    assert claimed.id == 1 and len(claimed.lease) == 32
    with session_scope(old) as session:
        assert finish_job(session, 1, lease=claimed.lease) is True
    assert get_job(old, 1).status == "done"
    old.dispose()
