"""Save and load networks as safetensors files: tensors plus a JSON architecture description.

Loading never executes code (no pickle): the architecture is rebuilt from the JSON ``ModelSpec``
and the weights are loaded strictly into it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.core.contract import CHECKPOINT_FORMAT
from engine.models.net import ModelSpec, Net, build_model


def save_checkpoint(net: Net, path: str | Path, *, extra: Mapping[str, Any] | None = None) -> None:
    """Write ``net``'s state dict and its ``ModelSpec`` (plus JSON-able ``extra`` info) to ``path``."""
    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in net.state_dict().items()}
    metadata = {
        "format": CHECKPOINT_FORMAT,
        "meta": json.dumps(asdict(net.spec)),
        "extra": json.dumps(dict(extra or {})),
    }
    save_file(tensors, str(path), metadata=metadata)


def read_checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """The checkpoint's ``{"meta": architecture dict, "extra": dict}`` without loading any tensor."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    return _parse_metadata(metadata, path)


def load_checkpoint(path: str | Path, *, device: str | torch.device = "cpu") -> Net:
    """Rebuild the network described in ``path`` and load its weights (strictly) onto ``device``."""
    with safe_open(str(path), framework="pt") as handle:
        info = _parse_metadata(handle.metadata() or {}, path)
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    spec = _spec_from_dict(info["meta"], path)
    net = build_model(**asdict(spec))
    net.load_state_dict(tensors, strict=True)
    return net.to(device)


def _parse_metadata(metadata: Mapping[str, str], path: str | Path) -> dict[str, Any]:
    if metadata.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{path} is not a Compatibility Lab network checkpoint (format {metadata.get('format')!r}, "
            f"expected {CHECKPOINT_FORMAT!r})"
        )
    return {"meta": json.loads(metadata["meta"]), "extra": json.loads(metadata.get("extra", "{}"))}


def _spec_from_dict(meta: Mapping[str, Any], path: str | Path) -> ModelSpec:
    known = {field.name for field in fields(ModelSpec)}
    unknown = sorted(set(meta) - known)
    if unknown:
        raise ValueError(f"{path} describes an architecture with unknown fields {unknown}; written by a newer version?")
    return ModelSpec(**meta)
