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

from pathlib import Path

import numpy as np
import torch
from torchvision.datasets import FashionMNIST

from engine.data.disk import DatasetNotFoundError
from engine.data.fashion_files import FILES, find_split, missing_message, open_idx, read_exact, read_idx_images
from engine.data.roots import confine
from engine.data.imageset import ImageSet, first_per_class
from engine.data.samples import dataset_refs

CLASS_NAMES: tuple[str, ...] = tuple(FashionMNIST.classes)  # T-shirt/top, Trouser, ..., Ankle boot


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
    refs = dataset_refs({"dataset": "fashion", "split": split, "root": str(root)}, keep)
    return ImageSet(torch.from_numpy(pixels), torch.from_numpy(labels[keep]), CLASS_NAMES, refs=refs)  # uint8: float per batch


def read_idx_labels(path: Path) -> np.ndarray:
    """The labels of an IDX1 file as int64, checked to lie in 0..9."""
    with open_idx(path, ndim=1) as (handle, dims):
        data = read_exact(handle, dims[0], path)
    labels = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    if len(labels) and labels.max() >= len(CLASS_NAMES):
        raise ValueError(f"{path} holds label {int(labels.max())}, but Fashion-MNIST labels are 0..{len(CLASS_NAMES) - 1}")
    return labels


def _download(root: str | Path, split: str) -> None:
    try:
        FashionMNIST(str(root), train=split == "train", download=True)
    except (OSError, RuntimeError) as exc:  # URLError is an OSError; torchvision raises RuntimeError on bad md5
        raise DatasetNotFoundError(f"Fashion-MNIST download into {root} failed ({exc}); "
                                   f"{missing_message(root).split(': ', 1)[1]}") from None
