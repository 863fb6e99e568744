"""The task loop: any number of workers, on any machines, run the tasks of fanned-out jobs (``storage.tasks``).

The mechanism knows no domain: the handlers are passed in (a plain dict task kind -> handler; the worker's registry
is ``engine.jobs.task_handlers.TASK_HANDLERS``). :func:`run_one_task` claims one task under a lease, runs its
kind's handler while a :class:`Heartbeat` renews the lease, and completes the task with the handler's return value
(:class:`Done`): the loop is the only one that completes a task, once, and writes nothing when the lease was lost or
the job was cancelled meanwhile. :func:`run_tasks` is the one run loop: a worker's (until stopped or idle), or the
loop of a process that owns a job and waits for it (``job_id``: only that job's tasks, until it ends, with the
owner's lease renewed by the same :class:`Heartbeat`).
"""
from __future__ import annotations

import os
import socket
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from storage import Task, session_scope
from storage.tasks import (TaskJobState, cancel_task_job, claim_task, complete_task, extend_lease, fail_task,
                           renew_owner_lease, task_job_state, unfinished_tasks)

LEASE_S = 60.0


class Stop(Protocol):
    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Done(NamedTuple):
    """What a handler returns: the task's result and arrays, written with its "done" by the loop.

    ``write``: more rows to write in that same transaction, only if the task still holds its lease (e.g. the feature
    sets an extract job's commit task makes from its parts); a handler never completes its own task. A handler may
    return a plain ``(result, arrays)`` pair instead.
    """

    result: dict[str, Any] | None = None
    arrays: dict[str, np.ndarray] | None = None
    write: Callable[[Session], None] | None = None


Handler = Callable[[Engine, Task], "Done | tuple[dict[str, Any] | None, dict[str, np.ndarray] | None]"]


class TaskJobStopped(Exception):
    """The task job ended without a result: cancelled (``cancelled`` True) or failed (the message says why)."""

    def __init__(self, message: str, *, cancelled: bool = False):
        super().__init__(message)
        self.cancelled = cancelled


def worker_name() -> str:
    """``host:pid``: who holds a task, as the task board shows it."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat(threading.Thread):
    """Calls ``renew`` every ``every_s`` seconds until :meth:`stop` or until ``renew`` returns False (the lease it
    renews was lost). The one heartbeat of the task wing: a task's lease while its handler runs, and an owner's
    lease on its job while it waits."""

    def __init__(self, renew: Callable[[], bool], every_s: float):
        super().__init__(daemon=True)
        self.renew, self.every_s, self._done = renew, every_s, threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.every_s):
            if not self.renew():
                return

    def stop(self) -> None:
        self._done.set()


def _renewal(db: Engine, renew: Callable[..., bool], *args: Any) -> Callable[[], bool]:
    def beat() -> bool:
        with session_scope(db) as s:
            return renew(s, *args)
    return beat


def run_one_task(db: Engine, worker: str, *, handlers: Mapping[str, Handler], has_gpu: bool,
                 lease_s: float = LEASE_S, job_id: int | None = None) -> int | None:
    """Claim one task (of ``job_id`` when given), run its kind's handler and complete it with what the handler
    returned, under the lease; return its id (None when none is claimable). A handler's exception fails the attempt
    (retried while attempts are left); the worker lives on."""
    task = claim_task(db, worker, has_gpu=has_gpu, lease_s=lease_s, job_id=job_id)
    if task is not None:
        run_claimed(db, task, handlers=handlers, lease_s=lease_s)
    return None if task is None else task.id


def run_claimed(db: Engine, task: Task, *, handlers: Mapping[str, Handler], lease_s: float = LEASE_S) -> None:
    """Run a task this worker claimed (``claim_task`` with ``lease_s``) and complete it with what its handler returned,
    or fail the attempt; nothing is written when the task is no longer the claim's."""
    beat = Heartbeat(_renewal(db, extend_lease, task.id, task.lease, lease_s), lease_s / 3)
    beat.start()
    try:
        handler = handlers.get(task.kind)
        if handler is None:
            raise ValueError(f"unknown task kind {task.kind!r}; known kinds: {', '.join(handlers)}")
        done = Done(*handler(db, task))
        beat.stop()
        with session_scope(db) as s:
            if complete_task(s, task.id, task.lease, result=done.result, arrays=done.arrays) and done.write:
                done.write(s)
    except Exception as exc:  # noqa: BLE001 - the attempt fails, the worker lives on
        beat.stop()
        with session_scope(db) as s:
            fail_task(s, task.id, task.lease, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")


def _job_state(db: Engine, job_id: int) -> TaskJobState:
    """The job's state while it runs or once it is done; :class:`TaskJobStopped` once it failed or was cancelled."""
    with session_scope(db) as s:
        state = task_job_state(s, job_id)
    if state.status == "failed":
        raise TaskJobStopped(f"task job {job_id} failed: {(state.error or 'no error recorded').splitlines()[0]}")
    if state.status == "cancelled":
        raise TaskJobStopped(f"task job {job_id} was cancelled", cancelled=True)
    return state


def run_tasks(db: Engine, worker_id: str, has_gpu: bool, stop: Stop, *, handlers: Mapping[str, Handler],
              lease_s: float = LEASE_S, poll_s: float = 1.0, until_idle: bool = False, job_id: int | None = None,
              should_stop: Callable[[], bool] | None = None, owner_lease: str | None = None,
              owner_lease_s: float = LEASE_S) -> int:
    """Run tasks until ``stop`` is set; return how many ran.

    ``until_idle``: also stop once no task is queued or running. ``job_id``: run only that job's tasks, until it is
    done (other workers may take some meanwhile); raises :class:`TaskJobStopped` when it fails or is cancelled,
    ``should_stop()`` asks it to stop, and any other exception cancels the job before propagating. ``owner_lease``:
    this process owns the job under that lease and renews it every third of ``owner_lease_s`` meanwhile.
    """
    owner = None
    if job_id is not None and owner_lease is not None:
        owner = Heartbeat(_renewal(db, renew_owner_lease, job_id, owner_lease, owner_lease_s), owner_lease_s / 3)
        owner.start()
    ran = 0
    try:
        while not stop.is_set():
            stopping = False
            if job_id is not None:
                if should_stop is not None and should_stop():
                    with session_scope(db) as s:
                        cancel_task_job(s, job_id)
                state = _job_state(db, job_id)
                if state.status == "done":
                    return ran
                stopping = state.cancel_requested
            if not stopping and run_one_task(db, worker_id, handlers=handlers, has_gpu=has_gpu, lease_s=lease_s,
                                             job_id=job_id) is not None:
                ran += 1
                continue
            if until_idle and job_id is None:
                with session_scope(db) as s:
                    if unfinished_tasks(s) == 0:
                        return ran
            stop.wait(poll_s)  # the rest is running elsewhere, or waits for it
        return ran
    except TaskJobStopped:
        raise
    except BaseException:
        if job_id is not None:
            with session_scope(db) as s:
                cancel_task_job(s, job_id)
        raise
    finally:
        if owner is not None:
            owner.stop()


__all__ = ["LEASE_S", "Done", "Handler", "Heartbeat", "TaskJobStopped", "run_claimed", "run_one_task", "run_tasks",
           "worker_name"]
