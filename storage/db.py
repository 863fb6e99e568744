"""Engines and sessions: where the database is, how SQLite is configured, and transaction scope."""
from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, create_engine, event, make_url, text

from storage.secrets import mask_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from storage.migrate import add_missing_columns
from storage.models import Base
from storage.settings import DB_URL, read_setting

DB_URL_ENV = DB_URL.name
DEFAULT_DB_PATH = Path("data") / "compatlab.db"
SQLITE_BUSY_TIMEOUT_MS = 30_000


def default_db_url() -> str:
    """``$COMPATLAB_DB_URL`` if set, else SQLite at ``./data/compatlab.db`` (absolute, from the current directory)."""
    url = read_setting(DB_URL)
    return url or f"sqlite:///{(Path.cwd() / DEFAULT_DB_PATH).as_posix()}"


class DatabaseUnavailable(ValueError):
    """The database cannot be opened or written; one line with the URL's password masked."""


def _first_line(exc: BaseException) -> str:
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


READ_ONLY = "is read-only"
CORRUPT = "is corrupt or not a database file"


def _state(exc: BaseException, reason: str) -> str:
    low = reason.lower()
    if "readonly" in low or "read-only" in low:
        return READ_ONLY
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return CORRUPT
    if isinstance(exc, ImportError) or "can't load plugin" in low:
        return "names an unknown database kind or a driver that is not installed"
    if "could not parse" in low or "argument" in type(exc).__name__.lower():
        return "is not a valid database URL"
    return "cannot be opened"


def database_error(url: str, exc: BaseException) -> DatabaseUnavailable:
    """One line saying what is wrong with database ``url`` (read-only, corrupt, no driver, unreachable)."""
    reason = _first_line(exc)
    return DatabaseUnavailable(f"database {mask_url(url)} {_state(exc, reason)}: {reason}")


def json_ready(value: Any) -> Any:
    """Numpy scalars/arrays to Python, and non-finite floats to None: JSON has no NaN (PostgreSQL rejects it)."""
    if isinstance(value, dict):
        return {str(key): json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    if isinstance(value, np.ndarray):
        return json_ready(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_hash(value: Any) -> str:
    """A stable SHA-256 of a JSON-able value (dict key order does not matter): config and job payload hashes."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _json_dumps(value: Any) -> str:
    return json.dumps(json_ready(value), allow_nan=False)


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
    try:
        parsed = make_url(url)
        is_sqlite = parsed.get_backend_name() == "sqlite"
        if is_sqlite and parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, json_serializer=_json_dumps, pool_pre_ping=not is_sqlite)
    except (SQLAlchemyError, ImportError, OSError, ValueError) as exc:
        raise database_error(url, exc) from None
    if is_sqlite:
        event.listen(engine, "connect", _configure_sqlite)
    return engine


def get_engine(url: str | None = None) -> Engine:
    """The engine for ``url`` (default: :func:`default_db_url`), created once per URL in this process.

    For a SQLite file the parent folder is created. A forked child process should call
    ``engine.dispose(close=False)`` before first use. A bad URL or a missing driver raises
    :class:`DatabaseUnavailable`.
    """
    return _engine_for(url or default_db_url())


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def init_db(engine: Engine, *, writable: bool = True) -> None:
    """Create every table and index that does not exist yet, and add columns newer than the database.

    Raises :class:`DatabaseUnavailable` (one line) when the database cannot be opened, is corrupt, or
    (with ``writable``) cannot be written, so a run is refused before it computes anything.
    """
    try:
        Base.metadata.create_all(engine)
        add_missing_columns(engine)  # a database from an older version gains its new columns
    except SQLAlchemyError as exc:
        raise database_error(_url(engine), exc) from None
    if writable:
        problem = write_problem(engine)
        if problem:
            raise DatabaseUnavailable(problem)


def write_problem(engine: Engine) -> str | None:
    """None when the database accepts writes, else the one line saying why not (an UPDATE of no row, rolled back)."""
    try:
        with engine.connect() as conn:
            conn.execute(text("UPDATE experiments SET id = id WHERE 1 = 0"))
            conn.rollback()
    except SQLAlchemyError as exc:
        return str(database_error(_url(engine), exc))
    return None


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session in one transaction: committed on success, rolled back on any exception.

    Objects stay readable after the block (``expire_on_commit=False``), so short read transactions
    can hand rows to the caller. A read-only or corrupt database raises :class:`DatabaseUnavailable`.
    """
    session = Session(engine, expire_on_commit=False)
    try:
        yield session
        session.commit()
    except DBAPIError as exc:
        session.rollback()
        if _state(exc, _first_line(exc)) not in (READ_ONLY, CORRUPT):  # locked, a constraint...: the caller's business
            raise
        raise database_error(_url(engine), exc) from None
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
