"""``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes), no download.

(The other built-in dataset, ``shapes``, is generated in ``engine.data.shapes``.)
"""
from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits

from engine.data.imageset import ImageSet, first_per_class, stratified_split
from engine.data.samples import dataset_refs

DIGITS_TEST_FRACTION = 0.3


def make_digits(*, split: str = "train", seed: int = 0, test_fraction: float = DIGITS_TEST_FRACTION,
                max_per_class: int | None = None) -> ImageSet:
    """One side of a seeded stratified split: (N, 1, 8, 8) float32 in [0, 1], labels 0..9.

    ``test_fraction`` of each class (rounded) goes to "test", the rest to "train"; the same ``seed``
    and ``test_fraction`` always give the same two disjoint sides. ``max_per_class`` keeps the first
    images of each class of the chosen side (None keeps all, about 125 train / 54 test per class).
    """
    if split not in ("train", "test"):
        raise ValueError(f"digits has splits 'train' and 'test', not {split!r}")
    bunch = load_digits()
    labels = bunch.target.astype(np.int64)
    train, test = stratified_split(labels, test_fraction, seed)
    chosen = train if split == "train" else test
    chosen = chosen[first_per_class(labels[chosen], max_per_class)]
    images = (bunch.images[chosen] / 16.0).astype(np.float32)[:, None]
    return ImageSet(torch.from_numpy(images), torch.from_numpy(labels[chosen]), tuple(str(d) for d in range(10)),
                    refs=dataset_refs({"dataset": "digits"}, chosen))
