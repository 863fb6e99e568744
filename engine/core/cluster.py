"""Where a fan-out runs (torch-free, stdlib only): in this process, on a local Dask cluster, or on a running one.

One setting, three forms: ``in-process`` (the default: no Dask needed, nothing to start), ``local:N`` (a
``distributed.LocalCluster`` of N worker processes, started for the command and closed at its end) and
``tcp://HOST:PORT`` (a running Dask scheduler, e.g. ``tcp://10.0.0.5:8786``). ``--cluster SPEC`` chooses it, else
``$COMPATLAB_DASK_SCHEDULER`` (declared in :mod:`storage.settings`), else in-process. The Dask client itself lives
in :mod:`engine.evaluate.dask_search`; this module only parses and checks the text.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

IN_PROCESS, LOCAL, SCHEDULER = "in-process", "local", "scheduler"
MAX_LOCAL_WORKERS = 1024
FORMS = "in-process, local:N (N worker processes) or tcp://HOST:PORT (a running Dask scheduler)"
_ADDRESS = re.compile(r"tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>[0-9]{1,5})")


@dataclass(frozen=True)
class ClusterSpec:
    """Where a fan-out runs: ``kind`` is in-process, local (``workers`` processes) or scheduler (``address``)."""

    kind: str = IN_PROCESS
    workers: int = 0
    address: str | None = None

    @property
    def in_process(self) -> bool:
        return self.kind == IN_PROCESS

    def __str__(self) -> str:
        return {IN_PROCESS: IN_PROCESS, LOCAL: f"local:{self.workers}"}.get(self.kind, self.address or "")


def parse_cluster(text: str | None, *, source: str = "--cluster") -> ClusterSpec:
    """The :class:`ClusterSpec` of ``text`` (None or blank: in-process); one-line ``ValueError`` naming ``source``
    for anything else than the three forms."""
    raw = "" if text is None else str(text).strip()
    if raw in ("", IN_PROCESS):
        return ClusterSpec()
    if raw.startswith("local:"):
        count = raw[len("local:"):]
        if not count.isdigit() or not 1 <= int(count) <= MAX_LOCAL_WORKERS:
            raise ValueError(f"{source} {raw!r}: local:N needs a whole number of worker processes from 1 to "
                             f"{MAX_LOCAL_WORKERS}")
        return ClusterSpec(LOCAL, workers=int(count))
    match = _ADDRESS.fullmatch(raw)
    if match is None:
        raise ValueError(f"{source} {raw!r} is not a cluster; use {FORMS}")
    if not 1 <= int(match["port"]) <= 65535:
        raise ValueError(f"{source} {raw!r}: the port must be from 1 to 65535")
    return ClusterSpec(SCHEDULER, address=raw)


def requested_cluster(flag: str | None, environ: Mapping[str, str] | None = None) -> ClusterSpec:
    """``--cluster`` when given, else ``$COMPATLAB_DASK_SCHEDULER`` when set, else in-process; one-line ``ValueError``."""
    if flag is not None:
        return parse_cluster(flag)
    from storage.settings import DASK_SCHEDULER, read_setting  # the one reader; here so importing this stays light

    return parse_cluster(read_setting(DASK_SCHEDULER, environ), source=f"${DASK_SCHEDULER.name}")


__all__ = ["FORMS", "IN_PROCESS", "LOCAL", "SCHEDULER", "ClusterSpec", "parse_cluster", "requested_cluster"]
