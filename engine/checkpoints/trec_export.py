"""A checkpoint comparison's TREC files (``compare-checkpoints --export trec DIR``): for each view and each computed
cell (query model t, gallery model k <= t), the full ranking of the gallery as a run file, and the judgements it was
scored with, so trec_eval, pytrec_eval or ranx recompute the printed matrices.

Files: ``<view>_M<t>_M<k>.run`` and ``<view>_M<t>_M<k>.qrels`` (models numbered as printed, M1 the oldest). Ids: a
query is ``q<row>`` and a gallery item ``g<row>``, its row in the split (closed-set: the one split, and a query's own
image is left out of its ranking, as the matrices do). Relevant: the gallery items of the query's class (grade 1);
queries without one are left out, as the matrices count and leave them out. The run holds the whole gallery, so mAP
is trec_eval's ``map`` and Recall@K (a hit in the first K) its ``success_K``; a class-template gallery is refused.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from engine.checkpoints.compare import _cells
from engine.checkpoints.comparison import Comparison
from engine.metrics.retrieval import unit_rows
from engine.results.trec import qrels_text, run_text

BLOCK_ROWS = 1024  # queries whose similarities to the whole gallery are held at once


def comparison_trec_files(cmp: Comparison) -> dict[str, Iterator[str]]:
    """File name -> the text of every computed cell's run and qrels (module docstring), each as chunks computed as
    they are read (``engine.results.trec.write_files`` writes them so): a query's run lines, a block's qrels."""
    if cmp.spec.gallery_kind != "instance":
        raise ValueError("--export trec writes rankings of gallery items; a template gallery's items are class means "
                         "(use --gallery-kind instance)")
    files: dict[str, Iterator[str]] = {}
    for view, result in cmp.results.items():
        cell = _cells(view, cmp.outputs, cmp.split_labels, cmp.class_names, cmp.same_set)
        n = len(cmp.labels)
        for t in range(n):
            for k in range(t + 1):
                if result.comparable[t, k]:
                    stem = f"{view}_M{t + 1}_M{k + 1}"
                    files[f"{stem}.run"] = _lazy(cell, t, k, "run", same_set=cmp.same_set, tag=stem)
                    files[f"{stem}.qrels"] = _lazy(cell, t, k, "qrels", same_set=cmp.same_set, tag=stem)
    return files


def _lazy(cell, t: int, k: int, part: str, *, same_set: bool, tag: str) -> Iterator[str]:
    """The chunks of one cell's run or qrels; the cell's features are derived when the first chunk is asked for."""
    f = cell(t, k)
    if part == "run":
        yield from cell_run(f.query, f.gallery, same_set=same_set, tag=tag)
    else:
        yield from cell_qrels(f.query_labels, f.gallery_labels, same_set=same_set)


def cell_run(query: np.ndarray, gallery: np.ndarray, *, same_set: bool, tag: str) -> Iterator[str]:
    """The run of one cell, every gallery item ranked by cosine similarity (ties by row): one query's lines a chunk,
    the similarities of :data:`BLOCK_ROWS` queries held at a time."""
    q, g = unit_rows(query), unit_rows(gallery)
    gid = np.array([f"g{j}" for j in range(len(g))])
    for start in range(0, len(q), BLOCK_ROWS):
        sims = q[start:start + BLOCK_ROWS] @ g.T
        order = np.argsort(-sims, axis=1, kind="stable")
        for at in range(len(sims)):
            i = start + at
            row = order[at][order[at] != i] if same_set else order[at]
            yield run_text([f"q{i}"], gid[row][None, :], sims[at, row][None, :], tag)


def cell_qrels(query_labels: np.ndarray, gallery_labels: np.ndarray, *, same_set: bool) -> Iterator[str]:
    """The label qrels of one cell (a query's relevant items: the gallery items of its class, itself left out
    closed-set), a chunk of :data:`BLOCK_ROWS` queries at a time."""
    ql, gl = np.asarray(query_labels), np.asarray(gallery_labels)
    gid = np.array([f"g{j}" for j in range(len(gl))])
    for start in range(0, len(ql), BLOCK_ROWS):
        judged: dict[str, dict[str, float]] = {}
        for i in range(start, min(start + BLOCK_ROWS, len(ql))):
            relevant = np.flatnonzero(gl == ql[i])
            if same_set:
                relevant = relevant[relevant != i]
            judged[f"q{i}"] = dict.fromkeys(gid[relevant].tolist(), 1.0)
        yield qrels_text(judged)


def cell_texts(query: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray, gallery_labels: np.ndarray, *,
               same_set: bool, tag: str) -> tuple[str, str]:
    """The run and the qrels of one cell as whole texts (:func:`cell_run`, :func:`cell_qrels` joined)."""
    return ("".join(cell_run(query, gallery, same_set=same_set, tag=tag)),
            "".join(cell_qrels(query_labels, gallery_labels, same_set=same_set)))


__all__ = ["cell_qrels", "cell_run", "cell_texts", "comparison_trec_files"]
