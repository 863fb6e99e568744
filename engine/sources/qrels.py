"""Relevance judgements (qrels: query id -> item id -> grade) read from a file, read-only, paths in the data roots.

Formats, by suffix or a ``tsv:`` / ``parquet:`` prefix: a BEIR-style ``.tsv`` / ``.csv`` with a header
(``query-id  corpus-id  score``), a TREC qrels file (``.txt`` / ``.qrels``, no header: ``qid 0 docid grade``), or a
Parquet / Arrow table (local or an fsspec URL). Columns are found by their usual names (``query-id``, ``query_id``,
``qid``; ``corpus-id``, ``item_id``, ``doc_id``, ``docid``, ``id``; ``score``, ``grade``, ``relevance``) or named
with ``#query=COL&item=COL&grade=COL``; without a grade column every listed pair is relevant (grade 1).
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


def _text_rows(path: Path, delimiter: str | None, where: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a delimited file; a TREC file (no header, 4 columns) gets its standard names."""
    with open(path, newline="", encoding="utf-8") as f:
        if delimiter is None:
            rows = [line.split() for line in f if line.strip()]
        else:
            rows = [r for r in csv.reader(f, delimiter=delimiter) if r]
    if not rows:
        raise SourceError(f"{where} is empty")
    if delimiter is None and len(rows[0]) == 4 and not any(c.lower() in QUERY_NAMES for c in rows[0]):
        header = ["query-id", "iteration", "corpus-id", "score"]
    else:
        header, rows = [c.strip() for c in rows[0]], rows[1:]
    bad = next((i for i, r in enumerate(rows) if len(r) != len(header)), None)
    if bad is not None:
        raise SourceError(f"{where}: row {bad + 2} has {len(rows[bad])} fields, the header {len(header)}")
    return header, rows


def _grades(values: list, where: str) -> np.ndarray:
    try:
        grades = np.asarray([float(v) for v in values], np.float64)
    except (TypeError, ValueError) as exc:
        raise SourceError(f"{where}: a grade is not a number ({first_line(exc)})") from None
    if not np.isfinite(grades).all():
        raise SourceError(f"{where}: a grade is NaN or infinite")
    return grades


def read_qrels(text: str) -> QrelsTable:
    """The judgements a qrels text names (``[tsv:|parquet:]LOCATION[#query=&item=&grade=]``); one line when unreadable."""
    text = text.strip()
    kind, colon, rest = text.partition(":")
    if colon and kind in ("tsv", "parquet"):
        text = rest
    else:
        kind = ""
    location, options = split_options(text)
    where = f"qrels {mask_url(location)}"
    suffix = Path(location.rstrip("/")).suffix.lower()
    if not kind:
        kind = "tsv" if suffix in TEXT_SUFFIXES else "parquet" if suffix in ARROW_SUFFIXES else ""
    if not kind:
        raise SourceError(f"cannot tell the format of {where}; use a .tsv, .csv, .txt (TREC) or .parquet file, or "
                          "prefix it with tsv: or parquet:")
    try:
        if kind == "tsv":
            if is_url(location):
                raise SourceError(f"{where}: a delimited qrels file is read from a local path; use Parquet for a URL")
            path = local_path(location, what="qrels")
            if not path.is_file():
                raise SourceError(f"{where} cannot be read: no such file")
            header, rows = _text_rows(path, TEXT_SUFFIXES.get(suffix, "\t"), where)
            q, i, g = _columns(header, options, where)
            cols = {name: [r[k].strip() for r in rows] for k, name in enumerate(header)}
            query, item = cols[q], cols[i]
            grade = _grades(cols[g], where) if g else np.ones(len(rows))
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
