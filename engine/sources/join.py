"""Old and new embeddings of the same items, aligned by item id (each source read twice: ids, then vectors)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.sources.base import Source, check_unique_ids
from engine.sources.text import SourceError

EXAMPLES = 3


@dataclass(frozen=True)
class Joined:
    """Row i of ``old`` and of ``new`` embed the item ``ids[i]`` (in the old source's order)."""
    ids: np.ndarray
    old: np.ndarray
    new: np.ndarray
    labels: np.ndarray | None


def _examples(values: np.ndarray) -> str:
    shown = ", ".join(str(v) for v in values[:EXAMPLES])
    return f"e.g. {shown}" + (", ..." if len(values) > EXAMPLES else "")


def refuse_duplicates(ids: np.ndarray, source: Source) -> None:
    check_unique_ids(ids, where=source.description)


def _kind(ids: np.ndarray) -> str:
    return "text" if ids.dtype.kind == "U" else "integers"


class _Slots:
    """Where each id goes: its position in the old source's order (``IdSlots``: the public name)."""

    def __init__(self, ids: np.ndarray) -> None:
        self.order = np.argsort(ids, kind="stable")
        self.sorted = ids[self.order]

    def __call__(self, ids: np.ndarray, source: Source) -> np.ndarray:
        at = np.searchsorted(self.sorted, ids)
        at[at == len(self.sorted)] = 0
        found = len(self.sorted) > 0 and self.sorted[at] == ids if len(ids) else np.ones(0, bool)
        if not np.all(found):
            raise SourceError(f"{source.description} changed while it was read: "
                              f"id {ids[~np.asarray(found)][0]} was not there at first")
        return self.order[at]


IdSlots = _Slots


def check_same_ids(old_ids: np.ndarray, old: Source, new_ids: np.ndarray, new: Source) -> None:
    """One line when two sources' ids are not the same set: of two types, repeated, or how many are missing on each side."""
    if len(old_ids) and len(new_ids) and _kind(old_ids) != _kind(new_ids):
        raise SourceError(f"{old.description} has ids that are {_kind(old_ids)} but {new.description} has "
                          f"{_kind(new_ids)}; the same items need the same ids")
    refuse_duplicates(old_ids, old)
    refuse_duplicates(new_ids, new)
    only_old = old_ids[~np.isin(old_ids, new_ids)]
    only_new = new_ids[~np.isin(new_ids, old_ids)]
    if len(only_old) or len(only_new):
        parts = []
        if len(only_old):
            parts.append(f"{len(only_old)} of the {len(old_ids)} ids of {old.what} are missing from {new.what} "
                         f"({_examples(only_old)})")
        if len(only_new):
            parts.append(f"{len(only_new)} of the {len(new_ids)} ids of {new.what} are missing from {old.what} "
                         f"({_examples(only_new)})")
        raise SourceError(f"{old.description} and {new.description} do not embed the same items: "
                          + "; ".join(parts))


def join_by_id(old: Source, new: Source, *, block_rows: int = 65536, dtype: type = np.float32) -> Joined:
    """Both sources' vectors of the same items, aligned; one line when ids differ, repeat or labels disagree.

    Holds the two aligned arrays (``dtype``, float16 allowed) plus one block of each source.
    """
    old_ids, new_ids = old.ids(), new.ids()
    check_same_ids(old_ids, old, new_ids, new)
    slots = _Slots(old_ids)
    n = len(old_ids)
    arrays: dict[str, np.ndarray] = {}
    labels: dict[str, np.ndarray] = {}
    for side, source in (("old", old), ("new", new)):
        filled = np.zeros(n, bool)
        for block in source.blocks(block_rows):
            at = slots(block.ids, source)
            if side not in arrays:
                arrays[side] = np.zeros((n, block.vectors.shape[1]), dtype=dtype)
            if filled[at].any():
                raise SourceError(f"{source.description} changed while it was read: an id came twice")
            arrays[side][at] = block.vectors
            filled[at] = True
            if block.labels is not None:
                if side not in labels:  # text labels as objects until the end: a later block may hold longer ones
                    labels[side] = np.empty(n, dtype=object if block.labels.dtype.kind == "U" else block.labels.dtype)
                labels[side][at] = block.labels
        if not filled.all():
            raise SourceError(f"{source.description} changed while it was read: {int((~filled).sum())} items went")
        arrays.setdefault(side, np.zeros((n, source.dim or 0), dtype=dtype))
    labels = {side: (lab.astype(str) if lab.dtype == object else lab) for side, lab in labels.items()}
    if "old" in labels and "new" in labels:
        differ = labels["old"] != labels["new"]
        if np.any(differ):
            raise SourceError(f"{old.description} and {new.description} give {int(np.sum(differ))} items different "
                              f"labels ({_examples(old_ids[differ])})")
    return Joined(old_ids, arrays["old"], arrays["new"], labels.get("old", labels.get("new")))
