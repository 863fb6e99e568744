"""Signals every floor may raise or pass: a job's cancellation and its progress callback.

A job's **cancel event** (:func:`cancel_scope`): the worker opens one around each job and its heartbeat thread sets it
when the job is cancelled, so a call that blocks outside Python (a SQL statement, an ONNX graph) can be ended from
another thread within a heartbeat period: SQLite's progress handler reads :func:`cancel_requested`, a PostgreSQL
statement is cancelled on its connection, an ONNX run is terminated through its ``RunOptions``.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Progress = Callable[[float, str], None]  # (fraction done in [0, 1], a line saying what is happening)


class Cancelled(Exception):
    """Raised when the hooks or the job ask the work to stop; nothing of the unfinished step is kept."""


def check_stop(should_stop: Callable[[], bool] | None, message: str) -> None:
    """Raise :class:`Cancelled` (with ``message``) when ``should_stop`` says so."""
    if should_stop is not None and should_stop():
        raise Cancelled(message)


_CANCEL: ContextVar[threading.Event | None] = ContextVar("compatlab_cancel", default=None)


@contextmanager
def cancel_scope(event: threading.Event) -> Iterator[threading.Event]:
    """Within the block, :func:`cancel_event` is ``event`` (in this thread and the context it runs)."""
    token = _CANCEL.set(event)
    try:
        yield event
    finally:
        _CANCEL.reset(token)


def cancel_event() -> threading.Event | None:
    """The running job's cancel event, or None outside a job (a CLI run: Ctrl-C ends it)."""
    return _CANCEL.get()


def cancel_requested() -> bool:
    """Whether the running job was cancelled (cheap: no database query; the heartbeat thread sets the event)."""
    event = _CANCEL.get()
    return event is not None and event.is_set()


@contextmanager
def on_cancel(stop: Callable[[], None], *, poll_s: float = 0.2) -> Iterator[None]:
    """While the block runs, a watcher thread calls ``stop()`` once if the job's cancel event is set (a blocking
    call's own way out: a connection's ``cancel()``, ``RunOptions.terminate``); nothing outside a job."""
    event = _CANCEL.get()
    if event is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(poll_s):
            if event.is_set():
                stop()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
