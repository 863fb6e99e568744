"""Row helpers every repository module uses: a row by id, a choice check, an in-place upsert."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from storage.models import Base
from storage.types import utcnow

RowT = TypeVar("RowT", bound=Base)


def require_row(session: Session, model: type[RowT], row_id: int) -> RowT:
    """The row of ``model`` with primary key ``row_id``; ``ValueError`` when there is none."""
    row = session.get(model, row_id)
    if row is None:
        raise ValueError(f"{model.__name__} {row_id} does not exist")
    return row


def require_choice(what: str, value: str, allowed: Sequence[str]) -> None:
    """``ValueError`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


def upsert(session: Session, model: type[Base], key: dict[str, Any], values: dict[str, Any]) -> int:
    """Insert a row, or update the row with the same unique ``key`` in place; return its id.

    Either way the change is a single INSERT or UPDATE (no delete-then-insert), so there is never a
    moment where the old row is gone and the new one is not there yet. ``created_at`` is reset.
    """
    table_id = model.id  # type: ignore[attr-defined]
    existing = session.scalar(select(table_id).where(*(getattr(model, name) == value for name, value in key.items())))
    if existing is None:
        row = model(**key, **values)
        session.add(row)
        session.flush()
        return row.id  # type: ignore[attr-defined]
    session.execute(update(model).where(table_id == existing).values(**values, created_at=utcnow()))
    return existing
