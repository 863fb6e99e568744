"""CIFAR-10/100 batch files read without running anything from them (torch-free, so thumbnails can read them).

The layout is torchvision's (``root/cifar-10-batches-py``, ``root/cifar-100-python``); ``FILES`` lists each split's
batches in the order the loader concatenates them, so an image's index in a loaded split names its batch and row.
"""
from __future__ import annotations

import pickle
from pathlib import Path

from engine.data.roots import data_roots
from engine.data.safe_open import open_regular

FILES = {
    "cifar10": ("cifar-10-batches-py", {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}),
    "cifar100": ("cifar-100-python", {"train": ("train",), "test": ("test",)}),
}


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

    The file is opened by ``engine.data.safe_open``: a regular file inside the data roots, checked after opening."""
    with open_regular(path, roots=data_roots(), what=f"{title} file") as handle:
        try:
            entry = CifarUnpickler(handle, encoding="latin1").load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
            raise ValueError(f"{title} file {path} could not be read ({' '.join(str(exc).split())[:200]}); delete it and "
                             "extract the archive again") from None
    if not isinstance(entry, dict):
        raise ValueError(f"{title} file {path} holds a {type(entry).__name__}, not a CIFAR batch; extract the archive again")
    return entry
