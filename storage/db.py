"""Engines and sessions: where the database is, how SQLite is configured, and transaction scope."""
from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session

from storage.migrate import add_missing_columns
from storage.models import Base

DB_URL_ENV = "COMPATLAB_DB_URL"
DEFAULT_DB_PATH = Path("data") / "compatlab.db"
SQLITE_BUSY_TIMEOUT_MS = 30_000


def default_db_url() -> str:
    """``$COMPATLAB_DB_URL`` if set, else SQLite at ``./data/compatlab.db`` (absolute, from the current directory)."""
    url = os.environ.get(DB_URL_ENV, "").strip()
    return url or f"sqlite:///{(Path.cwd() / DEFAULT_DB_PATH).as_posix()}"


_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][\w+.-]*://)(?P<user>[^:/@]*):(?P<password>[^@/]*)@")


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for every place a database URL is shown or printed.

    Works on URLs SQLAlchemy cannot parse too (a typo'd URL still must not print its password).
    """
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy understands: mask the user-info part by hand
        return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", str(url))


def _json_ready(value: Any) -> Any:
    """Numpy scalars/arrays to Python, and non-finite floats to None: JSON has no NaN (PostgreSQL rejects it)."""
    if isinstance(value, dict):
        return {str(key): _json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(item) for item in value]
    if isinstance(value, np.ndarray):
        return _json_ready(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _json_dumps(value: Any) -> str:
    return json.dumps(_json_ready(value), allow_nan=False)


def _configure_sqlite(dbapi_connection: Any, connection_record: Any) -> None:
    """WAL (readers never block the writer), foreign keys (ON DELETE CASCADE), and a busy timeout."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    finally:
        cursor.close()


@functools.cache
def _engine_for(url: str) -> Engine:
    parsed = make_url(url)
    is_sqlite = parsed.get_backend_name() == "sqlite"
    if is_sqlite and parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, json_serializer=_json_dumps, pool_pre_ping=not is_sqlite)
    if is_sqlite:
        event.listen(engine, "connect", _configure_sqlite)
    return engine


def get_engine(url: str | None = None) -> Engine:
    """The engine for ``url`` (default: :func:`default_db_url`), created once per URL in this process.

    For a SQLite file the parent folder is created. A forked child process should call
    ``engine.dispose(close=False)`` before first use.
    """
    return _engine_for(url or default_db_url())


def init_db(engine: Engine) -> None:
    """Create every table and index that does not exist yet, and add columns newer than the database."""
    Base.metadata.create_all(engine)
    add_missing_columns(engine)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session in one transaction: committed on success, rolled back on any exception.

    Objects stay readable after the block (``expire_on_commit=False``), so short read transactions
    can hand rows to the caller.
    """
    session = Session(engine, expire_on_commit=False)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
