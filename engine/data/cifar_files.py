"""CIFAR-10/100 batch files read without running anything from them (torch-free, so thumbnails can read them).

The layout is torchvision's (``root/cifar-10-batches-py``, ``root/cifar-100-python``); ``FILES`` lists each split's
batches in the order the loader concatenates them, so an image's index in a loaded split names its batch and row.

Reads are bounded: a batch file is read through a reader that stops after ``MAX_BATCH_BYTES`` (whatever the file
claims to be), and :func:`batch_rows` accepts only what a real batch holds (a uint8 array of 3,072-value rows and one
int label per row) before anything converts it, so a small file cannot make a reader build or walk a huge object.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from engine.data.roots import data_roots
from storage.safe_open import open_regular

FILES = {
    "cifar10": ("cifar-10-batches-py", {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}),
    "cifar100": ("cifar-100-python", {"train": ("train",), "test": ("test",)}),
}
MAX_BATCH_BYTES = 200_000_000  # CIFAR-100's train file, the largest, is 158 MB
ROW_VALUES = 3 * 32 * 32


class _Bounded:
    """A binary file's ``read``/``readline`` that refuse to go past ``limit`` bytes (what the unpickler calls)."""

    def __init__(self, handle: object, limit: int, path: Path) -> None:
        self.handle, self.left, self.path = handle, limit, path

    def _count(self, data: bytes) -> bytes:
        self.left -= len(data)
        if self.left < 0:
            raise ValueError(f"it is over {MAX_BATCH_BYTES:,} bytes, larger than any CIFAR batch")
        return data

    def read(self, n: int = -1) -> bytes:
        return self._count(self.handle.read(self.left + 1 if n is None or n < 0 else min(n, self.left + 1)))

    def readline(self, n: int = -1) -> bytes:
        return self._count(self.handle.readline(self.left + 1 if n is None or n < 0 else min(n, self.left + 1)))


class CifarUnpickler(pickle.Unpickler):
    """Unpickles what a CIFAR batch holds (dicts, lists, str/bytes, numbers, numpy arrays) and refuses any other global."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}  # encode: bytes in protocol 2

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"it would call {module}.{name}, which a CIFAR batch never holds; nothing "
                                         "from it was run")
        return super().find_class(module, name)


def read_batch(path: Path, title: str) -> dict:
    """The dict of one CIFAR batch file, read by :class:`CifarUnpickler`; ``ValueError`` naming the file otherwise.

    The file is opened by ``storage.safe_open``: a regular file inside the data roots, checked after opening."""
    with open_regular(path, roots=data_roots(), what=f"{title} file") as handle:
        try:
            entry = CifarUnpickler(_Bounded(handle, MAX_BATCH_BYTES, path), encoding="latin1").load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
            raise ValueError(f"{title} file {path} could not be read ({' '.join(str(exc).split())[:200]}); delete it and "
                             "extract the archive again") from None
    if not isinstance(entry, dict):
        raise ValueError(f"{title} file {path} holds a {type(entry).__name__}, not a CIFAR batch; extract the archive again")
    return entry


def batch_rows(entry: dict, path: Path, title: str, *, labels: bool = True) -> tuple[np.ndarray, list[int]]:
    """``(pixels, labels)`` of a batch read by :func:`read_batch`: its ``data`` a uint8 array of 3,072-value rows
    and, with ``labels``, one int per row (``labels`` or ``fine_labels``); ``ValueError`` naming the file otherwise."""
    data = entry.get("data")
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == ROW_VALUES):
        shape = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise ValueError(f"{title} file {path} holds data of {shape}, not rows of {ROW_VALUES} uint8 values (3x32x32); "
                         "extract the archive again")
    if not labels:
        return data, []
    found = entry.get("labels", entry.get("fine_labels"))
    if not (isinstance(found, list) and len(found) == len(data) and all(type(v) is int for v in found)):
        held = f"a list of {len(found)}" if isinstance(found, list) else f"a {type(found).__name__}"
        raise ValueError(f"{title} file {path} holds labels that are not one int per image ({held} for {len(data)} "
                         "images); extract the archive again")
    return data, found
