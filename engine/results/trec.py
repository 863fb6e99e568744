"""TREC files of a check: one run file per matrix cell and the qrels it was judged with, so trec_eval, pytrec_eval,
ranx or ir-measures recompute every number the check printed (``--export trec DIR``).

A run line is ``query-id Q0 doc-id rank score tag`` (trec_eval's format): each query's top-k list as the check ranked
it, the score the cosine similarity (the float32 value written in full, so it reads back exactly). trec_eval orders
equal scores by doc id, descending, whatever the ranks say; the check's default rank-tie rule ranks a non-relevant
item first instead, so on a list with tied scores the two agree only under ``--rank-ties trec`` (:func:`tied_queries`
counts the lists a reader should know about). A qrels line is ``query-id 0 doc-id grade``: only the relevant
judgements (grade > 0) of the queries that have one in the gallery, the queries the check averages over, so a tool's
mean over the file's queries is the check's mean.

The same files reach a folder (:func:`write_files`, the command line) or one zip (:func:`zip_files`, the dashboard's
download, stored with the check). A folder's files may come as chunks, written as they come (compare-checkpoints'
full rankings stream so); the zip holds every text in memory at once (the lists' size: queries x k lines per cell).
"""
from __future__ import annotations

import io
import os
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from engine.core.kinds import TREC_RANK_TIES
from engine.results.json_file import json_target

RUN_SUFFIX = ".run"
QRELS_NAME = "qrels.txt"
# a cell's file name: the role of its query model -> gallery model (the check's names may be anything)
CELL_FILES = {"old->old": "old_old", "new->old": "new_old", "new->new": "new_new", "adapted->old": "adapted_old"}


def _trec_id(value: object, what: str) -> str:
    text = str(value)
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"{what} {text!r} is empty or holds whitespace; a TREC file cannot hold it")
    return text


def run_text(query_ids: Sequence, item_ids: np.ndarray, scores: np.ndarray, tag: str) -> str:
    """The run lines of ranked lists: row ``i`` of ``item_ids`` / ``scores`` (n_q, k) is query ``query_ids[i]``'s list,
    best first; ``tag`` names the run (no whitespace)."""
    item_ids, scores = np.asarray(item_ids), np.asarray(scores)
    if item_ids.shape != scores.shape or len(item_ids) != len(query_ids):
        raise ValueError(f"{len(query_ids)} queries, ids {item_ids.shape} and scores {scores.shape} do not match")
    tag = _trec_id(tag, "run tag")
    lines = []
    for qid, items, row in zip(query_ids, item_ids.tolist(), scores.tolist()):
        q = _trec_id(qid, "query id")
        lines += [f"{q} Q0 {_trec_id(d, 'item id')} {r} {s!r} {tag}" for r, (d, s) in enumerate(zip(items, row), 1)]
    return "\n".join(lines) + "\n" if lines else ""


def qrels_text(judged: Mapping[object, Mapping[object, float]]) -> str:
    """The qrels lines of ``judged[query id][item id] = grade``: relevant judgements only (grade > 0), an integral
    grade written as an integer (trec_eval reads integers), queries without one left out."""
    lines = []
    for qid, items in judged.items():
        for item, grade in items.items():
            if grade > 0:
                g = int(grade) if float(grade).is_integer() else grade
                lines.append(f"{_trec_id(qid, 'query id')} 0 {_trec_id(item, 'item id')} {g}")
    return "\n".join(lines) + "\n" if lines else ""


def tied_queries(scores: np.ndarray) -> int:
    """How many lists hold two equal scores (their order in a TREC tool is by doc id, descending)."""
    scores = np.asarray(scores)
    return int((np.diff(scores, axis=1) == 0).any(1).sum()) if scores.shape[1] > 1 else 0


def write_trec(folder: Path, runs: Mapping[str, str], qrels: str) -> list[Path]:
    """``folder/<cell>.run`` for each cell of :data:`CELL_FILES` in ``runs`` (cell -> run text) and
    ``folder/qrels.txt``, each written whole or not at all; the paths written."""
    unknown = [c for c in runs if c not in CELL_FILES]
    if unknown:
        raise ValueError(f"unknown cell(s) {', '.join(unknown)}; a run file is one of {', '.join(CELL_FILES)}")
    return write_files(folder, {**{f"{CELL_FILES[c]}{RUN_SUFFIX}": text for c, text in runs.items()},
                                QRELS_NAME: qrels})


def tied_note(tied: int, rank_ties: str) -> str | None:
    """What a reader of the files should know when ``tied`` lists hold equal scores and the check did not rank them
    in trec_eval's order (``rank_ties``); None otherwise."""
    if not tied or rank_ties == TREC_RANK_TIES:
        return None
    return (f"{tied:,} exported lists hold equal scores; TREC tools order those by doc id, descending, so their numbers "
            "equal these under the rank-tie rule trec (--rank-ties trec)")


def _plain_names(files: Mapping[str, str]) -> None:
    bad = [n for n in files if Path(n).name != n or n.startswith(".")]
    if bad:
        raise ValueError(f"a TREC file name must be a plain name, got {bad[0]!r}")


def zip_files(files: Mapping[str, str]) -> bytes:
    """One zip of ``name -> text`` (plain names, UTF-8, deflated), the same bytes for the same files (entries dated
    1980-01-01, the zip format's first day)."""
    _plain_names(files)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            entry = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            entry.compress_type, entry.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
            z.writestr(entry, text.encode())
    return out.getvalue()


def write_files(folder: Path, files: Mapping[str, str | Iterable[str]]) -> list[Path]:
    """``folder/<name>`` for each ``name -> text`` of ``files`` (plain names; a text may come as an iterable of
    chunks, written as they come, so no file is held whole). Every file goes to a temporary name in ``folder`` first
    and is renamed only once all are written: a failure while writing removes the temporary files and replaces no
    file. The paths written."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--export trec {folder}: not a folder")
    _plain_names(files)
    paths = [json_target(folder / name) for name in files]
    folder.mkdir(parents=True, exist_ok=True)
    temporary: list[str] = []
    try:
        for path, text in zip(paths, files.values()):
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
            temporary.append(tmp)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                for chunk in ([text] if isinstance(text, str) else text):
                    f.write(chunk)
        for path, tmp in zip(paths, temporary):
            json_target(path)  # checked again just before the rename: a device put there meanwhile is not replaced
            os.replace(tmp, path)
    except BaseException:
        for tmp in temporary:
            Path(tmp).unlink(missing_ok=True)
        raise
    return paths


__all__ = ["CELL_FILES", "QRELS_NAME", "RUN_SUFFIX", "qrels_text", "run_text", "tied_note", "tied_queries",
           "write_files", "write_trec", "zip_files"]
