"""The dataset registry (a plain dict) and its one entry point, ``load_dataset``.

Options of ``load_dataset`` (all keyword):
* every dataset: ``root`` (default "data"), ``split`` ("train" | "test"), ``seed`` (0), ``mean`` and
  ``std`` (per-channel normalisation applied after loading; both or neither; see ``NORMALIZATION``);
* each dataset's own options, the keyword parameters of its loader (``make_digits``, ``make_shapes``,
  ``load_cifar``, ``load_imagefolder_split``); a name that is neither raises ``ValueError``;
* ``SHARED_OPTIONS`` (``per_class``, ``image_size``, ``download``): accepted by every dataset so one
  dataset config can drive any of them, and passed only to the loaders that have them (``per_class``:
  shapes, fashion; ``image_size``: imagefolder; ``download``: cifar10/cifar100, fashion). Digits (8x8),
  Fashion-MNIST (28x28), shapes and CIFAR (32x32) have a fixed size. To cap the images per class of recorded data use ``max_per_class``.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from engine.data.builtin import make_digits
from engine.data.disk import load_cifar, load_imagefolder_split
from engine.data.fashion import load_fashion
from engine.data.imageset import ImageSet
from engine.data.shapes import make_shapes

SHARED_OPTIONS = ("per_class", "image_size", "download")
_ALWAYS = ("root", "split", "seed")

# Per-channel (mean, std) of common training sets; CIFAR-100's are the ones the IAM-CL2R code uses.
NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}


@dataclass(frozen=True)
class DatasetSpec:
    """How to load a dataset (keyword-only loader), what it is, and its train-time augmentation."""

    load: Callable[..., ImageSet]
    summary: str
    train_augment: str  # an entry of engine.data.loaders.AUGMENTATIONS


DATASETS: dict[str, DatasetSpec] = {
    "digits": DatasetSpec(make_digits, "scikit-learn's bundled 8x8 handwritten digits: 10 classes, 1x8x8, no download", "none"),
    "shapes": DatasetSpec(make_shapes, "generated 32x32 RGB shapes, textures and colours: any number of classes (100 by default)", "crop_flip"),
    "cifar10": DatasetSpec(partial(load_cifar, "cifar10"), "CIFAR-10 from root/cifar-10-batches-py: 10 classes, 32x32 RGB", "crop_flip"),
    "cifar100": DatasetSpec(partial(load_cifar, "cifar100"), "CIFAR-100 from root/cifar-100-python: 100 classes, 32x32 RGB", "crop_flip"),
    "fashion": DatasetSpec(load_fashion, "Fashion-MNIST (Debian's dataset-fashion-mnist, or its IDX files under root): 10 classes, 1x28x28", "none"),
    "imagefolder": DatasetSpec(load_imagefolder_split, "an ImageFolder tree at root (class folders, or train/ and test/), resized to image_size", "crop_flip"),
}


def dataset_options(name: str) -> tuple[str, ...]:
    """The dataset's own option names (besides root, split, seed, mean, std)."""
    return tuple(p for p in inspect.signature(_spec(name).load).parameters if p not in _ALWAYS)


def load_dataset(name: str, *, root: str | Path = "data", split: str = "train", seed: int = 0,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None, **options) -> ImageSet:
    """Load ``split`` of dataset ``name`` into memory; see the module docstring for the options."""
    spec = _spec(name)
    own = dataset_options(name)
    unknown = sorted(k for k in options if k not in own and k not in SHARED_OPTIONS)
    if unknown:
        raise ValueError(f"dataset {name!r} has no option {', '.join(map(repr, unknown))}; its options are "
                         f"{', '.join(own) or 'none'} (plus root, split, seed, mean, std)")
    if (mean is None) != (std is None):
        raise ValueError("give mean and std together (per-channel normalisation), or neither")
    given = {"root": root, "split": split, "seed": seed, **options}
    accepted = inspect.signature(spec.load).parameters  # root/split/seed too, where the loader uses them
    images = spec.load(**{k: v for k, v in given.items() if k in accepted})
    return images if mean is None else images.normalized(mean, std)


def _spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
    return DATASETS[name]
