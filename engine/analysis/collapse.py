"""Neural-collapse diagnostics NC1-NC4 (paper 000, Appendix E) as pure functions on arrays.

Notation: h_i are the features, mu_y the class means over the classes present in ``labels``,
mu_G the mean of the class means (Appendix E's definition; equal to the global mean when classes are
balanced), C the number of classes present. Every value goes to 0 under perfect collapse.
"""
from __future__ import annotations

import numpy as np


def class_means(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(classes, means, index)``: sorted labels present, their ``(C, D)`` means, each sample's class index."""
    features = np.asarray(features, dtype=np.float64)
    labels = np.asarray(labels)
    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise ValueError(f"expected (N, D) features and (N,) labels, got {features.shape} and {labels.shape}")
    classes, index = np.unique(labels, return_inverse=True)
    if classes.size < 2:
        raise ValueError(f"neural-collapse metrics need at least 2 classes, got {classes.size}")
    sums = np.zeros((classes.size, features.shape[1]))
    np.add.at(sums, index, features)
    means = sums / np.bincount(index)[:, None]
    return classes, means, index


def _centred_means(features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    _, means, _ = class_means(features, labels)
    return means - means.mean(axis=0, keepdims=True)


def nc1_variability(features: np.ndarray, labels: np.ndarray, *, rtol: float = 1e-10) -> float:
    """NC1 = Tr(Sigma_W Sigma_B^+) / C (Papyan et al. 2020).

    Sigma_W = within-class covariance over all samples, Sigma_B = covariance of the centred class
    means; the pseudo-inverse keeps the at most C-1 eigen-directions of Sigma_B above ``rtol`` times
    its largest eigenvalue. NaN when all class means coincide.
    """
    features = np.asarray(features, dtype=np.float64)
    classes, means, index = class_means(features, labels)
    centred_means = means - means.mean(axis=0, keepdims=True)
    # Sigma_B = centred_means^T centred_means / C = V diag(s^2 / C) V^T
    _, singular, right = np.linalg.svd(centred_means, full_matrices=False)
    eigenvalues = singular**2 / classes.size
    if eigenvalues.size == 0 or eigenvalues[0] <= 0:
        return float("nan")
    keep = eigenvalues > rtol * eigenvalues[0]
    keep[classes.size - 1 :] = False
    within = features - means[index]
    projected = within @ right[keep].T  # coordinates of h_i - mu_y on Sigma_B's eigenvectors
    within_variance = (projected**2).mean(axis=0)  # v_j^T Sigma_W v_j
    return float((within_variance / eigenvalues[keep]).sum() / classes.size)


def nc2_equinorm(features: np.ndarray, labels: np.ndarray) -> float:
    """NC2 equinorm: std / mean of the norms ||mu_y - mu_G|| (population std)."""
    norms = np.linalg.norm(_centred_means(features, labels), axis=1)
    return float(norms.std() / norms.mean())


def nc2_equiangularity(features: np.ndarray, labels: np.ndarray) -> float:
    """NC2 equiangularity: mean over y != y' of |cos(mu_y - mu_G, mu_y' - mu_G) + 1/(C-1)|."""
    centred = _centred_means(features, labels)
    unit = centred / np.linalg.norm(centred, axis=1, keepdims=True)
    count = unit.shape[0]
    cosines = unit @ unit.T
    off_diagonal = ~np.eye(count, dtype=bool)
    return float(np.abs(cosines[off_diagonal] + 1.0 / (count - 1)).mean())


def nc3_self_duality(features: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> float:
    """NC3 = || W/||W||_F - M/||M||_F ||_F with M the centred class means stacked as rows.

    ``weights`` has one row per class label (row y = classifier row or prototype of class y; put a
    fixed head's rows in class order first); only the rows of the classes present are used. For
    softmax/logit (PSP/LSP) features pass ``probability_simplex_prototypes(C^k)`` (Appendix E).
    """
    classes, means, _ = class_means(features, labels)
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 2 or weights.shape[1] != means.shape[1] or weights.shape[0] <= classes.max():
        raise ValueError(
            f"weights of shape {weights.shape} cannot describe classes up to {classes.max()} "
            f"with {means.shape[1]}-d features; expected (num_classes, {means.shape[1]})"
        )
    rows = weights[classes]
    centred = means - means.mean(axis=0, keepdims=True)
    return float(np.linalg.norm(rows / np.linalg.norm(rows) - centred / np.linalg.norm(centred)))


def nearest_class_mean(features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Label of the nearest class mean (Euclidean) for every sample."""
    classes, means, _ = class_means(features, labels)
    features = np.asarray(features, dtype=np.float64)
    distances = (features**2).sum(axis=1, keepdims=True) - 2 * features @ means.T + (means**2).sum(axis=1)
    return classes[distances.argmin(axis=1)]


def nc4_ncc_mismatch(features: np.ndarray, labels: np.ndarray, predictions: np.ndarray) -> float:
    """NC4: fraction of samples whose network prediction (a class label) differs from the nearest class mean."""
    predictions = np.asarray(predictions)
    if predictions.shape != np.asarray(labels).shape:
        raise ValueError(f"expected one prediction per sample, got {predictions.shape} for {np.asarray(labels).shape}")
    return float((nearest_class_mean(features, labels) != predictions).mean())


def probability_simplex_prototypes(num_classes: int) -> np.ndarray:
    """V^k = I - J/C (paper 000 Eq. 5): row y is the prototype e_y - o of class y."""
    if num_classes < 2:
        raise ValueError(f"the probability simplex needs at least 2 classes, got {num_classes}")
    return np.eye(num_classes) - 1.0 / num_classes


def collapse_report(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    weights: np.ndarray | None = None,
    predictions: np.ndarray | None = None,
) -> dict[str, float]:
    """NC1, NC2 (equinorm, equiangularity) and, when their inputs are given, NC3 and NC4."""
    report = {
        "nc1": nc1_variability(features, labels),
        "nc2_equinorm": nc2_equinorm(features, labels),
        "nc2_equiangularity": nc2_equiangularity(features, labels),
    }
    if weights is not None:
        report["nc3"] = nc3_self_duality(features, labels, weights)
    if predictions is not None:
        report["nc4"] = nc4_ncc_mismatch(features, labels, predictions)
    return report
