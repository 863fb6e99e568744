"""The architectures a plain state_dict can be loaded into, by name, with their input defaults (torch-free).

The dashboard offers these names and shows their defaults; ``engine.checkpoints.archs`` builds each one
(``tests/test_checkpoints_archs.py`` checks both name the same architectures and the torchvision registry).
``input_size`` ``None`` means: the size of the evaluation images (32 px for an image folder); ``mean``/``std``
``None``: the images are given in [0, 1]; ``in_channels`` ``None``: read from the weights.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.vocab import BACKBONE_NAMES

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TORCHVISION_INPUT_SIZE = 224  # every torchvision classifier here is fed 224 px (ViT and MaxViT take only that)
# EfficientNet-Lite was trained with inception-style scaling, (x * 255 - 127) / 128 (TF edge models).
LITE_MEAN = (127.0 / 255.0,) * 3
LITE_STD = (128.0 / 255.0,) * 3
LITE_INPUT_SIZES = {0: 224, 1: 240, 2: 260, 3: 280, 4: 300}
# the project's own backbones (small_cnn, small_fc_cnn, *_cifar) come first in BACKBONE_NAMES; the rest are torchvision's
TORCHVISION_NAMES = tuple(n for n in BACKBONE_NAMES if n not in ("small_cnn", "small_fc_cnn") and not n.endswith("_cifar"))
PROJECT_ARCHS = ("small_cnn", "resnet18_cifar")  # project backbones whose state_dict can be read (with a linear head)


@dataclass(frozen=True)
class ArchInputs:
    """What an architecture's images look like by default."""

    input_size: int | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    in_channels: int | None = 3


ARCH_INPUTS: dict[str, ArchInputs] = {
    **{name: ArchInputs(TORCHVISION_INPUT_SIZE, IMAGENET_MEAN, IMAGENET_STD) for name in TORCHVISION_NAMES},
    **{name: ArchInputs(None, None, None, in_channels=None) for name in PROJECT_ARCHS},
    **{f"efficientnet_lite{i}": ArchInputs(size, LITE_MEAN, LITE_STD) for i, size in LITE_INPUT_SIZES.items()},
}
