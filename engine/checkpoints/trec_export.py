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

import numpy as np

from engine.checkpoints.compare import _cells
from engine.checkpoints.comparison import Comparison
from engine.metrics.retrieval import unit_rows
from engine.results.trec import qrels_text, run_text

BLOCK_ROWS = 1024  # queries whose similarities to the whole gallery are held at once


def comparison_trec_files(cmp: Comparison) -> dict[str, str]:
    """File name -> text of every computed cell's run and qrels (module docstring)."""
    if cmp.spec.gallery_kind != "instance":
        raise ValueError("--export trec writes rankings of gallery items; a template gallery's items are class means "
                         "(use --gallery-kind instance)")
    files: dict[str, str] = {}
    for view, result in cmp.results.items():
        cell = _cells(view, cmp.outputs, cmp.split_labels, cmp.class_names, cmp.same_set)
        n = len(cmp.labels)
        for t in range(n):
            for k in range(t + 1):
                if not result.comparable[t, k]:
                    continue
                f = cell(t, k)
                stem = f"{view}_M{t + 1}_M{k + 1}"
                files[f"{stem}.run"], files[f"{stem}.qrels"] = cell_texts(
                    f.query, f.query_labels, f.gallery, f.gallery_labels, same_set=cmp.same_set, tag=stem)
    return files


def cell_texts(query: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray, gallery_labels: np.ndarray, *,
               same_set: bool, tag: str) -> tuple[str, str]:
    """The run (every gallery item ranked by cosine similarity, ties by row) and the label qrels of one cell; the
    similarities are held a block of :data:`BLOCK_ROWS` queries at a time."""
    q, g = unit_rows(query), unit_rows(gallery)
    ql, gl = np.asarray(query_labels), np.asarray(gallery_labels)
    gid = np.array([f"g{j}" for j in range(len(g))])
    qid = [f"q{i}" for i in range(len(q))]
    judged: dict[str, dict[str, float]] = {}
    runs = []
    for i in range(len(q)):
        if i % BLOCK_ROWS == 0:
            sims = q[i:i + BLOCK_ROWS] @ g.T
            order = np.argsort(-sims, axis=1, kind="stable")
        at = i % BLOCK_ROWS
        row = order[at][order[at] != i] if same_set else order[at]
        runs.append(run_text([qid[i]], gid[row][None, :], sims[at, row][None, :], tag))
        relevant = np.flatnonzero(gl == ql[i])
        if same_set:
            relevant = relevant[relevant != i]
        judged[qid[i]] = dict.fromkeys(gid[relevant].tolist(), 1.0)
    return "".join(runs), qrels_text(judged)


__all__ = ["cell_texts", "comparison_trec_files"]
