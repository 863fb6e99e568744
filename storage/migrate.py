"""The one schema migration step: add columns introduced after a database was created.

``create_all`` creates missing tables but never alters existing ones, so a database made by an older
version lacks the columns listed in ``storage.models.ADDED_COLUMNS``. Each is added with
``ALTER TABLE ... ADD COLUMN`` (nullable, no default), which SQLite and PostgreSQL both support.
"""
from __future__ import annotations

from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import DBAPIError

from storage.models import ADDED_COLUMNS, Base


def _missing(engine: Engine) -> list[tuple[str, str]]:
    inspector = inspect(engine)
    present = {table: {c["name"] for c in inspector.get_columns(table)} for table, _ in ADDED_COLUMNS}
    return [(table, column) for table, column in ADDED_COLUMNS if column not in present[table]]


def add_missing_columns(engine: Engine) -> list[str]:
    """Add every column of ``ADDED_COLUMNS`` that the database lacks; return their ``table.column`` names.

    Safe when several processes start at once: a column another process added in between is not an error.
    """
    added = []
    for table, column in _missing(engine):
        col = Base.metadata.tables[table].c[column]
        ddl = f"ALTER TABLE {table} ADD COLUMN {column} {col.type.compile(engine.dialect)}"
        try:
            with engine.begin() as connection:
                connection.execute(text(ddl))
            added.append(f"{table}.{column}")
        except DBAPIError:
            if (table, column) in _missing(engine):
                raise
    return added
