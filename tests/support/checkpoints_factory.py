"""Shared by several test modules; moved from tests/test_checkpoints_factory.py."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
import torchvision
from PIL import Image
from safetensors.torch import save_file
from torch import nn

from engine.models import build_model, save_checkpoint

COLOURS = [(200, 40, 40), (40, 180, 40), (40, 40, 200), (200, 200, 40)]


def write_image_folder(root: Path, *, classes: int = 4, per_class: int = 5, size: int = 24, seed: int = 0) -> Path:
    """``root/class_c/i.png``: noisy images around one colour per class (so retrieval has signal)."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        base = np.array(COLOURS[c % len(COLOURS)], dtype=np.float64)
        for i in range(per_class):
            pixels = base + rng.normal(0, 35, size=(size, size, 3))
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(folder / f"{i}.png")
    return root


def small_net(num_classes: int = 4, *, width: int = 16, seed: int = 0):
    """The project's small CNN with a linear head (a ``Net``)."""
    return build_model(backbone="small_cnn", head="linear", num_classes=num_classes, width=width, seed=seed)


def save_state_dict_pt(path: Path, num_classes: int = 4, *, width: int = 16, seed: int = 0, legacy: bool = False):
    net = small_net(num_classes, width=width, seed=seed)
    torch.save(net.state_dict(), path, _use_new_zipfile_serialization=not legacy)
    return net


def save_resnet18_safetensors(path: Path, num_classes: int = 3, *, seed: int = 0) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = torchvision.models.resnet18(weights=None, num_classes=num_classes).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model


def save_step_checkpoint(path: Path, num_classes: int = 4, *, width: int = 8, seed: int = 0):
    net = small_net(num_classes, width=width, seed=seed)
    save_checkpoint(net, path, extra={"step": 1})
    return net


class TinyPair(nn.Module):
    """forward -> (features, logits), as the project's ModelOutput."""

    def __init__(self, num_classes: int = 4, dim: int = 6, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.body = nn.Sequential(nn.Conv2d(3, dim, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
            self.fc = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(x)
        return features, self.fc(features)


class TinyLogits(TinyPair):
    """forward -> logits only (no encoder view unless embed is exported)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.fc(self.body(x))


class TinyLogitsEmbed(TinyLogits):
    """forward -> logits, plus an exported embed(x) for the encoder view."""

    @torch.jit.export
    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class FlatInput(nn.Module):
    """Only works on 3x16x16 images (a Linear on the flattened pixels)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 16 * 16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def save_torchscript(path: Path, module: nn.Module, *, trace: bool = False) -> nn.Module:
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.trace(module, torch.rand(1, 3, 16, 16)) if trace else torch.jit.script(module)
        scripted.save(str(path))
    return module

