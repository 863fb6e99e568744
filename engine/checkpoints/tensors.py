"""A checkpoint's tensors as torch reads them, and their checks against the network they are meant for.

``torch.save`` files are read with ``torch.load(..., weights_only=True)`` and nothing else; safetensors files
only after every declared size was checked (``engine.checkpoints.files``). Every refusal is a ``CheckpointError``.
"""
from __future__ import annotations

import pickle
import re
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from engine.checkpoints.files import CheckpointError, first_line, human_bytes, listed, refusal, safetensors_metadata

WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "net")


def torch_load(path: Path) -> object:
    """``torch.load`` with ``weights_only=True`` on the CPU; a refused or broken pickle is a one-line error."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # e.g. "Detected pickle protocol 4": the error says enough
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        m = re.search(r"WeightsUnpickler error:\s*([^\n]*)", text)
        detail = (m.group(1) if m else first_line(exc)).strip()
        if "Weights only load failed" in text:
            found = re.search(r"GLOBAL\s+([\w.]+)", detail)
            if found:
                raise CheckpointError(path, refusal(f"unpickling it would call {found.group(1)}")) from None
            if re.search(r"unsupported", detail, re.IGNORECASE):
                reason = f"it is a pickle that rebuilds Python objects ({detail.rstrip('.')})"
                raise CheckpointError(path, refusal(reason)) from None
        raise CheckpointError(path, f"is truncated or corrupt ({detail})") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        raise CheckpointError(path, f"is truncated or corrupt ({first_line(exc)})") from None


def as_state_dict(path: Path, obj: object) -> dict[str, torch.Tensor]:
    """The name -> tensor mapping in a loaded object (unwrapped, ``module.`` prefixes removed), or a refusal."""
    if isinstance(obj, Mapping):
        for key in WRAPPER_KEYS:
            inner = obj.get(key)
            if isinstance(inner, Mapping) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                obj = inner
                break
    if not isinstance(obj, Mapping):
        raise CheckpointError(path, f"holds a {type(obj).__name__}, not a state_dict (a mapping of names to tensors)")
    bad = [f"{k} ({type(v).__name__})" for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(path, f"holds entries that are not tensors: {listed(bad)}; save model.state_dict()")
    if not obj:
        raise CheckpointError(path, "holds an empty state_dict")
    tensors = {str(k): v for k, v in obj.items()}
    if all(k.startswith("module.") for k in tensors):
        tensors = {k[len("module."):]: v for k, v in tensors.items()}
    return tensors

def read_safetensors(path: Path, max_bytes: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A safetensors file's tensors and metadata, read only after its declared sizes were checked."""
    from safetensors import safe_open

    safetensors_metadata(path, max_bytes)

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError (and OSError) on bad files
        raise CheckpointError(path, f"cannot be read as safetensors: truncated or corrupt ({first_line(exc)})") from None
    if not tensors:
        raise CheckpointError(path, "holds no tensors")
    return tensors, metadata



def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """The module ``build`` makes, with meta tensors (shapes only, no memory)."""
    with torch.device("meta"):
        return build()


def check_model_bytes(path: Path, model: nn.Module, max_bytes: int, *, what: str) -> None:
    """The parameters and buffers of ``model`` (built :func:`on_meta`) fit ``max_bytes``."""
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if total > max_bytes:
        raise CheckpointError(path, f"a {what} would take {human_bytes(total)}, over the {human_bytes(max_bytes)} size "
                                    "limit; refused before building it")


def check_tensors(path: Path, model: nn.Module, tensors: Mapping[str, torch.Tensor], *, what: str) -> None:
    """Keys, shapes and finiteness of ``tensors`` against ``model``'s state dict (one-line errors)."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in tensors]
    unexpected = [k for k in tensors if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s): {listed(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s): {listed(unexpected)}")
        raise CheckpointError(path, f"does not match a {what}: " + "; ".join(parts))
    wrong = [(k, tuple(expected[k].shape), tuple(tensors[k].shape)) for k in expected
             if tuple(expected[k].shape) != tuple(tensors[k].shape)]
    if wrong:
        key, exp, found = wrong[0]
        more = f" (and {len(wrong) - 1} more layer(s))" if len(wrong) > 1 else ""
        raise CheckpointError(path, f"shape mismatch in layer {key}: a {what} expects {exp}, the file has {found}{more}")
    check_finite(path, tensors)


def with_bn_counters(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fill BatchNorm's ``num_batches_tracked`` counters that older checkpoints lack (they are not weights)."""
    counters = {k: v for k, v in model.state_dict().items() if k.endswith("num_batches_tracked") and k not in tensors}
    return {**tensors, **counters} if counters else tensors


def check_finite(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """Every floating-point tensor is free of NaN and inf."""
    bad = [(k, int((~torch.isfinite(v)).sum())) for k, v in tensors.items()
           if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        names = listed([f"{k} ({n} of {tensors[k].numel()})" for k, n in bad])
        raise CheckpointError(path, f"has NaN/inf weights in {len(bad)} tensor(s): {names}")
