"""Built-in datasets that need no download: ``digits`` (scikit-learn's 8x8 digits) and ``shapes``."""
from __future__ import annotations

import numpy as np
import torch

from engine.data.imageset import ImageSet, stratified_split
from engine.data.shapes import make_shapes


def make_digits(*, split: str = "train", seed: int = 0, test_fraction: float = 0.3) -> ImageSet:
    """scikit-learn's bundled digits as 1x8x8 images in [0, 1], with a seeded stratified train/test split."""
    from sklearn.datasets import load_digits

    if split not in ("train", "test"):
        raise ValueError(f"digits has splits 'train' and 'test', not {split!r}")
    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[:, None]
    labels = bunch.target.astype(np.int64)
    train, test = stratified_split(labels, test_fraction, seed)
    idx = train if split == "train" else test
    return ImageSet(torch.from_numpy(images[idx]), torch.from_numpy(labels[idx]), tuple(str(d) for d in range(10)))


def load_shapes(*, split: str = "train", seed: int = 0, num_classes: int = 100, per_class: int = 100,
                first_class: int = 0) -> ImageSet:
    """``shapes`` classes ``first_class ..``; "train" and "test" are independent draws of the same classes."""
    if split not in ("train", "test"):
        raise ValueError(f"shapes has splits 'train' and 'test', not {split!r}")
    return make_shapes(num_classes=num_classes, per_class=per_class, split=split, seed=seed, first_class=first_class)
