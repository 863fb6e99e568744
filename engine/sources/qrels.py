"""Relevance judgements (qrels: query id -> item id -> grade) read from a file, read-only, paths in the data roots.

Formats, named by a ``trec:`` / ``beir:`` / ``tsv:`` / ``parquet:`` prefix or told from the file: a TREC qrels file
(``qid 0 docid grade``, whitespace-separated, no header; trec_eval's and pytrec_eval's), a BEIR-style delimited file
with a header (``query-id  corpus-id  score``; ``.tsv`` tab, ``.csv`` comma), or a Parquet / Arrow table (local or an
fsspec URL). A ``.tsv`` / ``.csv`` / ``.txt`` / ``.qrels`` file is TREC when its first line is four fields ending
in a number, else delimited with a header. Columns are found by their usual names (``query-id``, ``query_id``,
``qid``; ``corpus-id``, ``item_id``, ``doc_id``, ``docid``, ``id``; ``score``, ``grade``, ``relevance``) or named
with ``#query=COL&item=COL&grade=COL``; without a grade column every listed pair is relevant (grade 1). Ids are kept
as the text they are written as; a malformed row is one line naming ``FILE:LINE``.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.sources.text import (ARROW_SUFFIXES, SourceError, check_url, first_line, is_url, local_members, local_path,
                                 mask_url, split_options)

QUERY_NAMES = ("query-id", "query_id", "qid", "query")
ITEM_NAMES = ("corpus-id", "corpus_id", "item-id", "item_id", "doc-id", "doc_id", "docid", "id", "item")
GRADE_NAMES = ("score", "grade", "relevance", "rel", "label")
TEXT_SUFFIXES = {".tsv": "\t", ".csv": ",", ".txt": None, ".qrels": None}
TEXT_FORMATS = ("trec", "beir", "tsv")  # named text formats (tsv: delimited with a header, as beir)
TREC_HEADER = ["query-id", "iteration", "corpus-id", "score"]


@dataclass(frozen=True)
class QrelsTable:
    """One judgement per row: ``query`` and ``item`` ids as text, ``grade`` float64 (> 0 relevant)."""

    query: np.ndarray
    item: np.ndarray
    grade: np.ndarray
    description: str


def _pick(names: list[str], wanted: str | None, usual: tuple[str, ...], role: str, where: str) -> str | None:
    if wanted is not None:
        if wanted not in names:
            raise SourceError(f"{where} has no {role} column {wanted!r} (columns: {', '.join(names)})")
        return wanted
    lowered = {n.lower(): n for n in names}
    return next((lowered[u] for u in usual if u in lowered), None)


def _columns(names: list[str], options: dict[str, str], where: str) -> tuple[str, str, str | None]:
    query = _pick(names, options.get("query"), QUERY_NAMES, "query", where)
    item = _pick(names, options.get("item"), ITEM_NAMES, "item", where)
    grade = _pick(names, options.get("grade"), GRADE_NAMES, "grade", where)
    if query is None or item is None:
        raise SourceError(f"{where} has no {'query' if query is None else 'item'} id column (columns: "
                          f"{', '.join(names)}); name it with #query=COLUMN&item=COLUMN")
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
    """The grades as float64; a bad one names its line (``FILE:LINE``) when ``lines`` are known."""
    out = np.empty(len(values), np.float64)
    for i, v in enumerate(values):
        at = f"{where}:{lines[i]}" if lines else where
        try:
            out[i] = float(v)
        except (TypeError, ValueError) as exc:
            raise SourceError(f"{at}: a grade is not a number ({first_line(exc)})") from None
        if not np.isfinite(out[i]):
            raise SourceError(f"{at}: a grade is NaN or infinite")
    return out


def read_qrels(text: str) -> QrelsTable:
    """The judgements a qrels text names (``[trec:|beir:|tsv:|parquet:]LOCATION[#query=&item=&grade=]``); one line
    when unreadable."""
    text = text.strip()
    kind, colon, rest = text.partition(":")
    if colon and kind in (*TEXT_FORMATS, "parquet"):
        text = rest
    else:
        kind = ""
    fmt = "" if kind in ("", "tsv") else kind  # the text format named, "" to tell it from the file
    kind = "tsv" if kind in TEXT_FORMATS else kind
    location, options = split_options(text)
    where = f"qrels {mask_url(location)}"
    suffix = Path(location.rstrip("/")).suffix.lower()
    if not kind:
        kind = "tsv" if suffix in TEXT_SUFFIXES else "parquet" if suffix in ARROW_SUFFIXES else ""
    if not kind:
        raise SourceError(f"cannot tell the format of {where}; use a .tsv, .csv, .txt (TREC) or .parquet file, or "
                          "prefix it with trec:, beir:, tsv: or parquet:")
    try:
        if kind == "tsv":
            if is_url(location):
                raise SourceError(f"{where}: a delimited qrels file is read from a local path; use Parquet for a URL")
            path = local_path(location, what="qrels")
            if not path.is_file():
                raise SourceError(f"{where} cannot be read: no such file")
            header, rows, lines = _text_rows(path, TEXT_SUFFIXES.get(suffix, "\t"), fmt, f"{where}")
            q, i, g = _columns(header, options, where)
            cols = {name: [r[k].strip() for r in rows] for k, name in enumerate(header)}
            query, item = cols[q], cols[i]
            grade = _grades(cols[g], where, lines) if g else np.ones(len(rows))
            blank = next((n for n, a, b in zip(lines, query, item) if not a or not b), None)
            if blank is not None:
                raise SourceError(f"{where}:{blank}: a judgement without a query or item id")
        else:
            import pyarrow.dataset as ds

            if is_url(location):
                import fsspec

                check_url(location, what=where)
                fs, path = fsspec.core.url_to_fs(location)
                table = ds.dataset(path, filesystem=fs, format="parquet").to_table()
            else:
                path = local_path(location, what="qrels")
                fmt = "ipc" if ARROW_SUFFIXES.get(suffix) == "ipc" else "parquet"
                files = local_members(path, ARROW_SUFFIXES, what=where) if path.is_dir() else str(path)
                table = ds.dataset(files, format=fmt).to_table()
            q, i, g = _columns(table.schema.names, options, where)
            query = table.column(q).to_pylist()
            item = table.column(i).to_pylist()
            grade = _grades(table.column(g).to_pylist(), where) if g else np.ones(len(query))
    except SourceError:
        raise
    except FileNotFoundError:
        raise SourceError(f"{where} cannot be read: no such file or folder, or its server cannot be reached") from None
    except Exception as exc:  # noqa: BLE001 - any reader failure becomes the one line
        raise SourceError(f"{where} cannot be read: {first_line(exc)}") from None
    if any(v is None or str(v) == "" for v in (*query, *item)):
        raise SourceError(f"{where} has a judgement without a query or item id")
    if not len(query):
        raise SourceError(f"{where} holds no judgement")
    return QrelsTable(np.asarray([str(v) for v in query]), np.asarray([str(v) for v in item]), grade, where)


__all__ = ["QrelsTable", "read_qrels"]
