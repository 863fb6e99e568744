"""Training of the adapters on stored features (paper 004 Secs. 3.2-3.5, reconstructed loop B.9).

Both backbones are frozen; only F and B are trained, on feature arrays of the same samples.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import torch

from engine.adapters.inputs import as_features, as_labels, check_class_sizes, check_ids, check_same_rows
from engine.adapters.losses import (
    MSE_REDUCTIONS,
    lambda_orthogonality,
    orthogonality_deviation,
    squared_error,
    supervised_contrastive_loss,
)
from engine.adapters.modules import AFFINE_INITS
from engine.adapters.pair import KINDS, AdapterPair, build_adapters, common_dim, to_width
from engine.models.device import pick_device

MIN_PER_CLASS = 2
Progress = Callable[[int, int, dict[str, float]], None]


def fit_adapters(
    old: np.ndarray | torch.Tensor,
    new: np.ndarray | torch.Tensor,
    labels: np.ndarray | torch.Tensor | Sequence,
    *,
    kind: str = "perp",
    epochs: int = 20,
    batch_size: int = 512,
    lr: float = 1e-3,
    temperature: float = 0.1,
    lam: float = 12.0,
    alpha: float = 1.0,
    reg_weight: float = 1.0,
    loss_weights: tuple[float, float, float] | None = None,
    with_forward: bool = True,
    dim_mismatch: str = "truncate",
    mse_reduction: str = "sum",
    forward_init: str = "uniform",
    backward_init: str = "identity",
    old_ids: Sequence | None = None,
    new_ids: Sequence | None = None,
    seed: int = 0,
    device: str = "auto",
    progress: Progress | None = None,
) -> AdapterPair:
    """Train the adapters of one old/new pair on stored features; returns them on the CPU.

    ``old`` (N, d_old) and ``new`` (N, d_new) are the two frozen models' features of the same N
    samples in the same row order (checked against ``old_ids``/``new_ids`` when given), ``labels``
    (N,) their classes.

    Kinds (paper 004):
    - ``"perp"``: B_perp = expm(skew) (Sec. 3.2) and F, loss (Eq. 10)
      ``w1 L_F + w2 L_B + w3 L_C`` with ``L_B = ||B(new) - old||^2`` (Eq. 2),
      ``L_F = ||F(old) - B(new)||^2`` (Eq. 7) and
      ``L_C = Lcontr(F(old), B(new)) + Lcontr(F(old), old)`` (Eq. 9; anchors first).
    - ``"lambda"``: affine B_lambda (Sec. 3.3), the same loss plus
      ``reg_weight * sigmoid(alpha (||WW^T-I||_F - lam)) ||WW^T-I||_F`` (Eq. 6).
      ``lam=0`` ~ soft orthogonality, ``lam=math.inf`` a plain affine map.
    - ``"fct"``: the FCT baseline (B.5): F alone, old -> raw new space, ``||F(old) - new||^2``;
      ``loss_weights``, ``temperature``, ``lam``, ``alpha`` do not apply.
    ``with_forward=False`` trains B alone (``w2 L_B`` [+ L_lambda]); L_F and L_C need F, so
    ``loss_weights`` must then leave w1 = w3 = 0.
    Gradients of L_F and L_C reach both F and B (joint training, Sec. 3.4).

    Readings where the paper is silent (all settable):
    - ``dim_mismatch="truncate"``: the wider features keep their first min(d_old, d_new)
      components (the paper's sentence; which components is our reading); ``"pad"`` zero-pads
      the narrower to max(d_old, d_new) instead. F always reads the full old features.
    - ``loss_weights`` (w1, w2, w3) = (1, 1, 1) (paper: not given; (0, 1, 0) without F);
      ``reg_weight`` = 1 (paper: w = 1).
    - ``temperature`` = 0.1 (StableRep's value); candidates are the batch; not symmetrised; the
      same image in the other space stays a positive (the alignment target).
    - ``alpha`` = 1 (not given); ``lam`` = 12 (the paper's downstream value).
    - ``mse_reduction="sum"``: ``||.||_2^2`` summed over dimensions as printed; ``"mean"`` = nn.MSELoss.
    - Adam, ``lr`` = 1e-3 (paper), constant (no schedule stated); ``epochs`` = 20 and
      ``batch_size`` = 512 are ours; uniform shuffling each epoch from ``seed``; the last batch
      may be smaller.
    - Init: B_perp at the identity (A = 0); B_lambda at ``backward_init`` ("identity": W = I,
      b = 0); F at ``forward_init`` ("uniform": nn.Linear's bound, seeded).

    ``progress(epoch, epochs, mean_losses)`` is called after each epoch with the mean of each
    weighted term, the total and B's ``||W W^T - I||_F``; ``AdapterPair.history`` keeps them.
    ``device="auto"`` uses CUDA when available.
    """
    _check_settings(
        kind, epochs, batch_size, lr, temperature, lam, alpha, reg_weight, mse_reduction, forward_init, backward_init
    )
    weights = _resolve_weights(kind, loss_weights, with_forward)
    if kind != "fct" and sum(weights) == 0 and not (kind == "lambda" and reg_weight > 0):
        raise ValueError("all loss weights (and the regulariser) are 0, so nothing would be trained")
    old_arr, new_arr = as_features(old, "old features"), as_features(new, "new features")
    check_same_rows(old_arr, new_arr, "old features", "new features")
    label_arr = as_labels(labels, old_arr.shape[0], "labels")
    check_ids(old_ids, new_ids, old_arr.shape[0])
    classes, codes = np.unique(label_arr, return_inverse=True)
    if weights[2] > 0:
        if batch_size < 2:
            raise ValueError("the supervised contrastive loss compares samples within a batch; use batch_size >= 2")
        check_class_sizes(codes, classes, MIN_PER_CLASS)

    torch_device = pick_device(device)
    generator = torch.Generator().manual_seed(seed)
    old_dim, new_dim = old_arr.shape[1], new_arr.shape[1]
    forward, backward = build_adapters(
        kind,
        old_dim,
        new_dim,
        dim_mismatch=dim_mismatch,
        with_forward=with_forward,
        forward_init=forward_init,
        backward_init=backward_init,
        generator=generator,
    )
    modules = [m.to(torch_device) for m in (forward, backward) if m is not None]
    optimiser = torch.optim.Adam([p for m in modules for p in m.parameters()], lr=lr)
    n_rows = old_arr.shape[0]

    h_old = torch.from_numpy(old_arr).to(torch_device)
    h_new = torch.from_numpy(new_arr).to(torch_device)
    y = torch.from_numpy(codes.astype(np.int64)).to(torch_device)
    width = common_dim(old_dim, new_dim, dim_mismatch)
    old_common, new_common = to_width(h_old, width), to_width(h_new, width)

    def step_losses(idx: torch.Tensor) -> dict[str, torch.Tensor]:
        if kind == "fct":
            return {"fct": squared_error(forward(h_old[idx]), h_new[idx], reduction=mse_reduction)}
        b = backward(new_common[idx])
        o = old_common[idx]
        f = forward(h_old[idx]) if forward is not None else None
        terms: dict[str, torch.Tensor] = {}
        if weights[0] > 0:
            terms["forward"] = weights[0] * squared_error(f, b, reduction=mse_reduction)
        if weights[1] > 0:
            terms["backward"] = weights[1] * squared_error(b, o, reduction=mse_reduction)
        if weights[2] > 0:
            yb = y[idx]
            terms["contrastive"] = weights[2] * (
                supervised_contrastive_loss(f, b, yb, temperature=temperature)
                + supervised_contrastive_loss(f, o, yb, temperature=temperature)
            )
        if kind == "lambda" and reg_weight > 0:
            terms["lambda_reg"] = reg_weight * lambda_orthogonality(backward.weight, lam=lam, alpha=alpha)
        return terms

    history: list[dict[str, float]] = []
    for epoch in range(1, epochs + 1):
        order = torch.randperm(n_rows, generator=generator).to(torch_device)
        sums: dict[str, float] = {}
        n_seen = 0
        for start in range(0, n_rows, batch_size):
            idx = order[start : start + batch_size]
            terms = step_losses(idx)
            total = sum(terms.values())
            optimiser.zero_grad(set_to_none=True)
            total.backward()
            optimiser.step()
            for name, value in {**terms, "total": total}.items():
                sums[name] = sums.get(name, 0.0) + float(value.detach()) * idx.numel()
            n_seen += idx.numel()
        means = {name: value / n_seen for name, value in sums.items()}
        if backward is not None:
            with torch.no_grad():
                means["orthogonality_deviation"] = float(orthogonality_deviation(backward.weight))
        history.append(means)
        if progress is not None:
            progress(epoch, epochs, means)

    hyper: dict[str, Any] = {
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "optimizer": "adam",
        "mse_reduction": mse_reduction,
        "forward_init": forward_init if with_forward else None,
        "seed": seed,
        "n_train": n_rows,
        "n_classes": int(classes.shape[0]),
    }
    if kind != "fct":
        hyper.update(loss_weights=list(weights), temperature=temperature)
    if kind == "lambda":
        hyper.update(lam=lam, alpha=alpha, reg_weight=reg_weight, backward_init=backward_init)
    return AdapterPair(
        kind=kind,
        old_dim=old_dim,
        new_dim=new_dim,
        dim_mismatch=dim_mismatch,
        forward=forward.cpu().eval() if forward is not None else None,
        backward=backward.cpu().eval() if backward is not None else None,
        hyper=hyper,
        history=history,
    )


def _resolve_weights(
    kind: str, loss_weights: tuple[float, float, float] | None, with_forward: bool
) -> tuple[float, float, float]:
    if kind == "fct":
        if loss_weights is not None:
            raise ValueError(
                "kind='fct' trains F with ||F(old) - new||^2 alone; loss_weights apply to 'perp' and 'lambda'"
            )
        return (0.0, 0.0, 0.0)
    if loss_weights is None:
        return (1.0, 1.0, 1.0) if with_forward else (0.0, 1.0, 0.0)
    if len(loss_weights) != 3:
        raise ValueError(f"loss_weights is (w1 for L_F, w2 for L_B, w3 for L_C), got {loss_weights!r}")
    weights = tuple(float(w) for w in loss_weights)
    if any(not (w >= 0 and math.isfinite(w)) for w in weights):
        raise ValueError(f"loss weights must be finite and >= 0, got {loss_weights!r}")
    if not with_forward and (weights[0] > 0 or weights[2] > 0):
        raise ValueError(
            "without a forward adapter (with_forward=False) L_F and L_C cannot be computed; set w1 = w3 = 0"
        )
    return weights  # type: ignore[return-value]


def _check_settings(
    kind: str,
    epochs: int,
    batch_size: int,
    lr: float,
    temperature: float,
    lam: float,
    alpha: float,
    reg_weight: float,
    mse_reduction: str,
    forward_init: str,
    backward_init: str,
) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if int(epochs) != epochs or epochs < 1:
        raise ValueError(f"epochs must be a whole number >= 1, got {epochs}")
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size}")
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite number, got {lr}")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")
    if not lam >= 0:
        raise ValueError(f"lam must be >= 0 (math.inf switches the regulariser off), got {lam}")
    if not (alpha > 0 and math.isfinite(alpha)):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    if not (reg_weight >= 0 and math.isfinite(reg_weight)):
        raise ValueError(f"reg_weight must be finite and >= 0, got {reg_weight}")
    if mse_reduction not in MSE_REDUCTIONS:
        raise ValueError(f"mse_reduction must be one of {MSE_REDUCTIONS}, got {mse_reduction!r}")
    for name, value in (("forward_init", forward_init), ("backward_init", backward_init)):
        if value not in AFFINE_INITS:
            raise ValueError(f"{name} must be one of {AFFINE_INITS}, got {value!r}")
