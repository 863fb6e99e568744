"""When each queued job is expected to start: from the time its lane's running jobs still need and the expected
durations of the jobs ahead of it (``None`` where there is no basis for a number).

A running job's time left is :func:`storage.jobs.job_remaining_s` (its stored progress and elapsed time); a queued
job's expected duration is how long the newest finished identical job (same kind and payload) took; a job never run
before has none. A lane's running jobs are those of its kinds (a free general worker may run a short job too, so
this is an estimate, not a promise).
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.jobs import _took_s, claim_order, job_remaining_s
from storage.models import TASK_JOB_KINDS, Job
from storage.types import utcnow


def lane_starts_s(running_left: Sequence[float | None], durations: Sequence[float | None]) -> list[float | None]:
    """Seconds from now until each of a lane's queued jobs starts, in claim order.

    ``running_left``: the time each running job of the lane still needs (one worker per running job; none running:
    one free worker); ``durations``: each queued job's expected duration. Each queued job goes to the worker that is
    free first. ``None`` (unknown) for a job whose start waits on an unknown time.
    """
    free = [math.inf if left is None else max(0.0, float(left)) for left in running_left] or [0.0]
    heapq.heapify(free)
    starts: list[float | None] = []
    for duration in durations:
        start = heapq.heappop(free)
        starts.append(None if math.isinf(start) else start)
        heapq.heappush(free, math.inf if duration is None else start + max(0.0, float(duration)))
    return starts


def queue_start_estimates(session: Session, lanes: Mapping[str, Sequence[str]], default_lane: str, *,
                          priority: Mapping[str, int] | None = None,
                          now: datetime | None = None) -> dict[int, float | None]:
    """Each queued job's expected start (seconds from ``now``, ``None`` when unknown); lanes and claim order as
    :func:`storage.jobs.queue_positions` numbers them."""
    now = now or utcnow()
    lane_of = {kind: lane for lane, kinds in lanes.items() for kind in kinds}
    running: dict[str, list[float | None]] = {}
    held = select(Job).where(Job.status == "running", Job.kind.not_in(TASK_JOB_KINDS))  # old task jobs held no worker
    for job in session.scalars(held):
        running.setdefault(lane_of.get(job.kind, default_lane), []).append(
            job_remaining_s(job.progress, job.started_at, now))
    queued: dict[str, list[Job]] = {}
    for job in session.scalars(select(Job).where(Job.status == "queued").order_by(*claim_order(priority))):
        queued.setdefault(lane_of.get(job.kind, default_lane), []).append(job)
    starts: dict[int, float | None] = {}
    for lane, jobs in queued.items():
        durations = [_took_s(session, job) for job in jobs]
        starts.update(zip((job.id for job in jobs), lane_starts_s(running.get(lane, []), durations)))
    return starts
