"""The database's clock: the one time every worker, on every machine, agrees on for heartbeats and leases.

A worker's own clock may run ahead or behind (150 s ahead, it used to fail other workers' healthy jobs as stale).
Every heartbeat, lease and staleness test in :mod:`storage.jobs` therefore reads the time from the database server (PostgreSQL's ``clock_timestamp()``; on
SQLite, one file on one machine, SQLite's ``'now'``, which is that machine's clock).
"""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import text
from sqlalchemy.orm import Session

_SQLITE_NOW = text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")  # UTC, milliseconds
_SERVER_NOW = text("SELECT clock_timestamp()")


def db_now(session: Session) -> datetime:
    """The database server's current time, timezone-aware UTC."""
    if session.get_bind().dialect.name == "sqlite":
        return datetime.fromisoformat(session.scalar(_SQLITE_NOW)).replace(tzinfo=timezone.utc)
    return session.scalar(_SERVER_NOW).astimezone(timezone.utc)
