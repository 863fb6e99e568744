"""Relevance judgements (qrels: query id -> item id -> grade) read from a file or a store, read-only, paths in the
data roots.

Kinds (:data:`engine.core.kinds.QRELS`), named by a ``trec:`` / ``beir:`` / ``tsv:`` / ``parquet:`` / ``sql:`` /
``lance:`` / ``qdrant:`` prefix or told from the text: a TREC qrels file (``qid 0 docid grade``, whitespace-separated,
no header; trec_eval's and pytrec_eval's), a BEIR-style delimited file with a header (``query-id  corpus-id  score``;
``.tsv`` tab, ``.csv`` comma), a Parquet / Arrow table (local or an fsspec URL), a SQL table or view
(``sql:URL#table=NAME``), a LanceDB table (``lance:FOLDER#table=NAME``) or a Qdrant collection whose points each
carry one judgement in their payload (``qdrant:FOLDER-or-URL#collection=NAME``). A ``.tsv`` / ``.csv`` / ``.txt`` /
``.qrels`` file is TREC when its first line is four fields ending in a number, else delimited with a header; a text
without a prefix or a file suffix is recognised as a source is (a SQL URL, a ``.lance`` table, a Qdrant folder).
The stores are opened by their vector readers' own code (:class:`~engine.sources.sql.SqlRows`,
:func:`~engine.sources.arrow.open_lance`, :class:`~engine.sources.qdrant.QdrantPoints`): the same URL syntax,
read-only rules, time limits and confinement, masked in every message; only the three columns (payload fields) are
read, a block at a time, never a vector. Columns are found by their usual names (``query-id``, ``query_id``, ``qid``;
``corpus-id``, ``item_id``, ``doc_id``, ``docid``, ``id``; ``score``, ``grade``, ``relevance``) or named with
``#query=COL&item=COL&grade=COL`` (for SQL too, whose table is ``#table=``: a SELECT goes in a view); without a grade
column every listed pair is relevant (grade 1). Ids are kept as the text they are written as; a malformed row is one
line naming ``FILE:LINE`` (a store's: the value's type, never the value).
"""
from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.core.kinds import QRELS, listed
from engine.sources.text import (ARROW_SUFFIXES, SourceError, SourceText, check_url, first_line, is_url, local_members,
                                 local_path, mask_url, recognise, resolve_secrets, split_options)

QUERY_NAMES = ("query-id", "query_id", "qid", "query")
ITEM_NAMES = ("corpus-id", "corpus_id", "item-id", "item_id", "doc-id", "doc_id", "docid", "id", "item")
GRADE_NAMES = ("score", "grade", "relevance", "rel", "label")
TEXT_SUFFIXES = {".tsv": "\t", ".csv": ",", ".txt": None, ".qrels": None}
TEXT_FORMATS = ("trec", "beir", "tsv")  # named text formats (tsv: delimited with a header, as beir)
TREC_HEADER = ["query-id", "iteration", "corpus-id", "score"]
BLOCK_ROWS = 65536  # a store's judgements read at a time


@dataclass(frozen=True)
class QrelsTable:
    """One judgement per row: ``query`` and ``item`` ids as text, ``grade`` float64 (> 0 relevant)."""

    query: np.ndarray
    item: np.ndarray
    grade: np.ndarray
    description: str


def _pick(names: list[str], wanted: str | None, usual: tuple[str, ...], role: str, where: str,
          noun: str = "column") -> str | None:
    if wanted is not None:
        if wanted not in names:
            raise SourceError(f"{where} has no {role} {noun} {wanted!r} ({noun}s: {', '.join(names)})")
        return wanted
    lowered = {n.lower(): n for n in names}
    return next((lowered[u] for u in usual if u in lowered), None)


def _columns(names: list[str], options: dict[str, str], where: str, noun: str = "column"
             ) -> tuple[str, str, str | None]:
    """The query, item and grade columns (None: no grade) among ``names``: named by the options or by usual names."""
    query = _pick(names, options.get("query"), QUERY_NAMES, "query", where, noun)
    item = _pick(names, options.get("item"), ITEM_NAMES, "item", where, noun)
    grade = _pick(names, options.get("grade"), GRADE_NAMES, "grade", where, noun)
    if query is None or item is None:
        raise SourceError(f"{where} has no {'query' if query is None else 'item'} id {noun} ({noun}s: "
                          f"{', '.join(names) or 'none'}); name it with #query={noun.split()[-1].upper()}&"
                          f"item={noun.split()[-1].upper()}")
    return query, item, grade


def _looks_trec(fields: list[str]) -> bool:
    """A first line of four fields ending in a number, and no header name: a TREC qrels row."""
    if len(fields) != 4 or fields[0].lower() in QUERY_NAMES:
        return False
    try:
        float(fields[3])
    except ValueError:
        return False
    return True


def _text_rows(path: Path, delimiter: str | None, fmt: str, where: str) -> tuple[list[str], list[list[str]], list[int]]:
    """Header, rows and each row's line number of a text qrels file: TREC (``fmt`` "trec", whitespace, the standard
    names), delimited with a header ("beir"), or told from the first line (""); ``FILE:LINE`` for a malformed row."""
    with open(path, newline="", encoding="utf-8") as f:
        lines = f.read().splitlines()
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        raise SourceError(f"{where} is empty")
    if not fmt:
        fmt = "trec" if _looks_trec(first.split()) else "beir"
    if fmt == "trec":
        rows, numbers = [], []
        for n, line in enumerate(lines, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 4:
                raise SourceError(f"{where}:{n}: a TREC qrels row is 'query-id 0 doc-id grade' (4 fields), this one "
                                  f"has {len(fields)}")
            rows.append(fields)
            numbers.append(n)
        return list(TREC_HEADER), rows, numbers
    if delimiter is None:  # .txt / .qrels with a header: whitespace-separated
        numbered = [(n, line.split()) for n, line in enumerate(lines, 1)]
    else:
        reader = csv.reader(lines, delimiter=delimiter)
        numbered = [(reader.line_num, row) for row in reader]
    header: list[str] | None = None
    rows, numbers = [], []
    for n, row in numbered:
        if not any(c.strip() for c in row):
            continue
        if header is None:
            header = [c.strip() for c in row]
            continue
        if len(row) != len(header):
            raise SourceError(f"{where}:{n}: {len(row)} fields, the header {len(header)}")
        rows.append(row)
        numbers.append(n)
    return header or [], rows, numbers


def _grades(values: list, where: str, lines: list[int] | None = None) -> np.ndarray:
    """The grades as float64; a bad one names its line (``FILE:LINE``) and its text when ``lines`` are known (a local
    file's), else its type only (a table's or a store's value could be anything a column holds)."""
    out = np.empty(len(values), np.float64)
    for i, v in enumerate(values):
        at = f"{where}:{lines[i]}" if lines else where
        try:
            out[i] = float(v)
        except (TypeError, ValueError) as exc:
            shown = first_line(exc) if lines else "null" if v is None else \
                f"a {type(v).__name__}; its value is not shown"
            raise SourceError(f"{at}: a grade is not a number ({shown})") from None
        if not np.isfinite(out[i]):
            raise SourceError(f"{at}: a grade is NaN or infinite")
    return out


def _judgements(names: list[str], rows: Callable[[list[str]], Iterable[list]], spec: SourceText, where: str,
                noun: str = "column") -> tuple[list, list, np.ndarray]:
    """Query ids, item ids and grades of a store's rows: ``names`` are its columns (``noun``s), found as in a file
    (:func:`_columns`); ``rows(columns)`` yields blocks of rows, each a mapping that holds those columns."""
    q, i, g = _columns(names, spec.options, where, noun)
    query, item, grade = [], [], []
    for block in rows([q, i] + ([g] if g else [])):
        query += [r[q] for r in block]
        item += [r[i] for r in block]
        grade += [r[g] for r in block] if g else []
    return query, item, _grades(grade, where) if g else np.ones(len(query))


def _sql(spec: SourceText, where: str) -> tuple[list, list, np.ndarray]:
    """A SQL table or view (``#table=``); ``#query=`` names the query id column, as for every kind."""
    from engine.sources.sql import READ_ONLY_START, SqlRows, timeout_option

    named = spec.option("query") or ""
    if READ_ONLY_START.match(named) and len(named.split()) > 1:
        raise SourceError(f"{where}: qrels are read from a table or view (#table=NAME); #query= names its query id "
                          "column, so put a SELECT in a view")
    if not spec.option("table"):
        raise SourceError(f"{where} names no table; add #table=NAME (qrels are read from a table or view)")
    db = SqlRows(spec.location, table=spec.option("table"), query=None, timeout=timeout_option(spec, where),
                 where=where)
    try:
        names, _ = db.probe()

        def rows(columns: list[str]) -> Iterator[list]:
            db.choose(columns)
            return db.blocks(BLOCK_ROWS)

        return _judgements(names, rows, spec, where)
    finally:
        db.close()


def _lance(spec: SourceText, where: str) -> tuple[list, list, np.ndarray]:
    from engine.sources.arrow import lance_batches, open_lance

    table, _, schema = open_lance(spec, what="qrels", where=where)

    def rows(columns: list[str]) -> Iterator[list]:
        return (batch.to_pylist() for batch in lance_batches(table, columns, BLOCK_ROWS, where=where))

    return _judgements(schema.names, rows, spec, where)


def _qdrant(spec: SourceText, where: str) -> tuple[list, list, np.ndarray]:
    """A collection with a judgement in each point's payload; the first point's payload fields name the columns."""
    from engine.sources.qdrant import QdrantPoints

    points = QdrantPoints(spec, what="qrels", where=where)
    try:
        with closing(points.pages(1, vectors=False, payload=True)) as pages:
            first = next(pages, [])
        if not first:
            raise SourceError(f"{where} holds no judgement")

        def rows(columns: list[str]) -> Iterator[list]:
            for page in points.pages(BLOCK_ROWS, vectors=False, payload=columns):
                for point in page:
                    missing = next((c for c in columns if c not in (point["payload"] or {})), None)
                    if missing is not None:
                        raise SourceError(f"{where}: point {point['id']} has no payload field {missing!r}")
                yield [point["payload"] for point in page]

        return _judgements(list(first[0]["payload"] or {}), rows, spec, where, "payload field")
    finally:
        points.close()


# qrels kind (engine.core.kinds.QRELS) of a store -> its reader: (text, where) -> query ids, item ids, grades
STORES: dict[str, Callable[[SourceText, str], tuple[list, list, np.ndarray]]] = {
    "sql": _sql, "lance": _lance, "qdrant": _qdrant}


def _file(kind: str, location: str, options: dict[str, str], where: str) -> tuple[list, list, np.ndarray]:
    """The judgements of a text file (``kind`` one of :data:`TEXT_FORMATS`) or a Parquet / Arrow table."""
    suffix = Path(location.rstrip("/")).suffix.lower()
    if kind in TEXT_FORMATS:
        if is_url(location):
            raise SourceError(f"{where}: a delimited qrels file is read from a local path; use Parquet for a URL")
        path = local_path(location, what="qrels")
        if not path.is_file():
            raise SourceError(f"{where} cannot be read: no such file")
        fmt = "" if kind == "tsv" else kind  # the text format named, "" to tell it from the file
        header, rows, lines = _text_rows(path, TEXT_SUFFIXES.get(suffix, "\t"), fmt, f"{where}")
        q, i, g = _columns(header, options, where)
        cols = {name: [r[k].strip() for r in rows] for k, name in enumerate(header)}
        query, item = cols[q], cols[i]
        blank = next((n for n, a, b in zip(lines, query, item) if not a or not b), None)
        if blank is not None:
            raise SourceError(f"{where}:{blank}: a judgement without a query or item id")
        return query, item, _grades(cols[g], where, lines) if g else np.ones(len(rows))
    import pyarrow.dataset as ds

    if is_url(location):
        import fsspec

        check_url(location, what=where)
        fs, path = fsspec.core.url_to_fs(location)
        dataset = ds.dataset(path, filesystem=fs, format="parquet")
    else:
        path = local_path(location, what="qrels")
        fmt = "ipc" if ARROW_SUFFIXES.get(suffix) == "ipc" else "parquet"
        files = local_members(path, ARROW_SUFFIXES, what=where) if path.is_dir() else str(path)
        dataset = ds.dataset(files, format=fmt)
    q, i, g = _columns(dataset.schema.names, options, where)
    table = dataset.to_table(columns=[q, i] + ([g] if g else []))  # never another column (a vector)
    query, item = table.column(q).to_pylist(), table.column(i).to_pylist()
    return query, item, _grades(table.column(g).to_pylist(), where) if g else np.ones(len(query))


def read_qrels(text: str) -> QrelsTable:
    """The judgements a qrels text names (``[KIND:]LOCATION[#query=&item=&grade=]``, a kind of
    :data:`engine.core.kinds.QRELS`); one line when unreadable."""
    text = resolve_secrets(text).strip()
    kind, colon, rest = text.partition(":")
    if colon and kind in QRELS:
        text = rest
    else:
        kind = ""
    location, options = split_options(text)
    location = location.strip()
    where = f"qrels {mask_url(location)}"
    if not kind:
        suffix = Path(location.rstrip("/")).suffix.lower()
        kind = "tsv" if suffix in TEXT_SUFFIXES else "parquet" if suffix in ARROW_SUFFIXES else _recognised(location)
    if not kind:
        raise SourceError(f"cannot tell the format of {where}; use a .tsv, .csv, .txt (TREC) or .parquet file, or "
                          f"prefix it with {listed([f'{k}:' for k in QRELS])}")
    if kind in STORES:
        spec = SourceText(kind, location, options)
        where = f"qrels {spec.masked()}"
        query, item, grade = STORES[kind](spec, where)
    else:
        try:
            query, item, grade = _file(kind, location, options, where)
        except SourceError:
            raise
        except FileNotFoundError:
            raise SourceError(f"{where} cannot be read: no such file or folder, or its server cannot be reached") \
                from None
        except Exception as exc:  # noqa: BLE001 - any reader failure becomes the one line
            raise SourceError(f"{where} cannot be read: {first_line(exc)}") from None
    if any(v is None or str(v) == "" for v in (*query, *item)):
        raise SourceError(f"{where} has a judgement without a query or item id")
    if not len(query):
        raise SourceError(f"{where} holds no judgement")
    return QrelsTable(np.asarray([str(v) for v in query]), np.asarray([str(v) for v in item]), grade, where)


def _recognised(location: str) -> str:
    """The store a location without a prefix or a file suffix names, as a source's is recognised (a SQL URL, a
    ``.lance`` table, a Qdrant or LanceDB folder, a folder of Parquet files); "" when none."""
    try:
        kind = recognise(location)
    except SourceError:
        return ""
    return kind if kind in QRELS else ""


__all__ = ["STORES", "QrelsTable", "read_qrels"]
