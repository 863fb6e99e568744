"""``.npz`` / ``.npy`` files, read without pickle and streamed row by row from the file.

``.npz``: arrays ``ids`` (n,) integers or text, ``vectors`` (n, d) numbers, optional ``labels`` (n,); other
names through the options ``id=``, ``vector=``, ``label=`` (``label=`` empty: no labels). ``.npy``: one (n, d)
array of vectors; the ids are the row numbers 0..n-1 and there are no labels. Ids and labels are read whole
(8 bytes an item); the vectors a block at a time, from a compressed member too.

Sizes are checked from the headers before anything is allocated: an id or label is at most
:data:`MAX_TEXT_CHARS` characters of text or 8 bytes; an array must be as large as its member says (a stored member
or a ``.npy`` file at least its declared bytes, and a ``.npy`` file not sparse); and a compressed member may inflate at
most :data:`MAX_INFLATION` times its compressed size (real embeddings compress about 1.1x; a few MB of zeros that
declare gigabytes is refused before it is read).
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


MAX_TEXT_CHARS = 256  # an id or a label as text
MAX_INFLATION = 100  # a compressed member's declared bytes over its compressed bytes (deflate reaches about 1,030)


def declared_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=object)) * dtype.itemsize


def check_declared(need: int, *, on_disk: int, compressed: int | None, where: str) -> None:
    """An array of ``need`` bytes must be there: at least ``need`` bytes on disk (a stored member, a file), or a
    compressed member of at most :data:`MAX_INFLATION` x its compressed size; one line otherwise, nothing read."""
    if compressed is None and need > on_disk:
        raise SourceError(f"{where} declares {need:,} bytes but holds {on_disk:,}")
    if compressed is not None and need > MAX_INFLATION * max(compressed, 1):
        raise SourceError(f"{where} declares {need:,} bytes from {compressed:,} compressed bytes (more than "
                          f"{MAX_INFLATION}x: a decompression bomb, or not an array of real values); not read")


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


def _whole(handle: BinaryIO, *, where: str, shape_wanted: tuple[int, ...], on_disk: int,
           compressed: int | None) -> np.ndarray:
    """An ids or labels array read whole, after its header is checked: the shape wanted, an item of at most
    :data:`MAX_TEXT_CHARS` characters or 8 bytes, the bytes there (:func:`check_declared`)."""
    shape, dtype = _header(handle, where=where)
    if shape != shape_wanted:
        raise SourceError(f"{where} has shape {shape}, not {shape_wanted}")
    limit = MAX_TEXT_CHARS * (4 if dtype.kind == "U" else 1) if dtype.kind in "US" else 8
    if dtype.itemsize > limit:
        raise SourceError(f"{where} holds items of {dtype} ({dtype.itemsize:,} bytes each); an id or label is at most "
                          f"{MAX_TEXT_CHARS} characters or 8 bytes")
    need = declared_bytes(shape, dtype)
    check_declared(need, on_disk=on_disk, compressed=compressed, where=where)
    return np.frombuffer(_read_exact(handle, need, where=where), dtype=dtype).reshape(shape)


class ArraySource(Source):
    def __init__(self, text: SourceText, *, what: str, expect_dim: int | None) -> None:
        self.path = local_path(text.location, what=what)
        super().__init__(text, what=what, expect_dim=expect_dim)
        self.npz = text.kind == "npz"
        self.vector_name = text.option("vector", "vectors")
        self.id_name = text.option("id", "ids")
        self.label_name = text.option("label")
        with self._open_vectors() as handle:
            shape, dtype = _header(handle, where=self._member_text())
        if len(shape) != 2:
            raise SourceError(f"{self.description}: the vectors array has shape {shape}, not (items, dimensions)")
        on_disk, compressed = self._sizes(self.vector_name)
        check_declared(declared_bytes(shape, dtype), on_disk=on_disk, compressed=compressed, where=self._member_text())
        self.count = shape[0]
        self._check_dim(shape[1])

    def _sizes(self, name: str) -> tuple[int, int | None]:
        """(bytes, compressed bytes or None when stored) of member ``name`` or of the ``.npy`` file; a ``.npy`` with
        fewer blocks allocated than its size (sparse, or on a compressing filesystem) counts as compressed into them."""
        if not self.npz:
            st = self.path.stat()
            allocated = 512 * getattr(st, "st_blocks", 0) if hasattr(st, "st_blocks") else st.st_size
            return st.st_size, (allocated if allocated < st.st_size else None)
        with self._open_file() as handle:
            try:
                info = zipfile.ZipFile(handle).getinfo(f"{name}.npy")
            except (zipfile.BadZipFile, KeyError):
                return 0, None  # opening the member says what is wrong
        return info.file_size, (info.compress_size if info.compress_type != zipfile.ZIP_STORED else None)

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
        on_disk, compressed = self._sizes(name)
        with self._open_member(name, required=required) as member:
            if member is None:
                return None
            return _whole(member, where=f"{self.description} array {name!r}", shape_wanted=(self.count,),
                          on_disk=on_disk, compressed=compressed)

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
