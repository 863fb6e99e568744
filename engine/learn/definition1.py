"""Definition 1 by hand: every pair inequality of two toy 2-D models, next to the empirical criterion.

Definition 1 (Shen et al. 2020; paper 000 Def. 1, paper 001 Def. 1, paper 002 Eq. 1), old model k,
new model t, over ordered pairs (i, j), i != j:

* (1a) same class:      d(h_i^k, h_j^t) <= d(h_i^k, h_j^k)
* (1b) different class: d(h_i^k, h_j^t) >= d(reference), with reference ``"old"`` = d(h_i^k, h_j^k)
  (papers 001/002, Shen et al.) or ``"new"`` = d(h_i^t, h_j^t) (paper 000's text); the same
  switch as ``engine.metrics.definition1_check``, which samples the pairs this module enumerates.

The empirical compatibility criterion (ECC, paper 000 Eq. 7, paper 001 Eq. 6) compares Recall@1 of
the cross-test (new queries, old gallery) with the old self-test, both leave-one-out on one set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from engine.metrics import ecc_pass
from engine.metrics.retrieval import retrieval_metrics

Distance = Literal["cosine", "euclidean"]
Reference = Literal["old", "new"]


def two_model_clusters(
    *,
    num_classes: int = 3,
    per_class: int = 6,
    spread_old: float = 0.3,
    spread_new: float = 0.2,
    drift_deg: float = 0.0,
    shared_noise: float = 0.0,
    seed: int = 0,
) -> pd.DataFrame:
    """Old and new 2-D features of the same ``num_classes * per_class`` images.

    Class c sits at angle 360 c / num_classes on the unit circle in the old model and at that angle
    plus ``drift_deg`` in the new one. Each image gets isotropic Gaussian noise of scale
    ``spread_old`` in the old model and ``spread_new`` in the new one; ``shared_noise`` in [0, 1] is
    the correlation of an image's two noise draws (1: the new model makes the same error as the
    old, scaled; 0: independent errors). Columns: ``image``, ``label``, ``old_x``, ``old_y``,
    ``new_x``, ``new_y``.
    """
    if num_classes < 2 or per_class < 2:
        raise ValueError(f"Definition 1 needs >= 2 classes with >= 2 images each, got {num_classes} x {per_class}")
    if spread_old < 0 or spread_new < 0:
        raise ValueError(f"spreads must be >= 0, got {spread_old} and {spread_new}")
    if not 0.0 <= shared_noise <= 1.0:
        raise ValueError(f"shared_noise is a correlation in [0, 1], got {shared_noise}")
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(num_classes), per_class)
    angle = 2 * np.pi * labels / num_classes
    drift = np.deg2rad(drift_deg)
    z_old = rng.standard_normal((len(labels), 2))
    z_new = shared_noise * z_old + np.sqrt(1.0 - shared_noise**2) * rng.standard_normal((len(labels), 2))
    old = np.stack([np.cos(angle), np.sin(angle)], 1) + spread_old * z_old
    new = np.stack([np.cos(angle + drift), np.sin(angle + drift)], 1) + spread_new * z_new
    return pd.DataFrame({"image": np.arange(len(labels)), "label": labels, "old_x": old[:, 0], "old_y": old[:, 1],
                         "new_x": new[:, 0], "new_y": new[:, 1]})


def pairwise_distances(a: np.ndarray, b: np.ndarray, distance: Distance = "cosine") -> np.ndarray:
    """``D[i, j] = d(a_i, b_j)``: cosine distance 1 - cos (L2-normalised rows) or Euclidean distance."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if distance == "cosine":
        na = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
        nb = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
        return 1.0 - na @ nb.T
    if distance == "euclidean":
        return np.sqrt(np.maximum(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1), 0.0))
    raise ValueError(f"distance must be 'cosine' or 'euclidean', got {distance!r}")


def definition1_pairs(
    old: np.ndarray,
    new: np.ndarray,
    labels: np.ndarray,
    *,
    distance: Distance = "cosine",
    reference_1b: Reference = "old",
) -> pd.DataFrame:
    """One row per ordered pair (i, j), i != j: which inequality applies, both sides, and whether it holds.

    Columns: ``i``, ``j``, ``inequality`` ("1a" same class / "1b" different class), ``cross`` =
    d(h_i^k, h_j^t), ``reference`` (d(h_i^k, h_j^k) for 1a; for 1b the ``reference_1b`` model's
    d(h_i, h_j)) and ``holds``. Ties hold (the definition uses <= and >=).
    """
    if reference_1b not in ("old", "new"):
        raise ValueError(f"reference_1b must be 'old' or 'new', got {reference_1b!r}")
    old, new, labels = np.asarray(old), np.asarray(new), np.asarray(labels)
    if old.shape != new.shape or old.shape[0] != labels.shape[0]:
        raise ValueError(f"old {old.shape}, new {new.shape} and labels {labels.shape} must describe the same images")
    cross = pairwise_distances(old, new, distance)
    old_old = pairwise_distances(old, old, distance)
    ref_1b = old_old if reference_1b == "old" else pairwise_distances(new, new, distance)
    i, j = np.nonzero(~np.eye(len(labels), dtype=bool))
    same = labels[i] == labels[j]
    reference = np.where(same, old_old[i, j], ref_1b[i, j])
    holds = np.where(same, cross[i, j] <= reference, cross[i, j] >= reference)
    return pd.DataFrame({"i": i, "j": j, "inequality": np.where(same, "1a", "1b"), "cross": cross[i, j],
                         "reference": reference, "holds": holds})


def violation_counts(pairs: pd.DataFrame) -> dict[str, int]:
    """Pairs and violations of each inequality: ``1a_pairs``, ``1a_violated``, ``1b_pairs``, ``1b_violated``."""
    out: dict[str, int] = {}
    for name in ("1a", "1b"):
        rows = pairs[pairs["inequality"] == name]
        out[f"{name}_pairs"] = int(len(rows))
        out[f"{name}_violated"] = int((~rows["holds"]).sum())
    return out


def ecc_numbers(old: np.ndarray, new: np.ndarray, labels: np.ndarray) -> dict[str, float | bool]:
    """Recall@1 (cosine, leave-one-out by index) of the old self-test, the cross-test and the new self-test.

    ``passes`` is ECC: cross-test > old self-test, strict (``engine.metrics.ecc_pass``).
    """
    old, new, labels = (np.array(a) for a in (old, new, labels))  # writable copies (torch warns on read-only views)

    def recall1(query: np.ndarray, gallery: np.ndarray) -> float:
        return float(retrieval_metrics(query, labels, gallery, labels, ks=(1,), same_set=True, compute_map=False)["recall@1"])

    old_self, cross, new_self = recall1(old, old), recall1(new, old), recall1(new, new)
    C = np.array([[old_self, np.nan], [cross, new_self]])
    return {"old_self": old_self, "cross": cross, "new_self": new_self, "passes": bool(ecc_pass(C)[1, 0] == 1.0)}


@dataclass(frozen=True)
class Definition1Demo:
    """Everything the page draws: the points, every pair, the counts and the ECC numbers."""

    points: pd.DataFrame
    pairs: pd.DataFrame
    counts: dict[str, int]
    ecc: dict[str, float | bool]


def definition1_demo(
    points: pd.DataFrame, *, distance: Distance = "cosine", reference_1b: Reference = "old"
) -> Definition1Demo:
    """Evaluate Definition 1 on every pair and ECC on Recall@1 for the two models of ``two_model_clusters``."""
    old = points[["old_x", "old_y"]].to_numpy()
    new = points[["new_x", "new_y"]].to_numpy()
    labels = points["label"].to_numpy()
    pairs = definition1_pairs(old, new, labels, distance=distance, reference_1b=reference_1b)
    return Definition1Demo(points, pairs, violation_counts(pairs), ecc_numbers(old, new, labels))
