"""The torch half of a cell's features: run a network over images once and return its raw outputs.

``extract_outputs`` returns the raw views (``engine.core.cell.RAW_VIEWS``) that are stored and from which
``engine.core.cell`` derives every cell's features; ``simplex_projection`` is the PSP projection of a tensor.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from engine.core.cell import project_simplex
from engine.data.bounds import check_batch_size
from engine.data.imageset import as_float
from engine.models.device import pick_device

if TYPE_CHECKING:
    from engine.models.net import Net


def simplex_projection(
    outputs: torch.Tensor,
    num_classes: int,
    *,
    center: bool = True,
    topk: int | None = None,
    topk_order: str = "project_first",
) -> torch.Tensor:
    """:func:`project_simplex` of a tensor (no gradient), returned on its device with its floating dtype."""
    projected = project_simplex(outputs.detach().cpu().numpy(), num_classes, center=center, topk=topk,
                                topk_order=topk_order)
    return torch.from_numpy(projected).to(outputs.device)


def extract_outputs(
    net: Net,
    images_or_loader: torch.Tensor | np.ndarray | Iterable[Any],
    *,
    batch_size: int = 256,
    device: str | torch.device = "auto",
    softmax_temperature: float = 1.0,
) -> dict[str, np.ndarray]:
    """Run ``net`` over images and return float32 ``encoder``, ``logits`` and ``softmax`` arrays.

    ``images_or_loader`` is an ``(N, C, H, W)`` tensor/array (split into ``batch_size`` chunks, each
    made float32 on its own: uint8 pixels are scaled to [0, 1]) or an iterable of batches, each a tensor or a ``(images, labels, ...)`` sequence; when labels come
    with the batches they are returned under ``labels`` (int64).
    ``logits`` and ``softmax`` cover all head outputs and are put in class order
    (column c = class c, through ``net.head.class_to_output``), so a right-to-left d-Simplex head
    gives the same column meaning as a left-to-right one. Runs under ``torch.inference_mode``,
    autocast (float16) only on CUDA; the network's device and train/eval mode are restored.
    ``softmax`` is ``softmax(logits / softmax_temperature)`` (1.0: the plain softmax; ``logits`` stay unscaled).
    """
    if isinstance(softmax_temperature, bool) or not (isinstance(softmax_temperature, (int, float))
                                                     and math.isfinite(softmax_temperature) and softmax_temperature > 0):
        raise ValueError(f"softmax_temperature must be a positive finite number, got {softmax_temperature!r}")
    target = pick_device(device) if isinstance(device, str) else torch.device(device)
    original_device = next(iter(net.parameters()), torch.empty(0)).device
    was_training = net.training
    num_outputs = net.head.num_outputs
    columns: dict[str, list[torch.Tensor]] = {"encoder": [], "logits": [], "labels": []}
    net.eval()
    net.to(target)
    try:
        order = net.head.class_to_output(torch.arange(num_outputs, device=target))
        with torch.inference_mode():
            for images, labels in _batches(images_or_loader, batch_size):
                with torch.autocast(device_type=target.type, dtype=torch.float16, enabled=target.type == "cuda"):
                    output = net(images.to(target, non_blocking=True))
                columns["encoder"].append(output.features.float().cpu())
                columns["logits"].append(output.logits.float()[:, order].cpu())
                if labels is not None:
                    columns["labels"].append(torch.as_tensor(labels).cpu())
    finally:
        net.to(original_device)
        net.train(was_training)

    if not columns["encoder"]:
        raise ValueError("no images to extract features from: the input is empty")
    logits = torch.cat(columns["logits"])
    raw = {
        "encoder": torch.cat(columns["encoder"]).numpy(),
        "logits": logits.numpy(),
        "softmax": torch.softmax(logits / softmax_temperature, dim=-1).numpy(),
    }
    if columns["labels"]:
        raw["labels"] = torch.cat(columns["labels"]).to(torch.int64).numpy()
    return raw


def _batches(
    images_or_loader: torch.Tensor | np.ndarray | Iterable[Any], batch_size: int
) -> Iterator[tuple[torch.Tensor, Any]]:
    if isinstance(images_or_loader, (torch.Tensor, np.ndarray)):
        check_batch_size(batch_size)
        images = torch.as_tensor(images_or_loader)
        for start in range(0, images.shape[0], batch_size):
            yield as_float(images[start : start + batch_size]), None
        return
    for batch in images_or_loader:
        if isinstance(batch, torch.Tensor):
            yield batch, None
        elif isinstance(batch, (tuple, list)) and len(batch) >= 1:
            yield torch.as_tensor(batch[0]), (batch[1] if len(batch) > 1 else None)
        else:
            raise ValueError(f"a batch must be an image tensor or an (images, labels, ...) sequence, got {type(batch)}")
