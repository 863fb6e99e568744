"""Who claimed a job: host name, boot id and process id, so a supervisor fails only its own dead child's jobs.

A process id alone is not an identity once several machines share one database (another machine's worker may have
the same pid), nor across a reboot (pids are reused). The boot id is Linux's ``/proc/sys/kernel/random/boot_id``,
new at every boot; elsewhere it is empty and the host name and pid must do.
"""
from __future__ import annotations

import functools
import os
import socket
from typing import NamedTuple

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


class WorkerIdentity(NamedTuple):
    """A process on a machine in one boot."""

    host: str
    boot_id: str
    pid: int


@functools.cache
def _machine() -> tuple[str, str]:
    try:
        with open(BOOT_ID_FILE, encoding="ascii") as file:
            boot_id = file.read(64).strip()
    except OSError:
        boot_id = ""
    return socket.gethostname()[:200], boot_id


def identity(pid: int | None = None) -> WorkerIdentity:
    """The identity of process ``pid`` on this machine (this process when None)."""
    host, boot_id = _machine()
    return WorkerIdentity(host, boot_id, os.getpid() if pid is None else int(pid))
