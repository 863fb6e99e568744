"""Datasets, evaluation protocols and class-incremental scenarios.

Public API: ``ImageSet``, ``DATASETS``, ``load_dataset``, ``make_digits``, ``make_shapes``,
``DatasetNotFoundError``, ``Scenario``, ``Step``, ``build_scenario``, ``select_replay``.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from engine.data.builtin import load_shapes, make_digits
from engine.data.disk import DatasetNotFoundError, load_cifar, load_imagefolder
from engine.data.imageset import ImageSet, stratified_split
from engine.data.scenario import Scenario, Step, build_scenario, select_replay
from engine.data.shapes import make_shapes


def _cifar(name: str) -> Callable[..., ImageSet]:
    return lambda *, root="data", split="train", download=False, **_: load_cifar(name, root=root, split=split, download=download)


def _imagefolder(*, root="data", split="train", image_size=32, seed=0, **_) -> ImageSet:
    """``root/train`` and ``root/test`` (or ``root/val``) when present, else a seeded 70/30 split of ``root``."""
    root = Path(root)
    for name in ((split,) if split == "train" else ("test", "val")):
        if (root / name).is_dir():
            return load_imagefolder(root / name, image_size=image_size)
    images = load_imagefolder(root, image_size=image_size)
    train, test = stratified_split(images.labels.numpy(), 0.3, seed)
    return images.subset(train if split == "train" else test)


DATASETS: dict[str, Callable[..., ImageSet]] = {
    "digits": lambda *, split="train", seed=0, **_: make_digits(split=split, seed=seed),
    "shapes": lambda *, split="train", seed=0, num_classes=100, per_class=100, first_class=0, **_: load_shapes(
        split=split, seed=seed, num_classes=num_classes, per_class=per_class, first_class=first_class),
    "cifar10": _cifar("cifar10"),
    "cifar100": _cifar("cifar100"),
    "imagefolder": _imagefolder,
}


def load_dataset(name: str, **options) -> ImageSet:
    """Load a dataset by registry name (``root``, ``split``, ``seed`` and per-dataset options)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
    return DATASETS[name](**options)


__all__ = ["ImageSet", "DATASETS", "load_dataset", "make_digits", "make_shapes", "DatasetNotFoundError",
           "Scenario", "Step", "build_scenario", "select_replay"]
