"""Orthogonal vs affine vs lambda-orthogonal alignment of a 2-D source space onto a target (paper 004, Figs. 2-3).

The source plays the new model's features, the target the old model's, for the same images; the
backward map B is fitted with ``engine.adapters.fit.fit_adapters`` alone (no forward adapter, loss L_B
= ||B(source) - target||^2, Eq. 2):

* ``orthogonal``: B_perp = expm(skew), a rotation (Sec. 3.2); no bias;
* ``affine``: B_lambda with lambda = inf, a free affine map;
* ``lambda-orthogonal``: B_lambda with the regulariser sigmoid(alpha (x - lambda)) x,
  x = ||W W^T - I||_F (Eq. 6), which lets the map drift up to about lambda from orthogonal.

Each map is scored by its orthogonality error x, its alignment error (mean ||B(s) - t||^2) and how
much it bends the source geometry (mean relative change of pairwise distances; 0 for an isometry).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from engine.adapters.fit import fit_adapters
from engine.adapters.losses import lambda_orthogonality
from engine.learn.runtime import one_thread

MAPS = ("orthogonal", "affine", "lambda-orthogonal")


def source_target(
    *, num_classes: int = 5, per_class: int = 30, stretch: float = 0.6, rotation_deg: float = 60.0,
    noise: float = 0.15, seed: int = 0,
) -> pd.DataFrame:
    """A 2-D target space and a source that is a rotated, stretched copy of it with its own noise.

    Target: class c at angle 360 c / num_classes on the unit circle plus Gaussian noise ``noise``.
    Source: the same images' target points (before noise) mapped by R(rotation) diag(1 + stretch,
    1 / (1 + stretch)), plus independent noise ``noise``. Both clouds are centred (B_perp has no
    bias). A rotation alone cannot undo the stretch; an affine map can. Columns ``image``,
    ``label``, ``source_x``, ``source_y``, ``target_x``, ``target_y``.
    """
    if num_classes < 2 or per_class < 2:
        raise ValueError(f"need >= 2 classes with >= 2 points each, got {num_classes} x {per_class}")
    if stretch < 0 or noise < 0:
        raise ValueError(f"stretch and noise must be >= 0, got {stretch} and {noise}")
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(num_classes), per_class)
    angle = 2 * np.pi * labels / num_classes
    centres = np.stack([np.cos(angle), np.sin(angle)], 1)
    target = centres + noise * rng.standard_normal(centres.shape)
    rot = np.deg2rad(rotation_deg)
    R = np.array([[np.cos(rot), -np.sin(rot)], [np.sin(rot), np.cos(rot)]])
    source = centres @ (R @ np.diag([1.0 + stretch, 1.0 / (1.0 + stretch)])).T + noise * rng.standard_normal(centres.shape)
    target -= target.mean(0)
    source -= source.mean(0)
    return pd.DataFrame({"image": np.arange(len(labels)), "label": labels, "source_x": source[:, 0],
                         "source_y": source[:, 1], "target_x": target[:, 0], "target_y": target[:, 1]})


@dataclass(frozen=True)
class FittedMap:
    """One fitted backward map: ``y = x W^T + b`` and its scores."""

    name: str
    weight: np.ndarray  # (2, 2)
    bias: np.ndarray  # (2,)
    mapped: np.ndarray  # (n, 2) B(source)
    orthogonality_error: float
    alignment_error: float
    distance_distortion: float


def orthogonality_error(weight: np.ndarray) -> float:
    """||W W^T - I||_F."""
    weight = np.asarray(weight, np.float64)
    return float(np.linalg.norm(weight @ weight.T - np.eye(weight.shape[0]), "fro"))


def alignment_error(mapped: np.ndarray, target: np.ndarray) -> float:
    """Mean over points of ||B(s_i) - t_i||^2 (the L_B of Eq. 2, averaged over the samples)."""
    return float(np.mean(np.sum((np.asarray(mapped) - np.asarray(target)) ** 2, axis=1)))


def distance_distortion(source: np.ndarray, mapped: np.ndarray) -> float:
    """Mean over pairs i < j of | ||B(s_i) - B(s_j)|| - ||s_i - s_j|| | / ||s_i - s_j||: 0 for an isometry."""
    i, j = np.triu_indices(len(source), 1)
    before = np.linalg.norm(source[i] - source[j], axis=1)
    after = np.linalg.norm(mapped[i] - mapped[j], axis=1)
    keep = before > 1e-12
    return float(np.mean(np.abs(after[keep] - before[keep]) / before[keep]))


def fit_maps(
    source: np.ndarray, target: np.ndarray, labels: np.ndarray, *, lam: float = 1.0, alpha: float = 10.0,
    epochs: int = 400, lr: float = 0.05, seed: int = 0, maps: tuple[str, ...] = MAPS,
) -> dict[str, FittedMap]:
    """Fit the backward maps named in ``maps`` (default: all of ``MAPS``; full-batch Adam through ``fit_adapters``).

    ``lam`` and ``alpha`` are the lambda-orthogonal map's lambda and steepness (paper 004 used
    lambda = 1 in its 2-D MNIST figure; alpha is not stated there). ``epochs`` and ``lr`` are ours:
    400 full-batch Adam steps at lr 0.05 converge on this toy (the paper's 1e-3 would need far more).
    """
    unknown = sorted(set(maps) - set(MAPS))
    if unknown:
        raise ValueError(f"unknown map(s) {unknown}; choose from {MAPS}")
    source, target = np.asarray(source, np.float32), np.asarray(target, np.float32)
    settings = {"orthogonal": {"kind": "perp"}, "affine": {"kind": "lambda", "lam": math.inf},
                "lambda-orthogonal": {"kind": "lambda", "lam": lam, "alpha": alpha}}
    fitted = {}
    for name in maps:
        with one_thread():
            pair = fit_adapters(target, source, labels, with_forward=False, epochs=epochs, batch_size=len(source),
                                lr=lr, seed=seed, device="cpu", **settings[name])
        weight = pair.backward_weight().double().numpy()
        bias = np.zeros(2) if pair.kind == "perp" else pair.backward.bias.detach().double().numpy()
        mapped = source.astype(np.float64) @ weight.T + bias
        fitted[name] = FittedMap(name, weight, bias, mapped, orthogonality_error(weight),
                                 alignment_error(mapped, target), distance_distortion(source.astype(np.float64), mapped))
    return fitted


def regulariser_curve(*, lams: tuple[float, ...], alpha: float, x_max: float = 4.0, steps: int = 161) -> pd.DataFrame:
    """Fig. 2(a): L_lambda(x) = sigmoid(alpha (x - lambda)) x for each lambda, from ``engine.adapters.lambda_orthogonality``.

    A 1x1 matrix W = [sqrt(1 + x)] has ||W W^T - I||_F = x, so the curve is the engine's own
    regulariser evaluated at that deviation. Columns ``x``, ``lambda``, ``L_lambda``.
    """
    rows = []
    for lam in lams:
        for x in np.linspace(0.0, x_max, steps):
            value = lambda_orthogonality(torch.tensor([[math.sqrt(1.0 + x)]], dtype=torch.float64), lam=lam, alpha=alpha)
            rows.append({"x": float(x), "lambda": float(lam), "L_lambda": float(value)})
    return pd.DataFrame(rows)
