"""Feature extraction and the feature views used for retrieval: encoder, logits, softmax, PSP, LSP.

A model's raw outputs (encoder features, logits, softmax over all its outputs) are extracted once
with ``extract_outputs`` and stored. The PSP/LSP view of a query model depends on the *gallery*
model's classes, so ``cell_features`` derives both sides of a compatibility-matrix cell from the
stored raw outputs; the pipeline, the checkpoint comparison and every analysis go through it.

Only ``extract_outputs`` (and the tensor wrapper ``simplex_projection``) need torch, and they import
it when called: the views themselves are numpy, so the app can derive them without loading torch.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from engine.contract import DERIVED_VIEWS
from engine.metrics.norms import tame_rows, unit_rows_np  # derived view -> the raw output it comes from, in one place

if TYPE_CHECKING:
    import torch

    from engine.models.net import Net

VIEWS = ("encoder", "logits", "softmax", "psp", "lsp")
RAW_VIEWS = ("encoder", "logits", "softmax")  # what extract_outputs returns and what is stored; psp/lsp derive from them
TOPK_ORDERS = ("project_first", "sparsify_first")
# the outputs PSP/LSP keep: C^k (the first C^k, nested models) or the column indices in the gallery's class order
Columns = Union[int, Sequence[int], np.ndarray]


def project_simplex(
    outputs: np.ndarray,
    num_classes: int,
    *,
    center: bool = True,
    topk: int | None = None,
    topk_order: str = "project_first",
) -> np.ndarray:
    """PSP/LSP feature (paper 000, Algorithm 1): keep the first C^k outputs, centre, L2-normalise.

    ``outputs`` (``(..., C^t)``) are softmax probabilities for PSP or logits for LSP over all the
    model's outputs in class order; ``num_classes`` is C^k <= C^t of the gallery model. This equals
    ``normalize([I - J/C^k | 0] f)``. Floating inputs keep their dtype, others become float32.

    ``center=False`` skips the centring, which is LSP as literally written in Eq. 6 (z/||z||, with
    the truncation a cross-test needs); the default follows Algorithm 1, which the paper says it
    applies to logits as well.

    ``topk`` keeps only the k largest entries (Appendix K, which does not fix the order):
    - ``"project_first"`` (default): centre, keep the k largest centred entries, zero the rest,
      L2-normalise; this reads Appendix K's "setting all entries of a PSP feature representation
      vector to zero except for the top-k" literally and yields k-sparse features.
    - ``"sparsify_first"``: zero all but the k largest raw outputs, then centre and normalise; with
      centring the result is dense again (zeros become minus the mean).
    Ties are broken towards the lower class index, so the result is deterministic.
    """
    values = np.asarray(outputs)
    total = values.shape[-1]
    if not 1 <= num_classes <= total:
        raise ValueError(
            f"the gallery model has {num_classes} classes but these outputs cover {total}; PSP/LSP needs "
            "a query model that knows at least the gallery's classes, in the same order"
        )
    if center and num_classes < 2:
        raise ValueError("a centred simplex projection of a single class is the zero vector; use num_classes >= 2")
    if topk is not None and not 1 <= topk <= num_classes:
        raise ValueError(f"topk must lie in [1, {num_classes}], got {topk}")
    if topk_order not in TOPK_ORDERS:
        raise ValueError(f"unknown topk_order {topk_order!r}; use one of {TOPK_ORDERS}")
    if not np.issubdtype(values.dtype, np.floating):
        values = values.astype(np.float32)

    kept = tame_rows(values[..., :num_classes])  # rows near the float maximum (or tiny) scaled: centring cannot overflow
    if topk is not None and topk_order == "sparsify_first":
        kept = _keep_topk(kept, topk)
    if center:
        kept = kept - kept.mean(axis=-1, keepdims=True)
    if topk is not None and topk_order == "project_first":
        kept = _keep_topk(kept, topk)
    return unit_rows_np(kept)


def _keep_topk(values: np.ndarray, k: int) -> np.ndarray:
    """Zero every entry but the k largest of each row (stable: ties go to the lower index)."""
    order = np.argsort(-values, axis=-1, kind="stable")[..., :k]
    mask = np.zeros(values.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=-1)
    return np.where(mask, values, values.dtype.type(0))


def simplex_projection(
    outputs: torch.Tensor,
    num_classes: int,
    *,
    center: bool = True,
    topk: int | None = None,
    topk_order: str = "project_first",
) -> torch.Tensor:
    """:func:`project_simplex` of a tensor (no gradient), returned on its device with its floating dtype."""
    import torch

    projected = project_simplex(outputs.detach().cpu().numpy(), num_classes, center=center, topk=topk,
                                topk_order=topk_order)
    return torch.from_numpy(projected).to(outputs.device)


def output_view(raw: Mapping[str, np.ndarray], view: str, *, columns: Columns | None = None,
                topk: int | None = None) -> np.ndarray:
    """One model's stored raw outputs in ``view``, as an ``(N, D)`` array.

    ``encoder``, ``logits``, ``softmax`` and any other view ``raw`` holds are returned as stored (not copied;
    ``columns`` and ``topk`` do not apply to them). ``psp`` (from ``softmax``) and ``lsp`` (from ``logits``) keep the outputs
    ``columns`` names, then centre, keep the top ``topk`` and L2-normalise (:func:`project_simplex`):
    ``columns`` is C^k (the first C^k outputs, the paper's nested models) or this model's column of
    each class the gallery model shares, in the gallery's class order (``engine.checkpoints.classes``).
    """
    if view not in DERIVED_VIEWS and view in raw:  # a raw view, or one stored as it is (e.g. adapted features)
        return np.asarray(raw[view])
    if view not in VIEWS:
        raise ValueError(f"unknown feature view {view!r}; use one of {VIEWS}")
    source = DERIVED_VIEWS.get(view, view)
    if source not in raw:
        raise ValueError(f"the raw outputs have no {source!r} entry; extract them with extract_outputs")
    values = np.asarray(raw[source])
    if columns is None:
        raise ValueError(f"the {view!r} view depends on the gallery model; pass its class columns (C^k)")
    if not isinstance(columns, (int, np.integer)):
        cols = np.asarray(columns, dtype=np.int64)
        values, columns = np.ascontiguousarray(values[:, cols]), len(cols)
    return project_simplex(values, int(columns), topk=topk)


def cell_features(query_raw: Mapping[str, np.ndarray], gallery_raw: Mapping[str, np.ndarray], view: str, *,
                  columns: Columns | tuple[Columns, Columns] | None = None,
                  topk: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(query features, gallery features)`` of one compatibility cell: query model t, gallery model k.

    ``query_raw`` / ``gallery_raw`` are the two models' stored raw outputs (``encoder``, ``logits``,
    ``softmax``). For PSP/LSP, ``columns`` is C^k (both sides keep their first C^k outputs) or a pair
    ``(query columns, gallery columns)`` from ``engine.checkpoints.classes.aligned_columns``; ``topk`` is the
    config's ``eval.topk`` (PSP/LSP only). Rows are projected one by one, so selecting rows (``eval_classes``)
    before or after gives the same features.
    """
    q_cols, g_cols = columns if isinstance(columns, tuple) else (columns, columns)
    return (output_view(query_raw, view, columns=q_cols, topk=topk),
            output_view(gallery_raw, view, columns=g_cols, topk=topk))


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
    import torch

    from engine.run.device import pick_device

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
    import torch

    from engine.data.bounds import check_batch_size
    from engine.data.imageset import as_float

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
