"""``.npz`` / ``.npy`` files, read without pickle and streamed row by row from the file.

``.npz``: arrays ``ids`` (n,) integers or text, ``vectors`` (n, d) numbers, optional ``labels`` (n,); other
names through the options ``id=``, ``vector=``, ``label=`` (``label=`` empty: no labels). ``.npy``: one (n, d)
array of vectors; the ids are the row numbers 0..n-1 and there are no labels. Ids and labels are read whole
(8 bytes an item); the vectors a block at a time, from a compressed member too.
"""
from __future__ import annotations

import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

import numpy as np

from engine.sources.base import Raw, Source
from engine.sources.text import SourceError, SourceText, local_path
from storage.safe_open import UnsafeFileError, open_regular


def _header(handle: BinaryIO, *, where: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        version = np.lib.format.read_magic(handle)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(handle)
    except ValueError as exc:
        raise SourceError(f"{where} is not a .npy array ({exc})") from exc
    if dtype.hasobject or dtype.kind not in "fiuUSb":
        raise SourceError(f"{where} holds {dtype} values (objects are never unpickled)")
    if fortran and len(shape) > 1:
        raise SourceError(f"{where} is stored in Fortran order; save it with np.save(np.ascontiguousarray(a))")
    return shape, dtype


def _read_exact(handle: BinaryIO, size: int, *, where: str) -> bytes:
    data = handle.read(size)
    if len(data) != size:
        raise SourceError(f"{where} ends early: {len(data)} of {size} bytes")
    return data


def _whole(handle: BinaryIO, *, where: str) -> np.ndarray:
    shape, dtype = _header(handle, where=where)
    count = int(np.prod(shape))
    return np.frombuffer(_read_exact(handle, count * dtype.itemsize, where=where), dtype=dtype).reshape(shape)


class ArraySource(Source):
    def __init__(self, text: SourceText, *, what: str, expect_dim: int | None) -> None:
        self.path = local_path(text.location, what=what)
        super().__init__(text, what=what, expect_dim=expect_dim)
        self.npz = text.kind == "npz"
        self.vector_name = text.option("vector", "vectors")
        self.id_name = text.option("id", "ids")
        self.label_name = text.option("label")
        with self._open_vectors() as handle:
            shape, _ = _header(handle, where=self._member_text())
        if len(shape) != 2:
            raise SourceError(f"{self.description}: the vectors array has shape {shape}, not (items, dimensions)")
        self.count = shape[0]
        self._check_dim(shape[1])

    def _member_text(self) -> str:
        return f"{self.description} array {self.vector_name!r}" if self.npz else self.description

    def _open_file(self) -> BinaryIO:
        try:
            return open_regular(self.path, roots=None, what=self.what)
        except (OSError, UnsafeFileError) as exc:
            raise SourceError(f"{self.description} cannot be read: {exc.strerror or exc}"
                              if isinstance(exc, OSError) else str(exc)) from exc

    @contextmanager
    def _open_member(self, name: str, *, required: bool) -> Iterator[BinaryIO | None]:
        with self._open_file() as handle:
            try:
                archive = zipfile.ZipFile(handle)
            except zipfile.BadZipFile as exc:
                raise SourceError(f"{self.description} is not a .npz archive") from exc
            with archive:
                if f"{name}.npy" not in archive.namelist():
                    if required:
                        names = [n[:-4] for n in archive.namelist() if n.endswith(".npy")]
                        raise SourceError(f"{self.description} has no array {name!r} "
                                          f"(arrays: {', '.join(names) or 'none'})")
                    yield None
                    return
                with archive.open(f"{name}.npy") as member:
                    yield member

    @contextmanager
    def _open_vectors(self) -> Iterator[BinaryIO]:
        if not self.npz:
            with self._open_file() as handle:
                yield handle
            return
        with self._open_member(self.vector_name, required=True) as member:
            yield member

    def _small(self, name: str, *, required: bool) -> np.ndarray | None:
        with self._open_member(name, required=required) as member:
            if member is None:
                return None
            arr = _whole(member, where=f"{self.description} array {name!r}")
        if arr.shape != (self.count,):
            raise SourceError(f"{self.description}: array {name!r} has shape {arr.shape}, not ({self.count},)")
        return arr

    def ids(self) -> np.ndarray:
        if not self.npz:
            return np.arange(self.count, dtype=np.int64)
        from engine.sources.base import as_ids

        return as_ids(self._small(self.id_name, required=True), where=self.description)

    def _raw(self, block_rows: int) -> Iterator[Raw]:
        ids = self.ids()
        labels = None
        if self.npz and self.label_name != "":
            labels = self._small(self.label_name or "labels", required=self.label_name is not None)
        with self._open_vectors() as handle:
            shape, dtype = _header(handle, where=self._member_text())
            row_bytes = shape[1] * dtype.itemsize
            for start in range(0, shape[0], block_rows):
                rows = min(block_rows, shape[0] - start)
                data = _read_exact(handle, rows * row_bytes, where=self._member_text())
                yield (ids[start:start + rows], np.frombuffer(data, dtype=dtype).reshape(rows, shape[1]),
                       None if labels is None else labels[start:start + rows])
