"""Any SQL query (or a table) through a SQLAlchemy URL, read in blocks, never written to.

``sql:URL#query=SELECT ...`` or ``sql:URL#table=NAME``; ``id=``, ``vector=``, ``label=`` name the result's columns
(defaults ``id``, ``vector``, ``label`` when present). A vector may be an array (PostgreSQL ``real[]``), or text:
pgvector's ``'[1,2,3]'`` (select ``emb::text``), a JSON array (SQLite), or PostgreSQL's ``'{1,2,3}'``.

Read-only by construction: a query must be one ``SELECT`` / ``WITH`` statement; SQLite files are opened with
``mode=ro`` (and confined to the data roots); PostgreSQL runs it in a read-only transaction; nothing is committed.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from urllib.parse import quote

import numpy as np

from engine.sources.base import Raw, Source
from engine.sources.text import SourceError, SourceText, first_line, local_path

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
    raise SourceError(f"{where}: a vector is {type(value).__name__} {str(value)[:40]!r}, not an array of numbers")


def _sqlite_read_only(url, *, what: str):  # noqa: ANN001, ANN202 - sqlalchemy URL objects
    database = url.database or ""
    if not database or database == ":memory:" or database.startswith("file:"):
        raise SourceError(f"{what}: give a SQLite file path (sqlite:///path/to/file.db), not {database or 'memory'}")
    path = local_path(database, what=what)
    if not path.is_file():
        raise SourceError(f"{what}: SQLite file {path} does not exist")
    return url.set(database=f"file:{quote(str(path))}?mode=ro", query={"uri": "true"})


class SqlSource(Source):
    def __init__(self, text: SourceText, *, what: str, expect_dim: int | None) -> None:
        from sqlalchemy import create_engine, literal_column, make_url, select, table
        from sqlalchemy.exc import ArgumentError

        super().__init__(text, what=what, expect_dim=expect_dim)
        try:
            url = make_url(text.location)
        except ArgumentError as exc:
            raise SourceError(f"{self.description} is not a SQLAlchemy URL") from exc
        self.backend = url.get_backend_name()
        if self.backend == "sqlite":
            url = _sqlite_read_only(url, what=self.description)
        query, name = text.option("query"), text.option("table")
        if bool(query) == bool(name):
            raise SourceError(f"{self.description}: give exactly one of #query=SELECT... or #table=NAME")
        self.id_name, self.vector_name = text.option("id", "id"), text.option("vector", "vector")
        self.label_name = text.option("label")
        if name:
            if not IDENTIFIER.match(name):
                raise SourceError(f"{self.description}: table {name!r} is not a plain [schema.]name")
            schema, _, bare = name.rpartition(".")
            self.table = table(bare, schema=schema or None)
            self.statement = select(literal_column("*")).select_from(self.table).limit(1)
        else:
            if not READ_ONLY_START.match(query) or ";" in query.strip().rstrip(";"):
                raise SourceError(f"{self.description}: the query must be one SELECT or WITH statement")
            from sqlalchemy import text as sql_text

            self.statement = sql_text(query.strip().rstrip(";"))
        try:
            self.engine = create_engine(url)
        except ModuleNotFoundError as exc:
            extra = "postgresql" if self.backend == "postgresql" else "driver for " + self.backend
            raise SourceError(f"reading {self.description} needs the {extra} extra: pip install -e .[{extra}]") \
                from exc
        except Exception as exc:  # noqa: BLE001
            raise SourceError(f"{self.description} cannot be opened: {first_line(exc)}") from exc
        self._probe()
        if name:  # the table's columns are known now: read only those
            from sqlalchemy import column

            chosen = [c for c in (self.id_name, self.vector_name, self.label_name) if c]
            self.statement = select(*(column(c) for c in chosen)).select_from(self.table)

    def _connection(self):  # noqa: ANN202 - a sqlalchemy Connection
        conn = self.engine.connect()
        options = {"stream_results": True}
        if self.backend == "postgresql":
            options["postgresql_readonly"] = True
        return conn.execution_options(**options)

    def _execute(self, conn):  # noqa: ANN001, ANN202
        try:
            return conn.execute(self.statement)
        except Exception as exc:  # noqa: BLE001 - a bad query or a refused write becomes the one line
            raise SourceError(f"{self.description}: the query fails: {first_line(exc)}") from exc

    def _probe(self) -> None:
        """Connects once and checks the result's columns (no rows are fetched)."""
        try:
            conn = self._connection()
        except Exception as exc:  # noqa: BLE001 - unreachable server, refused login, missing driver
            self.engine.dispose()
            raise SourceError(f"{self.description} cannot be reached: {first_line(exc)}") from exc
        try:
            result = self._execute(conn)
            names = list(result.keys())
            first = result.mappings().fetchone() if self.vector_name in names else None
            result.close()
        finally:
            conn.rollback()
            conn.close()
        for role, name in (("id", self.id_name), ("vector", self.vector_name), ("label", self.label_name)):
            if name and name not in names:
                self.engine.dispose()
                raise SourceError(f"{self.description}: the result has no {role} column {name!r} (columns: "
                                  f"{', '.join(names)}); name it with #{role}=COLUMN")
        if self.label_name is None:
            self.label_name = "label" if "label" in names else ""
        if first is not None:  # the first vector tells the dimension
            self._check_dim(len(parse_vector(first[self.vector_name], where=self.description)))

    def _raw(self, block_rows: int) -> Iterator[Raw]:
        conn = self._connection()
        try:
            result = self._execute(conn)
            for rows in result.mappings().partitions(block_rows):
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
        finally:
            conn.rollback()
            conn.close()

    def close(self) -> None:
        self.engine.dispose()
