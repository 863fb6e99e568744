"""Where Fashion-MNIST's four IDX files are looked for, and their images read with numpy (torch-free, so presets
and the app can ask).

The first folder holding a split's two files wins: ``root``, ``root/FashionMNIST/raw`` (torchvision's
download folder), then Debian's ``/usr/share/datasets/fashion-mnist`` (package ``dataset-fashion-mnist``).
Files are opened by ``storage.safe_open``: regular files inside the data roots (or Debian's folder) only.
"""
from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np

from engine.data.roots import data_roots
from storage.safe_open import open_regular

DEBIAN_ROOT = Path("/usr/share/datasets/fashion-mnist")
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
SIZE = 28
IDX_UBYTE = 0x08  # IDX type code of unsigned bytes, the only one Fashion-MNIST uses
_CHUNK_ROWS = 4096  # images decoded per read


def search_folders(root: str | Path) -> list[Path]:
    """The folders searched for the files, in order (see the module docstring)."""
    root = Path(root)
    return list(dict.fromkeys([root, root / "FashionMNIST" / "raw", DEBIAN_ROOT]))


def find_split(root: str | Path, split: str) -> tuple[Path, Path] | None:
    """(images, labels) paths of ``split`` in the first search folder that has both, else None."""
    for folder in search_folders(root):
        paths = [_file(folder, name) for name in FILES[split]]
        if all(paths):
            return paths[0], paths[1]
    return None


def fashion_available(root: str | Path = "data") -> bool:
    """Whether both splits can be read without a download."""
    return all(find_split(root, split) for split in FILES)


def missing_message(root: str | Path) -> str:
    """One line saying where the files were looked for and how to get them."""
    names = ", ".join(f"{n}[.gz]" for pair in FILES.values() for n in pair)
    return (f"Fashion-MNIST not found in {', '.join(map(str, search_folders(root)))}: run `apt-get install "
            f"dataset-fashion-mnist`, or put {names} under {root}, or set dataset.download = true")


def _file(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def read_idx_images(path: Path, keep: np.ndarray, *, count: int) -> np.ndarray:
    """Images ``keep`` (ascending indices) of an IDX3 file of ``count`` 28x28 images, as (len(keep), 1, 28, 28) uint8."""
    row = SIZE * SIZE
    with open_idx(path, ndim=3) as (handle, dims):
        if dims != (count, SIZE, SIZE):
            raise ValueError(f"{path} holds images of shape {dims}, but ({count}, {SIZE}, {SIZE}) were expected "
                             f"({count} labels in the labels file, {SIZE}x{SIZE} pixels)")
        out = np.empty((len(keep), 1, SIZE, SIZE), dtype=np.uint8)
        end = int(keep[-1]) + 1 if len(keep) else 0
        done = 0
        for start in range(0, end, _CHUNK_ROWS):
            n = min(_CHUNK_ROWS, end - start)
            chunk = np.frombuffer(read_exact(handle, n * row, path), dtype=np.uint8).reshape(n, 1, SIZE, SIZE)
            wanted = keep[done:np.searchsorted(keep, start + n)]
            out[done:done + len(wanted)] = chunk[wanted - start]
            done += len(wanted)
    return out


@contextmanager
def open_idx(path: Path, *, ndim: int) -> Iterator[tuple[BinaryIO, tuple[int, ...]]]:
    """Open an IDX file (gzipped or not) positioned at its data, after checking its header against its size."""
    stored = stored_size(path)
    try:
        with _open(path) as raw, (gzip.GzipFile(fileobj=raw, mode="rb") if path.suffix == ".gz" else raw) as handle:
            head = read_exact(handle, 4, path)
            if head[:3] != bytes([0, 0, IDX_UBYTE]) or head[3] != ndim:
                raise ValueError(f"{path} is not an IDX file of {ndim}-d unsigned bytes (magic number "
                                 f"0x{head.hex()}, expected 0x0000{IDX_UBYTE:02x}{ndim:02x})")
            dims = tuple(int(d) for d in np.frombuffer(read_exact(handle, 4 * ndim, path), dtype=">u4"))
            declared = 4 + 4 * ndim + int(np.prod(dims, dtype=object))
            if (declared % 2**32 if path.suffix == ".gz" else declared) != stored:  # gzip records the size mod 2**32
                raise ValueError(f"{path} declares dimensions {dims} ({declared} bytes) but holds {stored} bytes: "
                                 f"the file is truncated or not Fashion-MNIST; fetch it again")
            yield handle, dims
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path} could not be read ({exc}); fetch it again") from None


def _open(path: Path) -> BinaryIO:
    """``path`` opened by ``storage.safe_open`` (a regular file inside the data roots or Debian's folder)."""
    return open_regular(path, roots=(*data_roots(), DEBIAN_ROOT), what="Fashion-MNIST file")


def stored_size(path: Path) -> int:
    """Bytes of the IDX content: the file size, or for .gz the size its trailer records (modulo 2**32)."""
    with _open(path) as handle:
        size = handle.seek(0, 2)
        if path.suffix != ".gz":
            return size
        if size < 18:  # smallest gzip member: 10-byte header + 8-byte trailer
            raise ValueError(f"{path} is too short ({size} bytes) to be a gzip file; fetch it again")
        handle.seek(-4, 2)
        return int.from_bytes(handle.read(4), "little")


def read_exact(handle: BinaryIO, n: int, path: Path) -> bytes:
    """Exactly ``n`` bytes from ``handle``; ``ValueError`` naming ``path`` when the file ends first."""
    data = handle.read(n)
    if len(data) != n:
        raise ValueError(f"{path} ends after {len(data)} of {n} expected bytes: the file is truncated; fetch it again")
    return data
