"""The task loop: any number of workers, on any machines, run the tasks of fanned-out jobs (``storage.tasks``).

:func:`run_one_task` claims one task under a lease, runs its kind's handler (``TASK_HANDLERS``) while a thread
renews the lease, and writes the handler's result with the task's "done" (nothing when the lease was lost or the
job was cancelled meanwhile). ``python -m engine worker --tasks`` runs :func:`run_tasks` on any machine pointed at
the same database. The task kinds: ``search`` and ``reduce`` (:mod:`engine.evaluate.search_tasks`), ``extract`` and
``commit`` (:mod:`engine.checkpoints.extract_tasks`).
"""
from __future__ import annotations

import os
import socket
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
from sqlalchemy import Engine

from engine.checkpoints.extract_tasks import commit_task, extract_task
from engine.evaluate.search_tasks import reduce_task, search_task
from storage import Task, init_db, session_scope
from storage.tasks import claim_task, complete_task, extend_lease, fail_task, unfinished_tasks

LEASE_S = 60.0


class Stop(Protocol):
    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def worker_name() -> str:
    """``host:pid``: who holds a task, as the task board shows it."""
    return f"{socket.gethostname()}:{os.getpid()}"


Handler = Callable[[Engine, Task], tuple[dict[str, Any] | None, dict[str, np.ndarray] | None]]
TASK_HANDLERS: dict[str, Handler] = {"search": search_task, "reduce": reduce_task, "extract": extract_task,
                                      "commit": commit_task}


class _LeaseBeat(threading.Thread):
    """Extends a task's lease every third of it while its handler runs; stops when the lease is lost or the task's
    job was asked to stop (the renewal cancels the task: the handler's result is then written nowhere)."""

    def __init__(self, db: Engine, task: Task, lease_s: float):
        super().__init__(daemon=True)
        self.db, self.task, self.lease_s, self.done = db, task, lease_s, threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.lease_s / 3):
            with session_scope(self.db) as s:
                if not extend_lease(s, self.task.id, self.task.lease, self.lease_s):
                    return


def run_one_task(db: Engine, worker: str, *, has_gpu: bool, lease_s: float = LEASE_S,
                 handlers: Mapping[str, Handler] = TASK_HANDLERS, job_id: int | None = None) -> int | None:
    """Claim one task (of ``job_id`` when given), run it and write its result under the lease; return its id (None
    when none is claimable)."""
    task = claim_task(db, worker, has_gpu=has_gpu, lease_s=lease_s, job_id=job_id)
    if task is None:
        return None
    beat = _LeaseBeat(db, task, lease_s)
    beat.start()
    try:
        handler = handlers.get(task.kind)
        if handler is None:
            raise ValueError(f"unknown task kind {task.kind!r}; known kinds: {', '.join(handlers)}")
        result, arrays = handler(db, task)
        beat.done.set()
        with session_scope(db) as s:
            complete_task(s, task.id, task.lease, result=result, arrays=arrays)
    except Exception as exc:  # the attempt fails, the worker lives on
        beat.done.set()
        with session_scope(db) as s:
            fail_task(s, task.id, task.lease, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")
    return task.id


def run_tasks(db: Engine, worker_id: str, has_gpu: bool, stop: Stop, *, lease_s: float = LEASE_S,
              poll_s: float = 1.0, until_idle: bool = False, handlers: Mapping[str, Handler] = TASK_HANDLERS) -> int:
    """Run tasks until ``stop`` is set (``until_idle``: also once no task is queued or running); return how many ran."""
    ran = 0
    while not stop.is_set():
        if run_one_task(db, worker_id, has_gpu=has_gpu, lease_s=lease_s, handlers=handlers) is not None:
            ran += 1
            continue
        if until_idle:
            with session_scope(db) as s:
                if unfinished_tasks(s) == 0:
                    return ran
        stop.wait(poll_s)
    return ran


def serve_tasks(db: Engine, *, once: bool = False) -> int:
    """``python -m engine worker --tasks``: run tasks as ``host:pid`` (``once``: until none is left); return how many."""
    import torch

    init_db(db)
    return run_tasks(db, worker_name(), torch.cuda.is_available(), threading.Event(), until_idle=once)


__all__ = ["LEASE_S", "TASK_HANDLERS", "run_one_task", "run_tasks", "serve_tasks",
           "worker_name"]
