"""Any SQL query (or a table) through a SQLAlchemy URL, read in blocks, never written to.

``sql:URL#query=SELECT ...`` or ``sql:URL#table=NAME``; ``id=``, ``vector=``, ``label=`` name the result's columns
(defaults ``id``, ``vector``, ``label`` when present). A vector may be an array (PostgreSQL ``real[]``), or text:
pgvector's ``'[1,2,3]'`` (select ``emb::text``), a JSON array (SQLite), or PostgreSQL's ``'{1,2,3}'``.

Read-only by construction: a query must be one ``SELECT`` / ``WITH`` statement; SQLite files are opened with
``mode=ro`` (and confined to the data roots); PostgreSQL runs it in a read-only transaction; nothing is committed.

Bounded in time: ``#timeout=S`` (default :data:`DEFAULT_TIMEOUT_S`, at most a day) is the longest one pass over the
source may spend in the database, its statement and fetches summed (the caller's work between blocks is not counted):
PostgreSQL's ``statement_timeout`` bounds every statement and fetch (and ``connect_timeout`` the connection,
:data:`CONNECT_TIMEOUT_S`), SQLite's progress handler interrupts one past the pass's budget, and an endless stream of
rows (a recursive view) ends when the fetches have spent it. Errors never quote the database's message
beyond a name (a message can carry the query text or the data it read: a password, a file through
``pg_read_file``): the driver's error class and code, or a "no such table / column NAME" line.
"""
from __future__ import annotations

import json
import math
import re
import time
from contextlib import nullcontext
from collections.abc import Iterator
from urllib.parse import quote

import numpy as np

from engine.core.signals import Cancelled, cancel_requested, on_cancel
from engine.sources.base import Raw, Source
from engine.sources.text import SourceError, SourceText, first_line, local_path

DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, CONNECT_TIMEOUT_S = 600, 86400, 15
# database messages that can only name an identifier of the user's own query: shown as they are
NAMING_ONLY = re.compile(r'^(no such (table|column): [\w."]+|(relation|column) "[\w.]+" does not exist|attempt to write '
                        r'a readonly database|cannot execute [\w() ]+ in a read-only transaction|WITH clause '
                        r'containing a data-modifying statement must be at the top level)$')
READ_ONLY_START = re.compile(r"^\s*(select|with)\b", re.IGNORECASE)
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


def parse_vector(value: object, *, where: str) -> list[float]:
    """One stored vector as a list of numbers: an array, a JSON / pgvector ``[..]`` or PostgreSQL ``{..}`` text."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return list(value)
    if isinstance(value, (bytes, memoryview)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{") and text.endswith("}"):
            text = "[" + text[1:-1] + "]"
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, list):
            return parsed
    if value is None:
        raise SourceError(f"{where}: an item has no vector (NULL)")
    raise SourceError(f"{where}: a vector is {type(value).__name__}, not an array of numbers (its value is not shown)")


def query_error(exc: BaseException) -> str:
    """A database error in words that quote nothing it read: a naming-only message as it is, else the driver's error
    class and code (SQLSTATE, or SQLite's error name)."""
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    if lines and NAMING_ONLY.match(lines[0].strip()):
        return lines[0].strip()
    code = getattr(orig, "sqlstate", None) or getattr(orig, "sqlite_errorname", None)
    return f"{type(orig).__name__}" + (f" ({code})" if code else "") + " (the database's message is not shown: it can " \
        "quote the query and the data it read)"


def timeout_option(text: SourceText, where: str) -> int:
    """``#timeout=S``: whole seconds in 1..:data:`MAX_TIMEOUT_S` (default :data:`DEFAULT_TIMEOUT_S`)."""
    raw = text.option("timeout")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_TIMEOUT_S:
        raise SourceError(f"{where}: timeout must be whole seconds in 1..{MAX_TIMEOUT_S}, got {raw!r}")
    return int(raw)


def _sqlite_read_only(url, *, what: str):  # sqlalchemy URL objects
    database = url.database or ""
    if not database or database == ":memory:" or database.startswith("file:"):
        raise SourceError(f"{what}: give a SQLite file path (sqlite:///path/to/file.db), not {database or 'memory'}")
    path = local_path(database, what=what)
    if not path.is_file():
        raise SourceError(f"{what}: SQLite file {path} does not exist")
    return url.set(database=f"file:{quote(str(path))}?mode=ro", query={"uri": "true"})


class SqlRows:
    """The rows of one read-only statement at a SQLAlchemy URL: a ``table`` (``[schema.]name``) or a ``query`` (one
    ``SELECT`` / ``WITH``), fetched in blocks within ``timeout`` seconds a pass (module docstring). Every failure is one
    line naming ``where`` (masked); what the rows mean is the caller's (:class:`SqlSource`'s vectors, qrels)."""

    def __init__(self, location: str, *, table: str | None, query: str | None, timeout: int, where: str) -> None:
        from sqlalchemy import create_engine, literal_column, make_url, select
        from sqlalchemy import table as sql_table
        from sqlalchemy.exc import ArgumentError

        self.where = where
        try:
            url = make_url(location)
        except ArgumentError as exc:
            raise SourceError(f"{where} is not a SQLAlchemy URL") from exc
        self.backend = url.get_backend_name()
        if self.backend == "sqlite":
            url = _sqlite_read_only(url, what=where)
        if bool(query) == bool(table):
            raise SourceError(f"{where}: give exactly one of #query=SELECT... or #table=NAME")
        self.timeout = timeout
        self.deadline = math.inf  # of the statement or fetch under way (time.monotonic())
        self.spent = 0.0  # seconds the pass under way has spent in the database
        self._driver = None  # the DBAPI connection of the pass under way (PostgreSQL: cancelled on a job's cancel)
        self.table = None
        if table:
            if not IDENTIFIER.match(table):
                raise SourceError(f"{where}: table {table!r} is not a plain [schema.]name")
            schema, _, bare = table.rpartition(".")
            self.table = sql_table(bare, schema=schema or None)
            self.statement = select(literal_column("*")).select_from(self.table).limit(1)
        else:
            if not READ_ONLY_START.match(query) or ";" in query.strip().rstrip(";"):
                raise SourceError(f"{where}: the query must be one SELECT or WITH statement")
            from sqlalchemy import text as sql_text

            self.statement = sql_text(query.strip().rstrip(";"))
        connect_args = ({"connect_timeout": max(2, min(CONNECT_TIMEOUT_S, self.timeout)), "options": f"-c statement_timeout={1000 * self.timeout}"}
                        if self.backend == "postgresql" else {})
        try:
            self.engine = create_engine(url, connect_args=connect_args)
        except ModuleNotFoundError as exc:
            extra = "postgresql" if self.backend == "postgresql" else "driver for " + self.backend
            raise SourceError(f"reading {where} needs the {extra} extra: pip install -e .[{extra}]") from exc
        except Exception as exc:
            raise SourceError(f"{where} cannot be opened: {first_line(exc)}") from exc

    def probe(self, first: str | None = None) -> tuple[list[str], object]:
        """Connects once: the result's column names, and its first row (a mapping) when it has a column ``first``
        (else None, and no row is fetched)."""
        try:
            conn = self._connection()
        except Exception as exc:  # unreachable server, refused login, missing driver
            self.engine.dispose()
            raise SourceError(f"{self.where} cannot be reached: {first_line(exc)}") from exc
        try:
            result = self._execute(conn)
            names = list(result.keys())
            row = self._fetch(lambda: result.mappings().fetchone()) if first in names else None
            result.close()
        finally:
            conn.rollback()
            conn.close()
        return names, row

    def choose(self, columns: list[str]) -> None:
        """A table is read as only these columns from now on (a query is the user's own statement, read as it is)."""
        if self.table is not None:
            from sqlalchemy import column, select

            self.statement = select(*(column(c) for c in columns)).select_from(self.table)

    def blocks(self, block_rows: int) -> Iterator[list]:
        """The result's rows (mappings), ``block_rows`` at a time, in one read-only connection."""
        conn = self._connection()
        try:
            result = self._execute(conn)
            blocks = result.mappings().partitions(block_rows)
            while (rows := self._fetch(lambda: next(blocks, None))) is not None:
                yield rows
        finally:
            conn.rollback()
            conn.close()

    def _connection(self):  # a sqlalchemy Connection
        self.spent, self.deadline = 0.0, math.inf
        conn = self.engine.connect()
        options = {"stream_results": True}
        if self.backend == "postgresql":
            options["postgresql_readonly"] = True
        if self.backend == "sqlite":  # SQLite has no statement timeout: its progress handler interrupts one
            conn.connection.driver_connection.set_progress_handler(
                lambda: time.monotonic() > self.deadline or cancel_requested(), 10_000)
        self._driver = conn.connection.driver_connection
        return conn.execution_options(**options)

    def _past(self) -> SourceError:
        return SourceError(f"{self.where}: reading it ran past its time limit of {self.timeout} s "
                           "(#timeout=S raises it)")

    def _execute(self, conn):  # ANN202
        return self._fetch(lambda: conn.execute(self.statement))

    def _fetch(self, get):  # ANN202
        """``get()`` (the statement, or a fetch of rows) within what is left of the pass's budget: past it, or a
        database error, is one line."""
        if self.spent > self.timeout:
            raise self._past()
        start = time.monotonic()
        self.deadline = start + self.timeout - self.spent
        cancel = getattr(self._driver, "cancel", None) if self.backend == "postgresql" else None
        try:
            # PostgreSQL: the statement is cancelled on its connection; SQLite's progress handler needs no watcher
            with on_cancel(cancel) if cancel is not None else nullcontext():
                return get()
        except SourceError:
            raise
        except Exception as exc:  # an interrupted or failing fetch becomes the one line
            if cancel_requested():
                raise Cancelled(f"cancelled while reading {self.where}") from exc
            if time.monotonic() > self.deadline:
                raise self._past() from exc
            raise SourceError(f"{self.where}: the query fails: {query_error(exc)}") from exc
        finally:
            self.spent += time.monotonic() - start

    def close(self) -> None:
        self.engine.dispose()


class SqlSource(Source):
    def __init__(self, text: SourceText, *, what: str, expect_dim: int | None) -> None:
        super().__init__(text, what=what, expect_dim=expect_dim)
        self.db = SqlRows(text.location, table=text.option("table"), query=text.option("query"),
                          timeout=timeout_option(text, self.description), where=self.description)
        self.id_name, self.vector_name = text.option("id", "id"), text.option("vector", "vector")
        self.label_name = text.option("label")
        names, first = self.db.probe(self.vector_name)
        for role, name in (("id", self.id_name), ("vector", self.vector_name), ("label", self.label_name)):
            if name and name not in names:
                self.db.close()
                raise SourceError(f"{self.description}: the result has no {role} column {name!r} (columns: "
                                  f"{', '.join(names)}); name it with #{role}=COLUMN")
        if self.label_name is None:
            self.label_name = "label" if "label" in names else ""
        if first is not None:  # the first vector tells the dimension
            self._check_dim(len(parse_vector(first[self.vector_name], where=self.description)))
        self.db.choose([c for c in (self.id_name, self.vector_name, self.label_name) if c])

    def _raw(self, block_rows: int) -> Iterator[Raw]:
        for rows in self.db.blocks(block_rows):
            vectors = [parse_vector(r[self.vector_name], where=self.description) for r in rows]
            lengths = {len(v) for v in vectors}
            if len(lengths) > 1:
                raise SourceError(f"{self.description}: vectors of {min(lengths)} to {max(lengths)} numbers "
                                  f"(ragged)")
            try:
                array = np.array(vectors, dtype=np.float64).reshape(len(vectors), -1)
            except (TypeError, ValueError) as exc:
                raise SourceError(f"{self.description}: a vector holds something other than numbers") from exc
            ids = np.array([r[self.id_name] for r in rows], dtype=object)
            labels = np.array([r[self.label_name] for r in rows], dtype=object) if self.label_name else None
            yield ids, array, labels

    def close(self) -> None:
        self.db.close()
