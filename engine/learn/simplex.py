"""The probability simplex of paper 000: softmax outputs, the centring projection and Props. 1-2.

* Softmax outputs of a C-class model lie on the simplex Delta^{C-1} (Def. 2); for C = 3 it is a
  triangle drawn here in barycentric coordinates.
* PSP (Eq. 2-3): centre with P = I - J/C and L2-normalise. The centred vectors live in the
  (C-1)-dimensional plane orthogonal to (1, ..., 1); for C = 3 the normalised ones lie on a circle.
* Class prototypes (Eq. 5): v_y = e_y - o, o = (1/C) 1, i.e. the rows of P.
* Prop. 1: the prototype of a class added at step t is orthogonal to the (zero-padded) old ones.
* Prop. 2: P_{t,k} = [P_{k,k} | 0] maps every new prototype v_y^t (y <= C^k) exactly onto v_y^k.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from engine.models.extract import simplex_projection

# corners of the 2-D drawing of the 3-class simplex: class 0 bottom left, 1 bottom right, 2 on top
TRIANGLE = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, np.sqrt(3.0) / 2.0]])


def centring_matrix(num_classes: int) -> np.ndarray:
    """P_{k,k} = I - J/C (paper 000 Eq. 3); its rows are the prototypes v_y = e_y - o (Eq. 5)."""
    if num_classes < 2:
        raise ValueError(f"the simplex needs at least 2 classes, got {num_classes}")
    return np.eye(num_classes) - np.full((num_classes, num_classes), 1.0 / num_classes)


def cross_projection(new_classes: int, old_classes: int) -> np.ndarray:
    """P_{t,k} = [P_{k,k} | 0] of shape (C^k, C^t) (Eq. 4, with the zero block's shape corrected)."""
    if not 2 <= old_classes <= new_classes:
        raise ValueError(f"need 2 <= C^k <= C^t, got C^k={old_classes} and C^t={new_classes}")
    return np.hstack([centring_matrix(old_classes), np.zeros((old_classes, new_classes - old_classes))])


def plane_basis(num_classes: int) -> np.ndarray:
    """An orthonormal basis (rows, shape (C-1, C)) of the plane orthogonal to (1, ..., 1).

    Row m (m = 1 .. C-1) is ``(-1, ..., -1, m, 0, ..., 0) / sqrt(m (m+1))`` with m entries -1
    (a negated Helmert basis). Coordinates in it draw centred C-vectors without distortion; for
    C = 3 class 0 lands bottom left, class 1 bottom right and class 2 on top, like ``TRIANGLE``.
    """
    if num_classes < 2:
        raise ValueError(f"the simplex needs at least 2 classes, got {num_classes}")
    basis = np.zeros((num_classes - 1, num_classes))
    for m in range(1, num_classes):
        basis[m - 1, :m] = -1.0
        basis[m - 1, m] = m
        basis[m - 1] /= np.sqrt(m * (m + 1))
    return basis


def softmax_cloud(
    *, num_classes: int = 3, per_class: int = 40, confidence: float = 3.0, noise: float = 1.0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax outputs of a toy C-class model: logits = ``confidence`` * e_y + ``noise`` * N(0, I).

    Returns ``(probs (n, C), labels (n,))``. Higher confidence pushes the points towards the
    vertices (neural collapse); more noise spreads them inside the simplex.
    """
    if per_class < 1 or confidence < 0 or noise < 0:
        raise ValueError("per_class must be >= 1 and confidence, noise >= 0")
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(num_classes), per_class)
    logits = confidence * np.eye(num_classes)[labels] + noise * rng.standard_normal((len(labels), num_classes))
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    return probs / probs.sum(axis=1, keepdims=True), labels


def barycentric_xy(probs: np.ndarray) -> np.ndarray:
    """2-D position of 3-class probability vectors inside ``TRIANGLE`` (a convex combination of its corners)."""
    probs = np.asarray(probs, np.float64)
    if probs.ndim != 2 or probs.shape[1] != 3:
        raise ValueError(f"the barycentric drawing needs 3-class probabilities, got shape {probs.shape}")
    return probs @ TRIANGLE


def psp_xy(outputs: np.ndarray, gallery_classes: int) -> np.ndarray:
    """PSP features (``engine.models.extract.simplex_projection``) of ``outputs`` for a C^k-class gallery, drawn in
    the plane of that simplex: shape (n, C^k - 1), unit norm (a circle when C^k = 3)."""
    feats = simplex_projection(torch.as_tensor(np.asarray(outputs), dtype=torch.float64), gallery_classes).numpy()
    return feats @ plane_basis(gallery_classes).T


def simplex_points(
    *, new_classes: int = 4, per_class: int = 40, confidence: float = 3.0, noise: float = 1.0, seed: int = 0
) -> pd.DataFrame:
    """The two models of the page: an old 3-class model and a new ``new_classes``-class model.

    Rows: ``model`` ("old": 3 classes / "new": ``new_classes`` classes), ``label``, ``p0..p2`` (old
    probabilities, NaN for the new model), ``bx, by`` (barycentric drawing, old model only) and
    ``px, py``: the PSP feature against the old 3-class gallery (new model through P_{t,3}).
    """
    old_probs, old_labels = softmax_cloud(num_classes=3, per_class=per_class, confidence=confidence, noise=noise, seed=seed)
    new_probs, new_labels = softmax_cloud(num_classes=new_classes, per_class=per_class, confidence=confidence,
                                          noise=noise, seed=seed + 1)
    old_xy, new_xy = psp_xy(old_probs, 3), psp_xy(new_probs, 3)
    bxy = barycentric_xy(old_probs)
    old = pd.DataFrame({"model": "old", "label": old_labels, "p0": old_probs[:, 0], "p1": old_probs[:, 1],
                        "p2": old_probs[:, 2], "bx": bxy[:, 0], "by": bxy[:, 1], "px": old_xy[:, 0], "py": old_xy[:, 1]})
    new = pd.DataFrame({"model": "new", "label": new_labels, "p0": np.nan, "p1": np.nan,
                        "p2": np.nan, "bx": np.nan, "by": np.nan, "px": new_xy[:, 0], "py": new_xy[:, 1]})
    return pd.concat([old, new], ignore_index=True)


def prototype_table(new_classes: int, old_classes: int = 3) -> pd.DataFrame:
    """Prop. 2 row by row: v_y^t, P_{t,k} v_y^t, v_y^k and their largest absolute difference, y < C^k."""
    P_tk = cross_projection(new_classes, old_classes)
    V_t, V_k = centring_matrix(new_classes), centring_matrix(old_classes)
    rows = []
    for y in range(old_classes):
        projected = P_tk @ V_t[y]
        rows.append({"class": y, "v_y^t (new)": _fmt(V_t[y]), "P_tk v_y^t": _fmt(projected), "v_y^k (old)": _fmt(V_k[y]),
                     "max |P_tk v_y^t - v_y^k|": float(np.max(np.abs(projected - V_k[y])))})
    return pd.DataFrame(rows)


def orthogonality_table(new_classes: int, old_classes: int = 3) -> pd.DataFrame:
    """Prop. 1: cosine between each added class's prototype v_c^t and each zero-padded old prototype v_y^k."""
    V_t, V_k = centring_matrix(new_classes), centring_matrix(old_classes)
    padded = np.hstack([V_k, np.zeros((old_classes, new_classes - old_classes))])
    rows = []
    for c in range(old_classes, new_classes):
        for y in range(old_classes):
            cos = V_t[c] @ padded[y] / (np.linalg.norm(V_t[c]) * np.linalg.norm(padded[y]))
            rows.append({"new class": c, "old class": y, "cos(v_c^t, [v_y^k, 0])": float(cos)})
    return pd.DataFrame(rows)


def prototype_xy(num_classes: int = 3) -> pd.DataFrame:
    """The normalised prototypes v_y / ||v_y|| in the plane of ``plane_basis`` (columns ``label``, ``px``, ``py``)."""
    V = centring_matrix(num_classes)
    xy = (V / np.linalg.norm(V, axis=1, keepdims=True)) @ plane_basis(num_classes).T
    return pd.DataFrame({"label": np.arange(num_classes), "px": xy[:, 0], "py": xy[:, 1]})


def _fmt(v: np.ndarray) -> str:
    return "(" + ", ".join(f"{x:+.3f}" for x in v) + ")"
