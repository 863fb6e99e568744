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
from torch.nn import functional as F


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


class SmallFcCNN(nn.Module):
    """Two 3x3 conv blocks (16, 32 channels), each followed by 2x2 max-pooling, the 7 x 7 grid and a fully
    connected layer of ``width`` outputs with ReLU (LeNet's layout with batch norm): a CPU backbone with the capacity
    to fit its training images, which ``small_cnn`` lacks (issue 38: 99.7-100 % of 4-9 Fashion-MNIST classes' 600
    training images each in 30 epochs, where ``small_cnn`` of width 32 reaches 72-80 %).

    The pooled grid is averaged to 7 x 7 (a 28 x 28 image's own; 32 x 32 images give 8 x 8), so any input of at
    least 4 x 4 pixels works; the output dimension is ``width``.
    """

    def __init__(self, in_channels: int = 3, width: int = 128) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            _conv_bn_relu(in_channels, 16), nn.MaxPool2d(2),
            _conv_bn_relu(16, 32), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(7), nn.Flatten(),
            nn.Linear(32 * 7 * 7, width), nn.ReLU(inplace=True),
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


class _BasicBlockA(nn.Module):
    """He et al.'s CIFAR basic block; a stride-2 / widening block uses the parameter-free "option A" shortcut
    (subsample by 2, pad the new channels with zeros)."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(planes),
            nn.ReLU(inplace=True),
            nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(planes),
        )
        self.stride, self.extra = stride, planes - in_planes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x[:, :, :: self.stride, :: self.stride] if self.stride > 1 else x
        if self.extra:
            shortcut = F.pad(shortcut, (0, 0, 0, 0, 0, self.extra))
        return F.relu(self.body(x) + shortcut)


class ResNet32Cifar(nn.Module):
    """ResNet-32 for 32x32 images (He et al. 2016, Sec. 4.2): a 3x3 stem and 3 stages of 5 basic blocks with
    16/32/64 channels, global average pooling; 64-d output (paper 001 Tab. I, "RN32", compared methods' 64-d
    features; paper 002 Sec. 5.5 counts 0.46M parameters with the classifier)."""

    def __init__(self, in_channels: int = 3, blocks_per_stage: int = 5) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_channels, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                                   nn.ReLU(inplace=True)]
        in_planes = 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(blocks_per_stage):
                layers.append(_BasicBlockA(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.layers = nn.Sequential(*layers)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class _PreActSEBlock(nn.Module):
    """Pre-activation basic block with squeeze-and-excitation (reduction 16), as kuangliu/pytorch-cifar's SENet."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.bn1, self.bn2 = nn.BatchNorm2d(in_planes), nn.BatchNorm2d(planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.shortcut = (nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)
                         if stride != 1 or in_planes != planes else None)
        self.fc1 = nn.Conv2d(planes, planes // 16, kernel_size=1)
        self.fc2 = nn.Conv2d(planes // 16, planes, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))
        shortcut = x if self.shortcut is None else self.shortcut(out)
        out = self.conv2(F.relu(self.bn2(self.conv1(out))))
        weight = torch.sigmoid(self.fc2(F.relu(self.fc1(out.mean(dim=(2, 3), keepdim=True)))))
        return out * weight + shortcut


class SENet18Cifar(nn.Module):
    """SENet-18 adapted to 32x32 images, the backbone of paper 002's CIFAR-100/10 protocol (Sec. 5.1), which points to
    kuangliu/pytorch-cifar: a 3x3 stem, 4 stages of 2 pre-activation SE blocks (64/128/256/512 channels), global
    average pooling; 512-d output."""

    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_channels, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64),
                                   nn.ReLU(inplace=True)]
        in_planes = 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            for i in range(2):
                layers.append(_PreActSEBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


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
    "small_fc_cnn": BackboneEntry(build=SmallFcCNN, feature_dim=None, accepts_in_channels=True, accepts_width=True),
    "resnet18_cifar": BackboneEntry(build=resnet18_cifar, feature_dim=512, accepts_in_channels=True, accepts_width=False),
    "resnet32_cifar": BackboneEntry(build=ResNet32Cifar, feature_dim=64, accepts_in_channels=True, accepts_width=False),
    "senet18_cifar": BackboneEntry(build=SENet18Cifar, feature_dim=512, accepts_in_channels=True, accepts_width=False),
    **{name: _torchvision_entry(name) for name in TORCHVISION_ARCHS},
}


def build_backbone(name: str, *, in_channels: int = 3, width: int | None = None) -> tuple[nn.Module, int]:
    """Build the backbone registered as ``name``; return ``(module, feature_dim)``.

    ``width`` sets the output dimension of ``small_cnn`` and ``small_fc_cnn`` (default 64) and is rejected elsewhere.
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
