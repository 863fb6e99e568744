"""A retrieval task folder in one of the two layouts MTEB's retrieval tasks come in, read-only, inside the data roots.

BEIR's (MTEB v1's, and many of its hub datasets'):

    FOLDER/corpus.jsonl       {"_id": "d1", "title": "...", "text": "..."}   one document a line (title optional)
    FOLDER/queries.jsonl      {"_id": "q1", "text": "..."}                    one query a line
    FOLDER/qrels/SPLIT.tsv    query-id  corpus-id  score                      BEIR (or TREC: engine.sources.qrels)

or a local snapshot of an MTEB v2 hub dataset, its three configs as Parquet files:

    FOLDER/corpus/*.parquet   _id (or id), text, title (optional)
    FOLDER/queries/*.parquet  _id (or id), text
    FOLDER/data/SPLIT-*.parquet (or qrels/, default/)   query-id, corpus-id, score

(the corpus's and the queries' files named for the split, ``SPLIT-00000-of-00001.parquet``, when some are, else all
of them; read a batch of rows at a time, only those columns). ``id`` is read where ``_id`` is absent (MTEB v2's
column name). Ids are kept as the text they are written as. Queries without a judgement in the split are left out,
as MTEB's own loader does; a judgement of a query or document the files do not hold is refused (a typo would silently
score 0). Grades are whole numbers (MTEB casts them to int32). Every malformed line is one ``SourceError`` naming
``FILE:LINE``. The texts are read line by line; they are held as Python strings (a corpus's text, not its vectors).
"""
from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.data.roots import data_roots
from engine.sources.qrels import QrelsTable, read_qrels
from engine.sources.text import SourceError, first_line, local_path
from storage.safe_open import open_regular

FILES = ("corpus.jsonl", "queries.jsonl")  # and qrels/SPLIT.tsv
HUB_FOLDERS = ("corpus", "queries")  # a hub snapshot's corpus and queries configs
HUB_QRELS = ("data", "qrels", "default")  # where a hub snapshot keeps its qrels (the "default" config), in this order
BATCH_ROWS = 65536  # Parquet rows read at a time


@dataclass(frozen=True)
class RetrievalFolder:
    """One split of a retrieval task: documents (ids, titles, texts), queries (ids, texts) and integer qrels."""

    name: str
    split: str
    corpus_ids: list[str]
    corpus_titles: list[str]
    corpus_texts: list[str]
    query_ids: list[str]
    query_texts: list[str]
    qrels: dict[str, dict[str, int]]


class _Texts:
    """Ids, titles ("" without) and texts in the order read, from one file or one config's files."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.titles: list[str] = []
        self.texts: list[str] = []
        self._seen: set[str] = set()

    def add(self, ident: str, text: str, title: str, *, at: str) -> None:
        """One more row; ``at`` (``FILE:LINE``, or the file) names it when its id was given before."""
        if ident in self._seen:
            raise SourceError(f"{at}: the id {ident!r} is given twice")
        self._seen.add(ident)
        self.ids.append(ident)
        self.texts.append(text)
        self.titles.append(title)

    def read(self, where: str) -> tuple[list[str], list[str], list[str]]:
        """Ids, titles and texts; one line when no row was read."""
        if not self.ids:
            raise SourceError(f"{where} holds no row")
        return self.ids, self.titles, self.texts


def _jsonl(path: Path, where: str, *, title: bool) -> tuple[list[str], list[str], list[str]]:
    """Ids, titles ("" without) and texts of a JSON-lines file; one line for a malformed or repeated row."""
    rows = _Texts()
    try:
        handle = open_regular(path, roots=data_roots(), what=where)
    except FileNotFoundError:
        raise SourceError(f"{where} cannot be read: no such file") from None
    except (OSError, ValueError) as exc:
        raise SourceError(f"{where} cannot be read: {first_line(exc)}") from None
    with io.TextIOWrapper(handle, encoding="utf-8") as lines:
        try:
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SourceError(f"{where}:{n}: not a JSON object ({exc.msg})") from None
                key = "_id" if isinstance(row, dict) and "_id" in row else "id"
                if not isinstance(row, dict) or row.get(key) in (None, "") or not isinstance(row.get("text"), str):
                    raise SourceError(f'{where}:{n}: a row is a JSON object with "_id" and "text" (a string)')
                rows.add(str(row[key]), row["text"], str(row.get("title") or "") if title else "", at=f"{where}:{n}")
        except UnicodeDecodeError:
            raise SourceError(f"{where} is not UTF-8 text") from None
    return rows.read(where)


def _named_for(path: Path, split: str) -> bool:
    """Whether a hub snapshot's file holds ``split`` by its name (``SPLIT.parquet``, ``SPLIT-00000-of-00001.parquet``)."""
    return path.stem == split or path.name.startswith(f"{split}-")


def _for_split(files: list[Path], split: str) -> list[Path]:
    """The files named for ``split``, else all of them."""
    return [f for f in files if _named_for(f, split)] or files


def _parquet(files: list[Path], where: str, *, title: bool) -> tuple[list[str], list[str], list[str]]:
    """Ids, titles ("" without) and texts of Parquet files (a hub config), a batch of rows at a time."""
    import pyarrow.parquet as pq

    rows = _Texts()
    for path in files:
        at = f"{where}/{path.name}"
        try:
            with open_regular(path, roots=data_roots(), what=at) as handle:
                pf = pq.ParquetFile(handle)
                names = pf.schema_arrow.names
                key = "_id" if "_id" in names else "id"
                if key not in names or "text" not in names:
                    raise SourceError(f"{at} has no {key!r} or 'text' column (columns: {', '.join(names)})")
                columns = [key, "text"] + (["title"] if title and "title" in names else [])
                for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=columns):
                    block = batch.to_pydict()
                    for n, ident in enumerate(block[key]):
                        text = block["text"][n]
                        if ident in (None, "") or not isinstance(text, str):
                            raise SourceError(f"{at}: a row without an id or a text (row {len(rows.ids) + 1})")
                        rows.add(str(ident), text, str(block["title"][n] or "") if "title" in block else "", at=at)
        except SourceError:
            raise
        except (OSError, ValueError) as exc:  # absent, refused, not Parquet
            raise SourceError(f"{at} cannot be read: {first_line(exc)}") from None
    return rows.read(where)


def _hub_layout(folder: Path, split: str, location: str) -> tuple[tuple, tuple, list[Path]]:
    """Corpus and queries (ids, titles, texts) and the qrels files of a hub snapshot's ``split``."""
    found = {}
    for name in HUB_FOLDERS:
        files = sorted(p for p in (folder / name).glob("*.parquet") if p.is_file())
        if not files:
            raise SourceError(f"retrieval task folder {location} has no {name}/*.parquet")
        found[name] = _for_split(files, split)
    qrels = next((files for name in HUB_QRELS
                  if (files := [p for p in sorted((folder / name).glob("*.parquet")) if _named_for(p, split)])), None)
    if qrels is None:
        there = sorted({p.name.split("-")[0].removesuffix(".parquet") for name in HUB_QRELS
                        for p in (folder / name).glob("*.parquet")})
        raise SourceError(f"retrieval task folder {location} has no qrels for split {split} in "
                          f"{', '.join(n + '/' for n in HUB_QRELS)} (splits there: {', '.join(there) or 'none'})")
    corpus = _parquet(found["corpus"], f"{folder.name}/corpus", title=True)
    queries = _parquet(found["queries"], f"{folder.name}/queries", title=False)
    return corpus, queries, qrels


def read_retrieval_folder(location: str | Path, *, split: str = "test") -> RetrievalFolder:
    """The ``split`` of the task in ``location`` (a folder in the data roots, BEIR's layout or a hub snapshot's: the
    module docstring); ``SourceError`` (one line) when a file is missing or malformed."""
    if not re.fullmatch(r"[\w.-]+", split) or split in (".", ".."):
        raise SourceError(f"a split is a plain name (test, dev, ...), not {split!r}")
    folder = local_path(str(location), what="retrieval task folder")
    if not folder.is_dir():
        raise SourceError(f"retrieval task folder {location} is not a folder")
    if not (folder / FILES[0]).exists() and (folder / HUB_FOLDERS[0]).is_dir():  # a hub snapshot's Parquet configs
        (corpus_ids, titles, corpus_texts), (query_ids, _, query_texts), qrels_files = _hub_layout(folder, split,
                                                                                                   str(location))
        tables = [read_qrels(f"parquet:{f}") for f in qrels_files]
        table = QrelsTable(np.concatenate([t.query for t in tables]), np.concatenate([t.item for t in tables]),
                           np.concatenate([t.grade for t in tables]), f"qrels {folder.name}/{qrels_files[0].parent.name}")
    else:
        qrels_file = next((folder / "qrels" / f"{split}{s}" for s in (".tsv", ".txt") if
                           (folder / "qrels" / f"{split}{s}").is_file()), None)
        if qrels_file is None:
            raise SourceError(f"retrieval task folder {location} has no qrels/{split}.tsv (splits there: "
                              f"{', '.join(sorted(p.stem for p in (folder / 'qrels').glob('*.tsv'))) or 'none'})")
        corpus_ids, titles, corpus_texts = _jsonl(folder / FILES[0], f"{folder.name}/{FILES[0]}", title=True)
        query_ids, _, query_texts = _jsonl(folder / FILES[1], f"{folder.name}/{FILES[1]}", title=False)
        table = read_qrels(str(qrels_file))
    whole = np.round(table.grade)
    if not np.array_equal(whole, table.grade):
        raise SourceError(f"{table.description}: a grade is not a whole number (MTEB reads grades as integers)")
    for ids, side, known in ((table.query.tolist(), "query", set(query_ids)),
                             (table.item.tolist(), "document", set(corpus_ids))):
        unknown = next((i for i in ids if i not in known), None)
        if unknown is not None:
            raise SourceError(f"{table.description} judges the {side} {unknown!r}, which the folder does not hold")
    qrels: dict[str, dict[str, int]] = {}
    for q, d, g in zip(table.query.tolist(), table.item.tolist(), whole.astype(np.int64).tolist()):
        qrels.setdefault(q, {})[d] = g
    keep = [i for i, q in enumerate(query_ids) if q in qrels]
    return RetrievalFolder(folder.name, split, corpus_ids, titles, corpus_texts, [query_ids[i] for i in keep],
                           [query_texts[i] for i in keep], qrels)


__all__ = ["FILES", "HUB_FOLDERS", "HUB_QRELS", "RetrievalFolder", "read_retrieval_folder"]
