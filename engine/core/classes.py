"""Class lists of user models and the column alignment PSP/LSP need between two of them.

PSP/LSP (paper 000, Algorithm 1) compare the probability (or logit) vectors of two models
coordinate by coordinate, so output i of the query model must mean the same class as output i of
the gallery model. The paper's models are nested (model t's first C^k outputs are model k's
classes, in the same order) and keep "the first C^k outputs". Checkpoints from elsewhere need not
be nested, so for a cell (query model t, gallery model k) the engine realises that step as:

1. S = the classes of model k that model t also has, **in model k's order** (class names compared
   exactly; a model without a class list has outputs named ``"0" .. "C-1"``, which gives the paper's
   index-nested case).
2. Query side: model t's stored softmax (PSP) or logits (LSP), computed over *all* of t's outputs,
   is permuted so that its first |S| columns are S in k's order, and those |S| columns are kept.
3. Gallery side: model k's stored outputs restricted to S (the identity, keeping all C^k columns,
   whenever t knows all of k's classes).
4. Both are centred over the |S| kept entries and L2-normalised (``simplex_projection``).

When model t knows all of model k's classes this is exactly the paper's "first C^k outputs" after
re-ordering t's outputs into k's class order. When t lacks some of k's classes, the cell compares
the |S| shared classes only (softmaxes are not renormalised after the cut, as in the paper).
Models that share fewer than two classes cannot be compared this way and are refused.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def read_class_list(value: str | Sequence[str], *, what: str = "class list") -> tuple[str, ...]:
    """Class names from a list, a file (one name per line, blank lines skipped) or comma-separated text."""
    if isinstance(value, str):
        path = Path(value)
        if path.is_file():
            names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
            what = f"class list {path}"
        elif "," in value or not (path.suffix or "/" in value):
            names = [part.strip() for part in value.split(",")]
        else:
            raise ValueError(f"{what}: file {value} not found (give a file with one class per line, or comma-separated names)")
        names = [n for n in names if n]
    else:
        names = [str(n).strip() for n in value]
        if any(not n for n in names):
            raise ValueError(f"{what}: class names must not be empty")
    if not names:
        raise ValueError(f"{what} is empty")
    seen: set[str] = set()
    duplicates = sorted({n for n in names if n in seen or seen.add(n)})
    if duplicates:
        raise ValueError(f"{what} names a class more than once: {', '.join(duplicates[:5])}")
    return tuple(names)


def index_names(num_outputs: int) -> tuple[str, ...]:
    """The names of a model without a class list: its output indices."""
    return tuple(str(i) for i in range(num_outputs))


def aligned_columns(query_names: Sequence[str], gallery_names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(query columns, gallery columns)`` of the classes both models share, in the gallery model's order."""
    position = {name: i for i, name in enumerate(query_names)}
    pairs = [(position[name], j) for j, name in enumerate(gallery_names) if name in position]
    if not pairs:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    query_cols, gallery_cols = zip(*pairs)
    return np.asarray(query_cols, dtype=np.int64), np.asarray(gallery_cols, dtype=np.int64)
