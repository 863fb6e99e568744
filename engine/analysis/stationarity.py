"""Stationarity probe: how a model's encoder features sit relative to its classifier's prototypes.

Pure numpy functions over features, labels and a prototype matrix ``W`` (row ``y`` = prototype of class
``y``: a fixed d-Simplex/ETF head's rows, or a learnable classifier's weight rows). Three numbers per step:

* the mean cosine between each feature and the prototype of its class (1 = every feature on its
  prototype, the collapsed, stationary end state);
* the share of the feature energy, sum_i (h_i . u)^2 / sum_i ||h_i||^2, along the unit centroid ``u``
  of the prototypes of the classes assigned so far (near 1: the features mostly encode "one of the
  classes seen so far", a direction that moves when classes are added);
* the angle (degrees) that centroid turns from one step to the next.

A centred simplex's prototypes sum to zero, so once every class is assigned the centroid vanishes and
the energy share and turn are undefined (NaN / None): no direction is preferred any more.
"""
from __future__ import annotations

import math

import numpy as np

ZERO_CENTROID = 1e-6  # a centroid shorter than this times the mean prototype norm counts as zero


def _check(features: np.ndarray, labels: np.ndarray, prototypes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    features = np.asarray(features, dtype=np.float64)
    labels = np.asarray(labels)
    prototypes = np.asarray(prototypes, dtype=np.float64)
    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise ValueError(f"expected (N, D) features and (N,) labels, got {features.shape} and {labels.shape}")
    if prototypes.ndim != 2 or prototypes.shape[1] != features.shape[1]:
        raise ValueError(f"prototypes of shape {prototypes.shape} do not match {features.shape[1]}-d features; "
                         f"expected (num_classes, {features.shape[1]})")
    if labels.size and (labels.min() < 0 or labels.max() >= prototypes.shape[0]):
        raise ValueError(f"labels run from {labels.min()} to {labels.max()} but there are only "
                         f"{prototypes.shape[0]} prototypes (one row per class)")
    return features, labels, prototypes


def prototype_cosines(features: np.ndarray, labels: np.ndarray, prototypes: np.ndarray) -> np.ndarray:
    """Cosine between each feature ``h_i`` and the prototype ``W[labels[i]]`` of its class (0 for zero vectors)."""
    features, labels, prototypes = _check(features, labels, prototypes)
    rows = prototypes[labels]
    norms = np.linalg.norm(features, axis=1) * np.linalg.norm(rows, axis=1)
    return np.sum(features * rows, axis=1) / np.maximum(norms, 1e-12)


def assigned_centroid(prototypes: np.ndarray, classes: np.ndarray | list[int]) -> np.ndarray | None:
    """Unit vector along the mean of the prototypes of ``classes``; ``None`` when that mean is (numerically) zero."""
    prototypes = np.asarray(prototypes, dtype=np.float64)
    classes = np.asarray(classes, dtype=np.int64)
    if classes.size == 0 or classes.min() < 0 or classes.max() >= len(prototypes):
        raise ValueError(f"assigned classes {classes.tolist()} must be non-empty rows of the {len(prototypes)} prototypes")
    rows = prototypes[classes]
    centroid = rows.mean(axis=0)
    norm = np.linalg.norm(centroid)
    if norm <= ZERO_CENTROID * np.linalg.norm(rows, axis=1).mean():
        return None
    return centroid / norm


def energy_fraction(features: np.ndarray, direction: np.ndarray) -> float:
    """sum_i (h_i . u)^2 / sum_i ||h_i||^2 for a unit direction ``u``: the share of feature energy along ``u``."""
    features = np.asarray(features, dtype=np.float64)
    direction = np.asarray(direction, dtype=np.float64)
    if features.ndim != 2 or direction.shape != (features.shape[1],):
        raise ValueError(f"expected (N, D) features and a (D,) direction, got {features.shape} and {direction.shape}")
    total = float((features**2).sum())
    return float(((features @ direction) ** 2).sum() / total) if total > 0 else float("nan")


def turn_angle(previous: np.ndarray | None, current: np.ndarray | None) -> float | None:
    """Angle in degrees between two unit directions; ``None`` when either is missing or their dimensions differ."""
    if previous is None or current is None or np.shape(previous) != np.shape(current):
        return None
    return math.degrees(math.acos(float(np.clip(np.dot(previous, current), -1.0, 1.0))))


def stationarity_probe(features: np.ndarray, labels: np.ndarray, prototypes: np.ndarray,
                       assigned: np.ndarray | list[int]) -> tuple[dict[str, float | None], np.ndarray | None]:
    """The probe of one model: ``({"prototype_cosine", "centroid_energy"}, centroid direction or None)``.

    Only the samples of the ``assigned`` classes (those the model was trained on) count.
    """
    labels = np.asarray(labels)
    keep = np.isin(labels, np.asarray(assigned))
    if not keep.any():
        raise ValueError(f"no sample belongs to the assigned classes {list(assigned)}")
    features, labels, prototypes = _check(np.asarray(features)[keep], labels[keep], prototypes)
    direction = assigned_centroid(prototypes, assigned)
    return {
        "prototype_cosine": float(prototype_cosines(features, labels, prototypes).mean()),
        "centroid_energy": None if direction is None else energy_fraction(features, direction),
    }, direction


__all__ = ["assigned_centroid", "energy_fraction", "prototype_cosines", "stationarity_probe", "turn_angle"]
