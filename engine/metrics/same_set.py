"""Queries that are the gallery, given without ``--same-set`` (numpy only).

When the query features are the gallery features row for row (same labels, identical rows), every query finds its
own image at distance 0: without ``same_set`` each self-test scores 100 % and the ECC verdicts flip. The choice made
here: **apply ``same_set`` automatically** (each query's own item excluded by index) and say so in one line, since
no evaluation wants a query to retrieve itself; a folder where only some steps' queries are their gallery is left as
given, with a one-line warning (nothing to infer safely there).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def queries_are_gallery(query: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray, gallery_labels: np.ndarray) -> bool:
    """The query set is the gallery: same length, same labels in the same order, and identical feature rows."""
    q, g = np.asarray(query), np.asarray(gallery)
    return (q.shape == g.shape and np.array_equal(np.asarray(query_labels), np.asarray(gallery_labels))
            and np.array_equal(q, g))


def resolve_same_set(sets: Sequence[Any], same_set: bool) -> tuple[bool, str | None]:
    """``(same_set to use, the line to print or None)`` for feature sets with ``query``/``query_labels``/``gallery``/
    ``gallery_labels`` (one per model): ``same_set`` turned on when every set's queries are its gallery."""
    if same_set or not sets:
        return same_set, None
    same = [queries_are_gallery(s.query, s.query_labels, s.gallery, s.gallery_labels) for s in sets]
    n = len(np.asarray(sets[0].query_labels))
    if all(same):
        return True, (f"the queries are the gallery ({n} identical rows): evaluated as --same-set (each query's own item "
                      "excluded), else every self-test would find its own image first and score 100 %")
    if any(same):
        steps = ", ".join(str(i + 1) for i, s in enumerate(same) if s)
        return False, (f"warning: in step(s) {steps} the queries are the gallery (identical rows) but not in the others; "
                       "evaluated as given: pass --same-set if every step's queries are its gallery")
    return False, None
