"""Stored upgrade checks on sources (``check-upgrade --old-gallery``'s report), keyed by their job's payload hash."""
from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.models import SourceCheck
from storage.rows import upsert


def save_source_check(session: Session, key: str, report: dict[str, Any]) -> int:
    """Store a check's report under ``key`` (``payload_hash`` of the job that asked for it), replacing an earlier one."""
    return upsert(session, SourceCheck, {"key": key}, {"payload": dict(report)})


def load_source_check(session: Session, key: str) -> dict[str, Any] | None:
    """The report stored under ``key``, or None."""
    row = session.scalars(select(SourceCheck).where(SourceCheck.key == key)).first()
    return None if row is None else dict(row.payload)
