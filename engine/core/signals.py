"""Signals every floor may raise or pass: a job's cancellation and its progress callback."""
from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[float, str], None]  # (fraction done in [0, 1], a line saying what is happening)


class Cancelled(Exception):
    """Raised when the hooks or the job ask the work to stop; nothing of the unfinished step is kept."""


def check_stop(should_stop: Callable[[], bool] | None, message: str) -> None:
    """Raise :class:`Cancelled` (with ``message``) when ``should_stop`` says so."""
    if should_stop is not None and should_stop():
        raise Cancelled(message)
