"""The one in-memory representation every dataset loader returns and two index helpers (size bounds: ``bounds``).

Images are kept compact (uint8 pixels for decoded files) and become float32 one batch at a time
(``ImageSet.batch``), resized to a model's input size there when asked: nothing holds a whole
dataset as floats at a model's size.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from engine.data.bounds import check_batch_size
from engine.data.samples import SampleRefs

IndexLike = torch.Tensor | np.ndarray | Sequence[int]


class DatasetNotFoundError(ValueError):
    """The files of a dataset are not where the loader looks; the message says where to put them."""


def as_float(pixels: torch.Tensor) -> torch.Tensor:
    """float32 images: uint8 pixels scaled to [0, 1] (as ``ToTensor`` does), float32 returned as they are."""
    if pixels.dtype == torch.uint8:
        return pixels.float().div(255)
    if pixels.dtype != torch.float32:
        raise ValueError(f"images must be uint8 pixels or float32 values, got {pixels.dtype}")
    return pixels


def resized(images: torch.Tensor, size: int) -> torch.Tensor:
    """float images in [0, 1] resized to ``size`` x ``size`` (bilinear, antialiased), clamped to [0, 1]."""
    if images.shape[-2:] == (size, size):
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", antialias=True, align_corners=False).clamp_(0, 1)


@dataclass(frozen=True, eq=False, repr=False)
class ImageSet:
    """Images, integer labels and the names of the classes those labels index.

    ``images`` is (N, C, H, W): uint8 pixels (0..255, never normalised) or float32 in [0, 1] unless
    ``mean``/``std`` record a normalisation that was applied; ``batch`` gives float32 either way.
    ``labels`` is (N,) int64 with ``class_names[labels[i]]`` naming image i.
    Selecting classes keeps the labels as they are (no relabelling), so class ids stay the ids a
    scenario and a classifier use. ``refs`` (optional, one per image) say where each image comes from;
    selections keep them aligned.
    """

    images: torch.Tensor
    labels: torch.Tensor
    class_names: tuple[str, ...]
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    refs: SampleRefs | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "class_names", tuple(self.class_names))
        if self.images.dim() != 4 or self.images.dtype not in (torch.float32, torch.uint8):
            raise ValueError(f"images must be a (N, C, H, W) float32 or uint8 tensor, got {tuple(self.images.shape)} "
                             f"{self.images.dtype}")
        if self.labels.shape != (self.images.shape[0],) or self.labels.dtype != torch.int64:
            raise ValueError(f"labels must be a ({self.images.shape[0]},) int64 tensor, got {tuple(self.labels.shape)} {self.labels.dtype}")
        if len(self.labels) and not 0 <= int(self.labels.min()) <= int(self.labels.max()) < len(self.class_names):
            raise ValueError(f"labels must lie in 0..{len(self.class_names) - 1} to index class_names")
        if (self.mean is None) != (self.std is None):
            raise ValueError("mean and std must be given together or not at all")
        if self.mean is not None and self.images.dtype == torch.uint8:
            raise ValueError("uint8 images are raw pixels; normalise them with .normalized(), which makes them float32")
        if self.refs is not None and len(self.refs) != len(self.labels):
            raise ValueError(f"refs must hold one reference per image ({len(self.labels)}), got {len(self.refs)}")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __repr__(self) -> str:
        norm = "" if self.mean is None else ", normalised"
        return f"ImageSet({len(self)} images of {tuple(self.images.shape[1:])}, {self.num_classes} classes{norm})"

    @property
    def num_classes(self) -> int:
        """Length of ``class_names``; some of these classes may have no images after a selection."""
        return len(self.class_names)

    @property
    def image_size(self) -> int:
        """Side length of the stored images (they are square after loading)."""
        return int(self.images.shape[-1])

    def batch(self, indices: IndexLike | slice, *, size: int | None = None) -> torch.Tensor:
        """float32 images at ``indices`` (a slice or index list), resized to ``size`` when it differs.

        Resizing needs [0, 1] images: resize before normalising (``ImageSource`` in the checkpoint
        comparison does). Without ``size`` a float32 set gives exactly its stored values.
        """
        chosen = self.images[indices] if isinstance(indices, slice) else self.images[_index(indices)]
        images = as_float(chosen)
        if size is None or images.shape[-2:] == (size, size):
            return images
        if self.mean is not None:
            raise ValueError("these images are normalised; resize raw [0, 1] images (load them without mean/std)")
        return resized(images, size)

    def batches(self, batch_size: int, *, size: int | None = None) -> Iterator[torch.Tensor]:
        """``batch`` over consecutive chunks of ``batch_size`` images, in order."""
        check_batch_size(batch_size)
        for start in range(0, len(self), batch_size):
            yield self.batch(slice(start, start + batch_size), size=size)

    def subset(self, indices: IndexLike) -> ImageSet:
        """The images at ``indices``, in that order."""
        index = _index(indices)
        refs = None if self.refs is None else self.refs.take(index.numpy())
        return replace(self, images=self.images[index], labels=self.labels[index], refs=refs)

    def select_classes(self, classes: Sequence[int]) -> ImageSet:
        """Only the images whose label is in ``classes``, in their original order, labels unchanged."""
        wanted = sorted({int(c) for c in classes})
        if wanted and not 0 <= wanted[0] <= wanted[-1] < self.num_classes:
            raise ValueError(f"classes must lie in 0..{self.num_classes - 1}, got {wanted[0]}..{wanted[-1]}")
        keep = torch.isin(self.labels, torch.tensor(wanted, dtype=torch.int64))
        return self.subset(torch.nonzero(keep).flatten())

    def normalized(self, mean: Sequence[float], std: Sequence[float]) -> ImageSet:
        """Per-channel ``(x - mean) / std`` as float32; the statistics are recorded on the result."""
        if self.mean is not None:
            raise ValueError("these images are already normalised; normalise the raw [0, 1] images once")
        channels = self.images.shape[1]
        if len(mean) != channels or len(std) != channels:
            raise ValueError(f"mean and std need {channels} values (one per channel), got {len(mean)} and {len(std)}")
        m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        return replace(self, images=(as_float(self.images) - m) / s, mean=tuple(map(float, mean)), std=tuple(map(float, std)))

    def as_dataset(self) -> Dataset:
        """A torch ``Dataset`` of (float32 image, label) pairs; uint8 pixels are converted one image at a time."""
        if self.images.dtype == torch.float32:
            return TensorDataset(self.images, self.labels)
        return _PixelDataset(self.images, self.labels)


class _PixelDataset(Dataset):
    """(image, label) pairs over uint8 pixels, each image scaled to float32 [0, 1] when read."""

    def __init__(self, pixels: torch.Tensor, labels: torch.Tensor) -> None:
        self.pixels, self.labels = pixels, labels

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return as_float(self.pixels[i]), self.labels[i]


def _index(indices: IndexLike) -> torch.Tensor:
    """int64 positions from positions or a boolean mask."""
    index = np.asarray(indices)
    return torch.from_numpy(np.flatnonzero(index) if index.dtype == bool else index.astype(np.int64, copy=False))


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded per-class split: ``round(test_fraction * n_c)`` images of each class go to test.

    Each class is shuffled with its own generator (seed, class), so one class's split does not
    depend on the others. Returns sorted (train_indices, test_indices).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1 (exclusive), got {test_fraction}")
    train, test = [], []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        members = members[np.random.default_rng([seed, int(c)]).permutation(len(members))]
        n_test = int(round(test_fraction * len(members)))
        test.append(members[:n_test])
        train.append(members[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def first_per_class(labels: np.ndarray, per_class: int | None) -> np.ndarray:
    """Indices of the first ``per_class`` images of every class in file order (all when None)."""
    if per_class is None:
        return np.arange(len(labels))
    if per_class < 1:
        raise ValueError(f"images per class must be at least 1 (or None for all), got {per_class}")
    keep = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        keep[np.flatnonzero(labels == c)[:per_class]] = True
    return np.flatnonzero(keep)
