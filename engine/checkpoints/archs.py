"""Architectures a plain state_dict can be loaded into: how to build each one (names and input defaults:
``engine.checkpoints.arch_table``).

``ARCHITECTURES`` maps a name to a builder of the *whole classifier* (randomly initialised, never
downloading anything), the dotted path of its final ``Linear`` and its preprocessing defaults:

* every torchvision name of ``engine.models.TORCHVISION_ARCHS`` (``fc.weight`` etc., as torchvision
  saves them; ImageNet mean/std, 224 px);
* the project's own backbones (``small_cnn``, ``resnet18_cifar``) with a linear head, keyed as
  ``Net.state_dict()`` writes them (``backbone.*``, optional ``projection.linear.weight``,
  ``head.fc.weight``); width, input channels, projection and bias are read from the backbone's
  tensor shapes, never from the head's, so a wrong head is reported as the layer that is wrong;
* ``efficientnet_lite0`` ... ``efficientnet_lite4`` from the PyPI package ``efficientnet-lite-pytorch``
  (built with ``EfficientNet.from_name``, never ``from_pretrained``, which would reach for a URL).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from engine.checkpoints.arch_table import ARCH_INPUTS, LITE_INPUT_SIZES, PROJECT_ARCHS
from engine.models import TORCHVISION_ARCHS, build_model

LITE_PACKAGE = "efficientnet-lite-pytorch==0.1.0"

Builder = Callable[[int, Mapping[str, torch.Tensor]], nn.Module]


@dataclass(frozen=True)
class Architecture:
    """How to build a classifier with ``num_classes`` outputs and read its parts.

    ``build(num_classes, tensors)`` may look at the tensor shapes (project backbones do).
    ``classifier`` is the dotted path of the final Linear; for project networks (``project=True``)
    the built module is already a ``Net`` returning features and logits. ``input_size`` ``None``
    means: the size of the evaluation images (32 px for an image folder).
    """

    build: Builder
    classifier: str
    input_size: int | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    in_channels: int | None = 3
    project: bool = False


def _entry(name: str, build: Builder, classifier: str, *, project: bool = False) -> Architecture:
    """``name``'s builder and classifier with its input defaults from ``ARCH_INPUTS``."""
    inputs = ARCH_INPUTS[name]
    return Architecture(build=build, classifier=classifier, input_size=inputs.input_size, mean=inputs.mean,
                        std=inputs.std, in_channels=inputs.in_channels, project=project)


def _torchvision(name: str) -> Architecture:
    import torchvision

    return _entry(name, lambda n, _t: torchvision.models.get_model(name, weights=None, num_classes=n),
                  TORCHVISION_ARCHS[name].classifier)


# Where the first convolution of each project backbone keeps its weight (gives the input channels).
_PROJECT_STEMS = {"small_cnn": "backbone.layers.0.0.weight", "resnet18_cifar": "backbone.conv1.weight"}
_SMALL_CNN_LAST = "backbone.layers.3.0.weight"  # its output channels are small_cnn's width


def _project(backbone: str) -> Architecture:
    def build(num_classes: int, tensors: Mapping[str, torch.Tensor]) -> nn.Module:
        stem, last = tensors.get(_PROJECT_STEMS[backbone]), tensors.get(_SMALL_CNN_LAST)
        projection = tensors.get("projection.linear.weight")
        return build_model(
            backbone=backbone, head="linear", num_classes=num_classes,
            feature_dim=int(projection.shape[0]) if projection is not None and projection.ndim == 2 else None,
            in_channels=int(stem.shape[1]) if stem is not None and stem.ndim == 4 else 3,
            width=int(last.shape[0]) if backbone == "small_cnn" and last is not None and last.ndim == 4 else None,
            linear_bias="head.fc.bias" in tensors,
        )

    return _entry(backbone, build, "head.fc", project=True)


def _lite(index: int) -> Architecture:
    def build(num_classes: int, _tensors: Mapping[str, torch.Tensor]) -> nn.Module:
        try:
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError:
            raise ValueError(f"architecture efficientnet_lite{index} needs the package {LITE_PACKAGE}; "
                             f"install it with pip install {LITE_PACKAGE}") from None
        return EfficientNet.from_name(f"efficientnet-lite{index}", num_classes=num_classes)

    return _entry(f"efficientnet_lite{index}", build, "_fc")


ARCHITECTURES: dict[str, Architecture] = {
    **{name: _torchvision(name) for name in TORCHVISION_ARCHS},
    **{name: _project(name) for name in PROJECT_ARCHS},
    **{f"efficientnet_lite{i}": _lite(i) for i in LITE_INPUT_SIZES},
}
