"""Batches for training: a seeded ``DataLoader`` over an ``ImageSet`` with optional augmentation.

Augmentations (option ``augment``):
* ``"none"``: images as stored (the default for ``digits``: 8x8 leaves no room to crop).
* ``"crop_flip"``: the CIFAR recipe, per image: zero-pad by size // 8 pixels (4 for 32x32), take a
  random crop of the original size, flip horizontally with probability 1/2.
Augmentation runs on whole batches in the main process with one seeded generator, so a run with
the same seed sees the same batches.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from engine.data.imageset import ImageSet

AUGMENTATIONS = ("none", "crop_flip")


def crop_flip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crop after zero padding by ``size // 8``, then a random horizontal flip, per image of (N, C, H, W)."""
    n, c, h, w = images.shape
    pad = max(1, min(h, w) // 8)
    padded = F.pad(images, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    rows = (dy[:, None] + torch.arange(h)).to(images.device)
    cols = (dx[:, None] + torch.arange(w)).to(images.device)
    batch = torch.arange(n, device=images.device)[:, None, None, None]
    channel = torch.arange(c, device=images.device)[None, :, None, None]
    out = padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]
    flip = (torch.rand(n, generator=generator) < 0.5).to(images.device)
    return torch.where(flip[:, None, None, None], out.flip(3), out)


class _Collate:
    """Stacks (image, label) pairs and applies the augmentation with the loader's own generator."""

    def __init__(self, augment: str, seed: int) -> None:
        self.augment = augment
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.stack([p[0] for p in pairs])
        labels = torch.stack([p[1] for p in pairs])
        return (crop_flip(images, self.generator) if self.augment == "crop_flip" else images), labels


def make_loader(images: ImageSet, *, batch_size: int = 128, shuffle: bool = True, augment: str = "none",
                seed: int = 0, drop_last: bool = False) -> DataLoader:
    """A single-process ``DataLoader`` of (images, labels) batches; order and augmentation seeded by ``seed``."""
    if augment not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {augment!r}; use one of {', '.join(AUGMENTATIONS)}")
    if augment == "crop_flip" and min(images.images.shape[-2:]) < 16:
        raise ValueError(f"crop_flip is meant for 32x32-like images, not {tuple(images.images.shape[-2:])}; use augment='none'")
    order = torch.Generator().manual_seed(seed)
    return DataLoader(images.as_dataset(), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                      generator=order, collate_fn=_Collate(augment, seed + 1))
