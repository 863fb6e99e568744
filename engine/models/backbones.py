"""Feature extractors ("backbones") that map images to penultimate feature vectors.

Every backbone returns a flat ``(batch, feature_dim)`` tensor; classification lives in the heads.
``build_backbone`` is the single entry point and ``BACKBONES`` the registry of names it knows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torchvision
from torch import nn


class SmallCNN(nn.Module):
    """Three 3x3 conv blocks and global average pooling: a fast CPU backbone for demos and tests.

    Works on any input of at least 2x2 pixels (e.g. 1x8x8 digits, 3x32x32 images);
    the output dimension is ``width``.
    """

    def __init__(self, in_channels: int = 3, width: int = 64) -> None:
        super().__init__()
        hidden = max(width // 2, 8)
        self.layers = nn.Sequential(
            _conv_bn_relu(in_channels, hidden),
            _conv_bn_relu(hidden, hidden),
            nn.MaxPool2d(2),
            _conv_bn_relu(hidden, width),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.out_dim = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _conv_bn_relu(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


def resnet18_cifar(in_channels: int = 3) -> nn.Module:
    """ResNet-18 for 32x32 inputs: 3x3 stride-1 stem, no max-pool, classifier removed (512-d output).

    Built from torchvision's ResNet-18 so parameter names match torchvision checkpoints
    except for the stem convolution.
    """
    model = torchvision.models.resnet18(weights=None)
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    model.fc = nn.Identity()
    return model


@dataclass(frozen=True)
class TorchvisionArch:
    """Where a torchvision classifier's final Linear sits, and the width of what it receives.

    ``input_size`` is set when the architecture only accepts one image size (ViT, MaxViT).
    """

    classifier: str
    feature_dim: int
    input_size: int | None = None


TORCHVISION_ARCHS: dict[str, TorchvisionArch] = {
    "resnet18": TorchvisionArch("fc", 512),
    "resnet34": TorchvisionArch("fc", 512),
    "resnet50": TorchvisionArch("fc", 2048),
    "resnet101": TorchvisionArch("fc", 2048),
    "resnet152": TorchvisionArch("fc", 2048),
    "alexnet": TorchvisionArch("classifier.6", 4096),
    "vgg16": TorchvisionArch("classifier.6", 4096),
    "regnet_x_3_2gf": TorchvisionArch("fc", 1008),
    "regnet_y_400mf": TorchvisionArch("fc", 440),
    "densenet121": TorchvisionArch("classifier", 1024),
    "efficientnet_b0": TorchvisionArch("classifier.1", 1280),
    "efficientnet_b3": TorchvisionArch("classifier.1", 1536),
    "mobilenet_v3_small": TorchvisionArch("classifier.3", 1024),
    "convnext_tiny": TorchvisionArch("classifier.2", 768),
    "swin_t": TorchvisionArch("head", 768),
    "maxvit_t": TorchvisionArch("classifier.5", 512, input_size=224),
    "vit_b_32": TorchvisionArch("heads.head", 768, input_size=224),
    "vit_b_16": TorchvisionArch("heads.head", 768, input_size=224),
    "vit_l_16": TorchvisionArch("heads.head", 1024, input_size=224),
}


def torchvision_backbone(name: str) -> nn.Module:
    """A randomly initialised torchvision model whose final classifier Linear is an identity.

    Never downloads weights (``weights=None``); load trained weights through a checkpoint.
    """
    arch = TORCHVISION_ARCHS[name]
    model = torchvision.models.get_model(name, weights=None)
    classifier = model.get_submodule(arch.classifier)
    if not isinstance(classifier, nn.Linear) or classifier.in_features != arch.feature_dim:
        raise RuntimeError(
            f"torchvision {name!r}: expected a Linear with {arch.feature_dim} inputs at {arch.classifier!r}, "
            f"found {classifier}; update TORCHVISION_ARCHS for this torchvision version"
        )
    model.set_submodule(arch.classifier, nn.Identity())
    return model


@dataclass(frozen=True)
class BackboneEntry:
    """How to build one backbone and the dimension of its output (``None``: set by ``width``)."""

    build: Callable[..., nn.Module]
    feature_dim: int | None
    accepts_in_channels: bool
    accepts_width: bool
    input_size: int | None = None


def _torchvision_entry(name: str) -> BackboneEntry:
    arch = TORCHVISION_ARCHS[name]
    return BackboneEntry(
        build=lambda: torchvision_backbone(name),
        feature_dim=arch.feature_dim,
        accepts_in_channels=False,
        accepts_width=False,
        input_size=arch.input_size,
    )


DEFAULT_SMALL_CNN_WIDTH = 64

BACKBONES: dict[str, BackboneEntry] = {
    "small_cnn": BackboneEntry(build=SmallCNN, feature_dim=None, accepts_in_channels=True, accepts_width=True),
    "resnet18_cifar": BackboneEntry(build=resnet18_cifar, feature_dim=512, accepts_in_channels=True, accepts_width=False),
    **{name: _torchvision_entry(name) for name in TORCHVISION_ARCHS},
}


def build_backbone(name: str, *, in_channels: int = 3, width: int | None = None) -> tuple[nn.Module, int]:
    """Build the backbone registered as ``name``; return ``(module, feature_dim)``.

    ``width`` sets the output dimension of ``small_cnn`` (default 64) and is rejected elsewhere.
    torchvision architectures take 3-channel images only.
    """
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; known backbones: {', '.join(sorted(BACKBONES))}")
    entry = BACKBONES[name]
    if in_channels < 1:
        raise ValueError(f"in_channels must be positive, got {in_channels}")
    if width is not None and not entry.accepts_width:
        raise ValueError(f"backbone {name!r} has a fixed {entry.feature_dim}-d output; 'width' applies to small_cnn only")
    if not entry.accepts_in_channels and in_channels != 3:
        raise ValueError(
            f"backbone {name!r} takes 3-channel images but in_channels={in_channels}; "
            "repeat grayscale images to 3 channels in the data transform"
        )
    if entry.accepts_width:
        width = DEFAULT_SMALL_CNN_WIDTH if width is None else width
        if width < 1:
            raise ValueError(f"width must be positive, got {width}")
        return entry.build(in_channels=in_channels, width=width), width
    if entry.accepts_in_channels:
        return entry.build(in_channels=in_channels), entry.feature_dim
    return entry.build(), entry.feature_dim


class Projection(nn.Module):
    """Bias-free linear map from the backbone output to the chosen feature size (iamcl2r's ``fc1``)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)
