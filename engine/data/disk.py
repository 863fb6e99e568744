"""Datasets read from disk: CIFAR-10/100 in torchvision's layout and any ImageFolder tree.

Every root is confined to the data roots (``engine.data.roots.confine``) before it is looked at, and no
error lists what a folder holds. CIFAR batches are unpickled by ``engine.data.cifar_files.CifarUnpickler``, which
only rebuilds dicts, lists, strings, numbers and numpy arrays (nothing in the file can run code).
Nothing is downloaded unless ``download=True``. Each loader reads the chosen split into memory as an
``ImageSet`` (CIFAR: float32 in [0, 1]; image folders: uint8 pixels, decoded in chunks); CIFAR-10's
train split takes 50,000 x 3 x 32 x 32 x 4 bytes = 614 MB, so ``max_per_class`` is there to load less
(``max_per_class=300`` on CIFAR-100 train is the CIFAR100R of IAM-CL2R: the first 300 images of each class
in file order).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torchvision.datasets import CIFAR10, CIFAR100
from torchvision.datasets.folder import find_classes

from engine.data.folder import list_image_folder
from engine.data.bounds import check_image_size
from engine.data.imageset import DatasetNotFoundError, ImageSet, first_per_class, stratified_split
from engine.data.roots import confine
from engine.data.cifar_files import FILES as CIFAR_FILES
from engine.data.cifar_files import batch_rows, read_batch
from engine.data.samples import dataset_refs

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
CIFAR_KINDS = {"cifar10": (CIFAR10, "CIFAR-10"), "cifar100": (CIFAR100, "CIFAR-100")}
IMAGEFOLDER_TEST_FRACTION = 0.3


def load_cifar(name: str, *, root: str | Path = "data", split: str = "train", max_per_class: int | None = None,
               download: bool = False) -> ImageSet:
    """CIFAR-10 or CIFAR-100 (``name``) from ``root/cifar-10-batches-py`` or ``root/cifar-100-python``.

    The files are the ones torchvision's ``CIFAR10``/``CIFAR100`` list (pickled batches, the
    dataset's own format), read by a restricted unpickler that admits only what those batches hold.
    Their presence is checked, not their md5 sums: torchvision checks those when ``download=True``
    fetches the archive. ``max_per_class`` keeps the first images of each class.
    """
    if name not in CIFAR_KINDS:
        raise ValueError(f"unknown CIFAR dataset {name!r}; use one of {', '.join(CIFAR_KINDS)}")
    if split not in ("train", "test"):
        raise ValueError(f"CIFAR has splits 'train' and 'test', not {split!r}")
    kind, title = CIFAR_KINDS[name]
    root = confine(root, what=f"{title} root")
    if download:
        kind(str(root), train=split == "train", download=True)
    folder_name, splits = CIFAR_FILES[name]
    folder = root / folder_name
    batches = [folder / file for file in splits[split]]
    meta = folder / kind.meta["filename"]
    missing = [str(p.relative_to(root)) for p in [*batches, meta] if not p.is_file()]
    if missing:
        raise DatasetNotFoundError(
            f"{title} not found under {root} (missing {', '.join(missing)}): download {kind.filename} from "
            f"{CIFAR_URL} and extract it into {root}, or pass download=True")
    data, labels = [], []
    for path in batches:
        rows, found = batch_rows(read_batch(path, title), path, title)  # checked before anything converts them
        data.append(rows)
        labels.extend(found)
    pixels = np.concatenate(data)
    if pixels.ndim != 2 or pixels.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{title} batches in {folder} hold rows of shape {pixels.shape[1:]}, not 3072 values (3x32x32); "
                         f"extract {kind.filename} again")
    targets = np.asarray(labels, dtype=np.int64)
    keep = first_per_class(targets, max_per_class)
    images = torch.from_numpy(pixels[keep].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0)
    refs = dataset_refs({"dataset": name, "split": split, "root": str(root)}, keep)
    return ImageSet(images, torch.from_numpy(targets[keep]), tuple(read_batch(meta, title)[kind.meta["key"]]), refs=refs)


def load_imagefolder(root: str | Path, *, image_size: int = 32, max_per_class: int | None = None) -> ImageSet:
    """Every image of one ImageFolder tree (``root/<class>/<image>``) as uint8 pixels (see ``engine.data.folder``).

    Images are converted to RGB, resized (shorter side) and centre-cropped to ``image_size``;
    classes are the sorted folder names, as torchvision numbers them.
    """
    folder = list_image_folder(confine(root, what="image folder"), layout="put one sub-folder of images per class there")
    return folder.load(check_image_size(image_size), first_per_class(folder.labels.numpy(), max_per_class))


def load_imagefolder_split(*, root: str | Path, split: str = "train", seed: int = 0, image_size: int | None = None,
                           test_fraction: float = IMAGEFOLDER_TEST_FRACTION, max_per_class: int | None = None) -> ImageSet:
    """One split of the ImageFolder tree at ``root`` (``image_size`` None means 32), as uint8 pixels.

    If ``root/train`` exists the splits are folders: "train" is ``root/train`` and "test" is
    ``root/test`` (or ``root/val``), and both must hold the same class folders. Otherwise ``root``
    holds the class folders and a seeded stratified split sends ``test_fraction`` of each class to
    "test".
    """
    if split not in ("train", "test"):
        raise ValueError(f"imagefolder has splits 'train' and 'test', not {split!r}")
    size = check_image_size(image_size or 32, "image_size")
    root = confine(root, what="image folder")
    layout = "put one sub-folder of images per class there, or train/ and test/ (or val/) folders that each hold them"
    if not (root / "train").is_dir():
        folder = list_image_folder(root, layout=layout)
        targets = folder.labels.numpy()
        train, test = stratified_split(targets, test_fraction, seed)
        chosen = train if split == "train" else test
        return folder.load(size, chosen[first_per_class(targets[chosen], max_per_class)])
    test_dirs = [root / name for name in ("test", "val") if (root / name).is_dir()]
    if not test_dirs:
        raise DatasetNotFoundError(f"{root} has a train/ folder but no test/ or val/ folder next to it: {layout}")
    train_dir, test_dir = root / "train", test_dirs[0]
    train_classes, test_classes = find_classes(str(train_dir))[0], find_classes(str(test_dir))[0]
    if train_classes != test_classes:
        raise ValueError(f"{train_dir} and {test_dir} hold different class folders ({len(train_classes)} and "
                         f"{len(test_classes)}, {len(set(train_classes) ^ set(test_classes))} in only one of them), so "
                         f"their labels would not match; give every class a folder in both")
    return load_imagefolder(train_dir if split == "train" else test_dir, image_size=size, max_per_class=max_per_class)
