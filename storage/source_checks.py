"""Stored upgrade checks on sources (``check-upgrade --old-gallery``'s report), keyed by their job's payload hash, with
their TREC files (``--export trec``'s run files and qrels, zipped) beside the report."""
from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.models import SourceCheck
from storage.rows import upsert


def save_source_check(session: Session, key: str, report: dict[str, Any], trec_zip: bytes | None = None) -> int:
    """Store a check's report and its TREC files' zip under ``key`` (``payload_hash`` of the job that asked for it), in
    the caller's one transaction, replacing an earlier one (its zip too)."""
    return upsert(session, SourceCheck, {"key": key}, {"payload": dict(report), "trec_zip": trec_zip})


def load_source_check(session: Session, key: str) -> dict[str, Any] | None:
    """The report stored under ``key``, or None (its zip is not read)."""
    row = session.scalars(select(SourceCheck).where(SourceCheck.key == key)).first()
    return None if row is None else dict(row.payload)


def load_source_check_trec(session: Session, key: str) -> bytes | None:
    """The TREC files' zip stored with the check under ``key``, or None (no check, or none kept)."""
    return session.scalar(select(SourceCheck.trec_zip).where(SourceCheck.key == key))
