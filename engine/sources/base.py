"""What every reader yields: blocks of (ids, float32 vectors, labels or None), checked and cut to size."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from engine.sources.text import SourceError, SourceText

Raw = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]


@dataclass(frozen=True)
class Block:
    """``ids`` (n,), ``vectors`` (n, d) float32 finite, ``labels`` (n,) or None."""
    ids: np.ndarray
    vectors: np.ndarray
    labels: np.ndarray | None

    def __len__(self) -> int:
        return len(self.ids)


def as_ids(values: np.ndarray, *, where: str) -> np.ndarray:
    """Ids as int64 when they are integers, as text otherwise; a missing id is refused."""
    arr = np.asarray(values)
    if arr.dtype == object:
        if any(v is None for v in arr):
            raise SourceError(f"{where} has an item without an id")
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in arr):
            return arr.astype(np.int64)
        return arr.astype(str)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=True)  # a copy: a view could pin a reader's whole batch in memory
    if arr.dtype.kind in "US":
        return arr.astype(str)
    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
        return arr.astype(np.int64)
    raise SourceError(f"{where} has ids of type {arr.dtype} (integers or text are read)")


def as_labels(values: np.ndarray | None) -> np.ndarray | None:
    if values is None:
        return None
    arr = np.array(values)  # a copy, as for ids
    if arr.dtype == object:
        arr = arr.astype(np.int64) if all(isinstance(v, (int, np.integer)) for v in arr) else arr.astype(str)
    return arr


class Source:
    """A read-only store of embeddings; subclasses yield raw blocks, :meth:`blocks` checks and sizes them."""

    def __init__(self, text: SourceText, *, what: str, dim: int | None = None, count: int | None = None,
                 expect_dim: int | None = None) -> None:
        self.text, self.what, self.count = text, what, count
        self.expect_dim = expect_dim
        self.dim = dim
        if dim is not None:
            self._check_dim(dim)

    @property
    def description(self) -> str:
        """``what`` and the masked source text, as messages name it."""
        return f"{self.what} {self.text.masked()}"

    def _raw(self, block_rows: int) -> Iterator[Raw]:
        raise NotImplementedError

    def _check_dim(self, dim: int) -> None:
        if self.expect_dim is not None and dim != self.expect_dim:
            raise SourceError(f"{self.description} holds {dim}-d vectors, not the {self.expect_dim}-d expected")
        if self.dim is not None and dim != self.dim:
            raise SourceError(f"{self.description} holds vectors of {self.dim} and of {dim} dimensions (ragged)")
        self.dim = dim

    def blocks(self, block_rows: int = 65536) -> Iterator[Block]:
        """Blocks of exactly ``block_rows`` items (the last one fewer), checked: one dimension, finite values."""
        if block_rows < 1:
            raise SourceError(f"block_rows must be at least 1, not {block_rows}")
        pending: list[Block] = []
        held, seen = 0, 0
        for ids, vectors, labels in self._raw(block_rows):
            block = self._checked(ids, vectors, labels, seen)
            seen += len(block)
            pending.append(block)
            held += len(block)
            while held >= block_rows:
                out, pending, held = _cut(pending, block_rows)
                yield out
        if held:
            yield _concat(pending)

    def _checked(self, ids, vectors, labels, seen: int) -> Block:
        ids = as_ids(ids, where=self.description)
        vectors = np.asarray(vectors)
        if vectors.ndim != 2:
            raise SourceError(f"{self.description}: the vectors are not a table of numbers (shape {vectors.shape})")
        if vectors.dtype.kind not in "fiu":
            raise SourceError(f"{self.description}: the vectors hold {vectors.dtype} values, not numbers")
        if len(ids) != len(vectors) or (labels is not None and len(labels) != len(ids)):
            raise SourceError(f"{self.description}: {len(ids)} ids, {len(vectors)} vectors and "
                              f"{'no' if labels is None else len(labels)} labels do not match")
        if len(ids):
            self._check_dim(vectors.shape[1])
        vectors = vectors.astype(np.float32, copy=False)
        finite = np.isfinite(vectors).all(axis=1)
        if not finite.all():
            bad = int(np.flatnonzero(~finite)[0])
            raise SourceError(f"{self.description}: item {ids[bad]} (row {seen + bad}) has a NaN or infinite value; "
                              f"{int((~finite).sum())} such items in this block")
        return Block(ids, vectors, as_labels(labels))

    def ids(self) -> np.ndarray:
        """Every item's id in reading order (vectors are read and dropped block by block)."""
        parts = [b.ids for b in self.blocks()]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def close(self) -> None:
        """Releases what the reader holds open (a connection, a file)."""


def _concat(blocks: list[Block]) -> Block:
    if len(blocks) == 1:
        return blocks[0]
    labels = None if blocks[0].labels is None else np.concatenate([b.labels for b in blocks])
    return Block(np.concatenate([b.ids for b in blocks]), np.concatenate([b.vectors for b in blocks]), labels)


def _cut(blocks: list[Block], rows: int) -> tuple[Block, list[Block], int]:
    """The first ``rows`` items as one block, and the rest."""
    whole = _concat(blocks)
    head = Block(whole.ids[:rows], whole.vectors[:rows], None if whole.labels is None else whole.labels[:rows])
    rest = Block(whole.ids[rows:], whole.vectors[rows:], None if whole.labels is None else whole.labels[rows:])
    return head, ([rest] if len(rest) else []), len(rest)
