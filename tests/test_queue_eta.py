"""Checks never wait behind training, and every queued job says when it should start (engine.core.contract's lanes and
priorities, storage.jobs' claim order, storage.queue_eta's estimates, the caption the pages show)."""
from __future__ import annotations

from datetime import timedelta

import pytest

from app.widgets import queue_caption
from engine.core.contract import JOB_LANES, JOB_PRIORITY, SHORT_JOB_KINDS
from storage import (
    Job,
    QueuePlace,
    claim_next_job,
    enqueue_job,
    finish_job,
    lane_starts_s,
    queue_start_estimates,
    session_scope,
)
from storage.jobs import payload_hash
from storage.types import utcnow


@pytest.fixture
def db(engine):
    """A fresh database: SQLite, and PostgreSQL too for tests marked ``both_databases``."""
    return engine


# ------------------------------------------------------------------------------------------------ claim order


@pytest.mark.both_databases
def test_a_comparison_queued_behind_the_demo_is_claimed_first(db):
    """The demo runs on the general worker and a second training run waits; a comparison queued after both is taken
    by the short lane's worker at once, and by the general worker before the older run once that worker is free."""
    with session_scope(db) as s:
        demo = enqueue_job(s, "run", {"preset": "quick-demo"})
        waiting_run = enqueue_job(s, "run", {"preset": "digits-tiny"})
    general = claim_next_job(db, 1, priority=JOB_PRIORITY)
    assert general.id == demo  # the demo is running
    with session_scope(db) as s:
        comparison = enqueue_job(s, "checkpoints", {"spec": {"models": ["a", "b"]}})
        upgrade = enqueue_job(s, "analysis", {"kind": "upgrade"})
        later = enqueue_job(s, "checkpoints", {"spec": {"models": ["c", "d"]}})

    # the short lane's worker: the upgrade verdict (priority 0) before the older comparison (1); never a run
    assert claim_next_job(db, 2, kinds=SHORT_JOB_KINDS, priority=JOB_PRIORITY).id == upgrade
    assert claim_next_job(db, 2, kinds=SHORT_JOB_KINDS, priority=JOB_PRIORITY).id == comparison
    with session_scope(db) as s:
        finish_job(s, demo, lease=general.lease)  # the general worker is free: the check goes before the older run
    assert claim_next_job(db, 1, priority=JOB_PRIORITY).id == later
    assert claim_next_job(db, 1, priority=JOB_PRIORITY).id == waiting_run
    assert claim_next_job(db, 1, priority=JOB_PRIORITY) is None
    with session_scope(db) as s:
        assert {j.id: j.worker_pid for j in s.query(Job)} == {demo: 1, waiting_run: 1, comparison: 2, upgrade: 2,
                                                             later: 1}


def test_without_priorities_a_worker_claims_oldest_first(db):
    with session_scope(db) as s:
        run = enqueue_job(s, "run", {"preset": "digits-tiny"})
        comparison = enqueue_job(s, "checkpoints", {"spec": {}})
    assert [claim_next_job(db, 1).id, claim_next_job(db, 1).id] == [run, comparison]


def test_comparisons_and_upgrade_checks_are_in_the_short_lane():
    assert {"checkpoints", "analysis", "adapters"} <= set(SHORT_JOB_KINDS) == set(JOB_LANES["short"])
    assert JOB_LANES["main"] == ("run",)
    assert JOB_PRIORITY["run"] > max(JOB_PRIORITY[k] for k in SHORT_JOB_KINDS)


# ------------------------------------------------------------------------------------------------ start estimates


@pytest.mark.parametrize(("running", "durations", "starts"), [
    ([300.0], [120.0, 60.0, None, 30.0], [300.0, 420.0, 480.0, None]),  # one worker: running + the jobs ahead
    ([], [50.0, 10.0], [0.0, 50.0]),  # nothing running: a free worker starts the first at once
    ([100.0, 400.0], [200.0, 50.0, 10.0], [100.0, 300.0, 350.0]),  # two workers: each job to the first free one
    ([None], [10.0], [None]),  # the running job has no estimate yet
    ([None, 100.0], [20.0, 30.0], [100.0, 120.0]),  # ... but the other worker does
    ([10.0, 50.0], [None, 5.0, 5.0], [10.0, 50.0, 55.0]),  # a job of unknown length holds one worker only
])
def test_lane_start_arithmetic(running, durations, starts):
    assert lane_starts_s(running, durations) == starts


def _job(s, kind: str, payload: dict, *, status: str, now, progress: float = 0.0, started_s_ago: float | None = None,
         took_s: float | None = None) -> int:
    job = Job(kind=kind, payload=payload, payload_hash=payload_hash(kind, payload), status=status, progress=progress,
              message="", cancel_requested=False,
              started_at=None if started_s_ago is None else now - timedelta(seconds=started_s_ago))
    if took_s is not None:
        job.finished_at = job.started_at + timedelta(seconds=took_s)
    s.add(job)
    s.flush()
    return job.id


@pytest.mark.both_databases
def test_queued_jobs_start_after_their_lanes_running_job_and_the_jobs_ahead(db):
    now = utcnow()
    with session_scope(db) as s:
        # the demo: 25% through after 300 s, so 900 s left
        _job(s, "run", {"demo": 1}, status="running", now=now, progress=0.25, started_s_ago=300)
        # finished runs of the same payloads give the expected durations: 120 s and 30 s
        _job(s, "run", {"a": 1}, status="done", now=now, progress=1.0, started_s_ago=5000, took_s=120)
        _job(s, "analysis", {"map": 1}, status="done", now=now, progress=1.0, started_s_ago=5000, took_s=30)
        run_a = _job(s, "run", {"a": 1}, status="queued", now=now)
        run_new = _job(s, "run", {"new": 1}, status="queued", now=now)  # never run: no duration
        run_last = _job(s, "run", {"last": 1}, status="queued", now=now)
        comparison = _job(s, "checkpoints", {"spec": 1}, status="queued", now=now)
        map_job = _job(s, "analysis", {"map": 1}, status="queued", now=now)  # claimed before the older comparison
        starts = queue_start_estimates(s, JOB_LANES, "main", priority=JOB_PRIORITY, now=now)
    assert starts[run_a] == pytest.approx(900.0)
    assert starts[run_new] == pytest.approx(900.0 + 120.0)
    assert starts[run_last] is None  # behind a job that has never run
    assert starts[map_job] == 0.0  # nothing runs in the short lane
    assert starts[comparison] == pytest.approx(30.0)  # after the map's 30 s
    assert set(starts) == {run_a, run_new, run_last, comparison, map_job}


def test_the_queue_caption_says_when_or_that_nobody_knows():
    assert queue_caption(QueuePlace("main", 2), 720.0).startswith(
        "Position 2 in the main lane (training): 1 job(s) ahead; starts in about 12 min")
    assert queue_caption(QueuePlace("short", 1), 0.0).endswith("next to start; starts within seconds.")
    assert "start time unknown" in queue_caption(QueuePlace("main", 1), None)
