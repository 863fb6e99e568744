"""Real datasets from disk: CIFAR-10/100 in torchvision's layout and any ImageFolder tree.

Nothing is downloaded unless ``download=True``; a missing dataset raises
:class:`DatasetNotFoundError` with one sentence saying where the files go.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.data.imageset import ImageSet

CIFAR_SOURCES = {
    "cifar10": ("CIFAR-10", "cifar-10-batches-py", "cifar-10-python.tar.gz"),
    "cifar100": ("CIFAR-100", "cifar-100-python", "cifar-100-python.tar.gz"),
}


class DatasetNotFoundError(ValueError):
    """A dataset that is not on disk; the message says where to put it."""


def load_cifar(name: str, *, root: str | Path = "data", split: str = "train", download: bool = False) -> ImageSet:
    """CIFAR-10 or CIFAR-100 (torchvision's on-disk format) as 3x32x32 images in [0, 1].

    The batches are read by torchvision, whose format is Python pickle: only point this at files
    from the official archive.
    """
    from torchvision.datasets import CIFAR10, CIFAR100

    if name not in CIFAR_SOURCES:
        raise ValueError(f"unknown CIFAR dataset {name!r}; use 'cifar10' or 'cifar100'")
    if split not in ("train", "test"):
        raise ValueError(f"CIFAR has splits 'train' and 'test', not {split!r}")
    title, folder, archive = CIFAR_SOURCES[name]
    root = Path(root)
    if not download and not (root / folder).is_dir():
        raise DatasetNotFoundError(
            f"{title} not found: expected the folder {root / folder}; download {archive} from "
            f"https://www.cs.toronto.edu/~kriz/cifar.html and extract it into {root}, or allow downloading")
    cls = CIFAR10 if name == "cifar10" else CIFAR100
    try:
        ds = cls(str(root), train=split == "train", download=download)
    except RuntimeError as exc:  # torchvision: "Dataset not found or corrupted"
        raise DatasetNotFoundError(f"{title} under {root / folder} is missing or corrupted ({exc})") from None
    images = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2).float().div_(255.0)
    return ImageSet(images.contiguous(), torch.as_tensor(ds.targets, dtype=torch.int64), tuple(ds.classes))


def load_imagefolder(root: str | Path, *, image_size: int = 32, max_per_class: int | None = None) -> ImageSet:
    """An ImageFolder tree (``root/<class>/<image>``), resized to ``image_size`` and loaded into memory."""
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    root = Path(root)
    if not root.is_dir():
        raise DatasetNotFoundError(f"image folder {root} not found: put one sub-folder of images per class there")
    try:
        ds = ImageFolder(str(root), transform=transforms.Compose([
            transforms.Resize(image_size), transforms.CenterCrop(image_size), transforms.ToTensor()]))
    except (FileNotFoundError, RuntimeError) as exc:
        raise DatasetNotFoundError(f"image folder {root} has no usable images: {exc}") from None
    counts: dict[int, int] = {}
    images, labels = [], []
    for path, label in ds.samples:
        if max_per_class is not None and counts.get(label, 0) >= max_per_class:
            continue
        counts[label] = counts.get(label, 0) + 1
        img = ds.loader(path)
        images.append(ds.transform(img.convert("RGB")))
        labels.append(label)
    return ImageSet(torch.stack(images).float(), torch.tensor(labels, dtype=torch.int64), tuple(ds.classes))
