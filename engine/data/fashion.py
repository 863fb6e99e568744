"""``fashion``: Fashion-MNIST (Zalando), 70,000 real 28x28 grayscale product photos in 10 classes.

The four original IDX files (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each gzipped or not) are read with numpy
from the first of these folders that holds a split's two files:

1. ``root`` (the dataset config's root, "data" by default);
2. ``root/FashionMNIST/raw`` (where torchvision's ``FashionMNIST(download=True)`` puts them);
3. ``/usr/share/datasets/fashion-mnist`` (Debian's package ``dataset-fashion-mnist``, MIT licence).

Nothing is downloaded unless ``download=True`` and none of them has the files. Each header (magic
number, dimensions) is checked against the file's size before anything is allocated, and only
the images kept are copied: ``per_class`` / ``max_per_class`` keep the first images of each class
in file order (the smaller of the two when both are given), read in chunks up to the last one kept.
"""
from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torchvision.datasets import FashionMNIST

from engine.data.disk import DatasetNotFoundError
from engine.data.fashion_files import FILES, find_split, missing_message
from engine.data.roots import confine
from engine.data.imageset import ImageSet, first_per_class

CLASS_NAMES: tuple[str, ...] = tuple(FashionMNIST.classes)  # T-shirt/top, Trouser, ..., Ankle boot
SIZE = 28
IDX_UBYTE = 0x08  # IDX type code of unsigned bytes, the only one Fashion-MNIST uses
_CHUNK_ROWS = 4096  # images decoded per read


def load_fashion(*, root: str | Path = "data", split: str = "train", per_class: int | None = None,
                 max_per_class: int | None = None, download: bool = False) -> ImageSet:
    """One split of Fashion-MNIST: (N, 1, 28, 28) uint8 images, labels 0..9, names from the dataset.

    ``root`` must lie inside the data roots (``engine.data.roots``); Debian's folder is the fixed fallback.

    ``per_class`` (what a run config's train_per_class/test_per_class pass) and ``max_per_class``
    (the name the other real-data loaders use) both keep the first images of each class in file
    order; None keeps all 6,000 (train) or 1,000 (test) per class.
    """
    if split not in FILES:
        raise ValueError(f"fashion has splits 'train' and 'test', not {split!r}")
    caps = [c for c in (per_class, max_per_class) if c is not None]
    root = confine(root, what="Fashion-MNIST root")
    found = find_split(root, split)
    if found is None and download:
        _download(root, split)
        found = find_split(root, split)
    if found is None:
        raise DatasetNotFoundError(missing_message(root))
    images_path, labels_path = found
    labels = read_idx_labels(labels_path)
    keep = first_per_class(labels, min(caps) if caps else None)
    pixels = read_idx_images(images_path, keep, count=len(labels))
    return ImageSet(torch.from_numpy(pixels), torch.from_numpy(labels[keep]), CLASS_NAMES)  # uint8: float per batch


def read_idx_labels(path: Path) -> np.ndarray:
    """The labels of an IDX1 file as int64, checked to lie in 0..9."""
    with _open_idx(path, ndim=1) as (handle, dims):
        data = _read_exact(handle, dims[0], path)
    labels = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    if len(labels) and labels.max() >= len(CLASS_NAMES):
        raise ValueError(f"{path} holds label {int(labels.max())}, but Fashion-MNIST labels are 0..{len(CLASS_NAMES) - 1}")
    return labels


def read_idx_images(path: Path, keep: np.ndarray, *, count: int) -> np.ndarray:
    """Images ``keep`` (ascending indices) of an IDX3 file of ``count`` 28x28 images, as (len(keep), 1, 28, 28) uint8."""
    row = SIZE * SIZE
    with _open_idx(path, ndim=3) as (handle, dims):
        if dims != (count, SIZE, SIZE):
            raise ValueError(f"{path} holds images of shape {dims}, but ({count}, {SIZE}, {SIZE}) were expected "
                             f"({count} labels in the labels file, {SIZE}x{SIZE} pixels)")
        out = np.empty((len(keep), 1, SIZE, SIZE), dtype=np.uint8)
        end = int(keep[-1]) + 1 if len(keep) else 0
        done = 0
        for start in range(0, end, _CHUNK_ROWS):
            n = min(_CHUNK_ROWS, end - start)
            chunk = np.frombuffer(_read_exact(handle, n * row, path), dtype=np.uint8).reshape(n, 1, SIZE, SIZE)
            wanted = keep[done:np.searchsorted(keep, start + n)]
            out[done:done + len(wanted)] = chunk[wanted - start]
            done += len(wanted)
    return out


@contextmanager
def _open_idx(path: Path, *, ndim: int) -> Iterator[tuple[BinaryIO, tuple[int, ...]]]:
    """Open an IDX file (gzipped or not) positioned at its data, after checking its header against its size."""
    stored = _stored_size(path)
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as handle:
            head = _read_exact(handle, 4, path)
            if head[:3] != bytes([0, 0, IDX_UBYTE]) or head[3] != ndim:
                raise ValueError(f"{path} is not an IDX file of {ndim}-d unsigned bytes (magic number "
                                 f"0x{head.hex()}, expected 0x0000{IDX_UBYTE:02x}{ndim:02x})")
            dims = tuple(int(d) for d in np.frombuffer(_read_exact(handle, 4 * ndim, path), dtype=">u4"))
            declared = 4 + 4 * ndim + int(np.prod(dims, dtype=object))
            if (declared % 2**32 if path.suffix == ".gz" else declared) != stored:  # gzip records the size mod 2**32
                raise ValueError(f"{path} declares dimensions {dims} ({declared} bytes) but holds {stored} bytes: "
                                 f"the file is truncated or not Fashion-MNIST; fetch it again")
            yield handle, dims
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path} could not be read ({exc}); fetch it again") from None


def _stored_size(path: Path) -> int:
    """Bytes of the IDX content: the file size, or for .gz the size its trailer records (modulo 2**32)."""
    size = path.stat().st_size
    if path.suffix != ".gz":
        return size
    if size < 18:  # smallest gzip member: 10-byte header + 8-byte trailer
        raise ValueError(f"{path} is too short ({size} bytes) to be a gzip file; fetch it again")
    with open(path, "rb") as handle:
        handle.seek(-4, 2)
        return int.from_bytes(handle.read(4), "little")


def _read_exact(handle: BinaryIO, n: int, path: Path) -> bytes:
    data = handle.read(n)
    if len(data) != n:
        raise ValueError(f"{path} ends after {len(data)} of {n} expected bytes: the file is truncated; fetch it again")
    return data


def _download(root: str | Path, split: str) -> None:
    try:
        FashionMNIST(str(root), train=split == "train", download=True)
    except (OSError, RuntimeError) as exc:  # URLError is an OSError; torchvision raises RuntimeError on bad md5
        raise DatasetNotFoundError(f"Fashion-MNIST download into {root} failed ({exc}); "
                                   f"{missing_message(root).split(': ', 1)[1]}") from None
