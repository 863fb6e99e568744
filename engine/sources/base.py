"""What every reader yields: blocks of (ids, float32 vectors, labels or None), checked and cut to size."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from engine.core.fingerprint import METADATA_KEY, Fingerprint
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


EXACT_FLOAT = 2 ** 53  # a float id beyond this is not an exact integer (1e19 and 1e19 + 1 are one float)
INT64_MAX = np.iinfo(np.int64).max


def as_ids(values: np.ndarray, *, where: str) -> np.ndarray:
    """Ids as int64 when they are integers, as text otherwise, under one rule for every reader: no missing id, one
    type per source (integers or text, never both), integers exact (an unsigned id above 2^63 - 1, a float id beyond
    2^53 or with a fraction is refused: two such ids could become one item). Uniqueness is :func:`check_unique_ids`'s."""
    arr = np.asarray(values)
    if arr.dtype == object:
        missing = sum(v is None or (isinstance(v, float) and v != v) for v in arr)
        if missing:
            raise SourceError(f"{where} has {missing} items without an id")
        ints = [isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in arr]
        if all(ints):
            big = sum(not -INT64_MAX - 1 <= int(v) <= INT64_MAX for v in arr)
            if big:
                raise SourceError(f"{where} has {big} integer ids beyond 64 bits; ids must be exact")
            return arr.astype(np.int64)
        if any(ints):
            raise SourceError(f"{where} has ids of two types ({sum(ints)} integers, {len(ints) - sum(ints)} others); "
                              "one type per source")
        if not all(isinstance(v, str) for v in arr):
            raise SourceError(f"{where} has ids that are neither integers nor text")
        return arr.astype(str)
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > INT64_MAX:
        raise SourceError(f"{where} has {int(np.sum(arr > INT64_MAX))} unsigned ids above 2^63 - 1; ids must be exact "
                          "in 64-bit integers")
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=True)  # a copy: a view could pin a reader's whole batch in memory
    if arr.dtype.kind in "US":
        return arr.astype(str)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise SourceError(f"{where} has {int(np.sum(~np.isfinite(arr)))} items without an id (NaN or infinite)")
        inexact = (arr != np.round(arr)) | (np.abs(arr) > EXACT_FLOAT)
        if np.any(inexact):
            raise SourceError(f"{where} has {int(inexact.sum())} float ids that are not exact integers (a fraction, or "
                              "beyond 2^53); store ids as integers or text")
        return arr.astype(np.int64)
    raise SourceError(f"{where} has ids of type {arr.dtype} (integers or text are read)")


def join_ids(parts: list[np.ndarray], *, where: str) -> np.ndarray:
    """The ids of a source's blocks, concatenated: one type for the whole source (a row group of text ids after one of
    integers is refused, never turned into text)."""
    if not parts:
        return np.zeros(0, np.int64)
    kinds = {"text" if p.dtype.kind == "U" else "integers" for p in parts if len(p)}
    if len(kinds) > 1:
        raise SourceError(f"{where} has ids of two types (integers in some blocks, text in others); one type per source")
    return np.concatenate(parts)


def check_unique_ids(ids: np.ndarray, *, where: str) -> None:
    """Each item once: one line with the count and a few examples when an id repeats (within a file, across row
    groups, files of a dataset or blocks)."""
    unique, counts = np.unique(ids, return_counts=True)
    if len(unique) != len(ids):
        dup = unique[counts > 1]
        shown = ", ".join(str(v) for v in dup[:3]) + (", ..." if len(dup) > 3 else "")
        raise SourceError(f"{where} has {len(dup)} ids that occur more than once (e.g. {shown}); each item must have "
                          "one vector")


def as_labels(values: np.ndarray | None, *, where: str = "the source") -> np.ndarray | None:
    """Labels as int64 or text; a missing label (null, NaN) is refused in one line with the count."""
    if values is None:
        return None
    arr = np.array(values)  # a copy, as for ids
    if arr.dtype == object:
        missing = sum(v is None or (isinstance(v, float) and v != v) for v in arr)
        if missing:
            raise SourceError(f"{where} has {missing} items without a label (null)")
        arr = arr.astype(np.int64) if all(isinstance(v, (int, np.integer)) for v in arr) else arr.astype(str)
    elif arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise SourceError(f"{where} has {int(np.sum(~np.isfinite(arr)))} items without a label (null or NaN)")
    return arr


class Source:
    """A read-only store of embeddings; subclasses yield raw blocks, :meth:`blocks` checks and sizes them."""

    def __init__(self, text: SourceText, *, what: str, dim: int | None = None, count: int | None = None,
                 expect_dim: int | None = None) -> None:
        self.text, self.what, self.count = text, what, count
        self.id_kind: str | None = None  # integers or text, from the first block read: one type per source
        self.expect_dim = expect_dim
        self.dim = dim
        # the model fingerprints the store carries (engine.core.fingerprint.METADATA_KEY): one entry per file or
        # table, (name, rows or None, Fingerprint or None); :attr:`fingerprint` is their one fingerprint, if one
        self.fingerprint_parts: list[tuple[str, int | None, Fingerprint | None]] = []
        if dim is not None:
            self._check_dim(dim)

    @property
    def fingerprint(self) -> Fingerprint | None:
        """The fingerprint every part of the store carries; None when a part carries none or parts differ."""
        found = {fp for _, _, fp in self.fingerprint_parts}
        return found.pop() if len(found) == 1 else None

    def _note_fingerprint(self, part: str, rows: int | None, metadata: dict | None) -> None:
        """Record the fingerprint of one file or table from its schema's key-value ``metadata`` (one line when the
        value is not a fingerprint)."""
        raw = (metadata or {}).get(METADATA_KEY.encode()) or (metadata or {}).get(METADATA_KEY)
        fp = None
        if raw is not None:
            try:
                fp = Fingerprint.from_text(raw, where=f"{self.description}: {part}'s {METADATA_KEY} metadata")
            except ValueError as exc:
                raise SourceError(str(exc)) from None
        self.fingerprint_parts.append((part, rows, fp))

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

    def _raw_from(self, lo: int, block_rows: int) -> tuple[int, Iterator[Raw]]:
        """Raw batches starting at a row at or before ``lo``, and that row's number; a reader that can skip (Parquet's
        row groups) overrides it, the others read from the first row."""
        return 0, self._raw(block_rows)

    def rows(self, lo: int, hi: int, block_rows: int = 65536) -> Iterator[Block]:
        """The items ``lo`` to ``hi - 1`` of the reading order, in blocks of at most ``block_rows``, checked as
        :meth:`blocks` (a partition of the gallery that a fan-out task reads by itself)."""
        if block_rows < 1 or not 0 <= lo <= hi:
            raise SourceError(f"rows {lo} to {hi} in blocks of {block_rows} is not a range of {self.description}")
        seen, raw = self._raw_from(lo, block_rows)
        for ids, vectors, labels in raw:
            if seen >= hi:
                break
            block = self._checked(ids, vectors, labels, seen)
            start, stop = max(lo - seen, 0), min(hi - seen, len(block))
            seen += len(block)
            for at in range(start, stop, block_rows):
                end = min(at + block_rows, stop)
                yield Block(block.ids[at:end], block.vectors[at:end],
                            None if block.labels is None else block.labels[at:end])

    def _checked(self, ids, vectors, labels, seen: int) -> Block:
        ids = as_ids(ids, where=self.description)
        kind = "text" if ids.dtype.kind == "U" else "integers"
        if len(ids) and self.id_kind not in (None, kind):
            raise SourceError(f"{self.description} has ids of two types ({self.id_kind} first, then {kind} at row "
                              f"{seen}); one type per source")
        self.id_kind = self.id_kind or (kind if len(ids) else None)
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
        return Block(ids, vectors, as_labels(labels, where=self.description))

    def ids(self) -> np.ndarray:
        """Every item's id in reading order (vectors are read and dropped block by block)."""
        return join_ids([b.ids for b in self.blocks()], where=self.description)

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
