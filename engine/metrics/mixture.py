"""Signs that one set of vectors holds two models' embeddings (the doctor's tests, issue 42 item 4): pure functions
over arrays, each returning its statistic, its groups and its verdict against a threshold stated here.

- :func:`zero_tails`: how many trailing coordinates of each row are exactly zero (a smaller model's vectors padded
  with zeros to the store's width).
- :func:`norm_mixture`: one against two Gaussian components on the log-norms (scikit-learn ``GaussianMixture``), by
  BIC, with the components' separation (Ashman's D) so a skewed single population is not read as two.
- :func:`space_split`: the sample's graph of pairs whose cosine is beyond chance for unrelated directions
  (``|cos| > Z / sqrt(d)``), bisected spectrally (regularised normalised adjacency, the sweep of least conductance);
  two models' vectors are near-orthogonal across spaces, so their graph splits with almost no edge between the parts,
  while one model's vectors share directions and keep many.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_SHARE = 0.05  # a group smaller than this share of the sample is not called a second model (outliers)
# norms: two components when BIC prefers them by more than DELTA_BIC (Kass & Raftery's "very strong") and they lie
# apart by Ashman's D >= SEPARATION (D > 2 is a clean bimodal split; 3 leaves room for a skewed or lumpy single model)
DELTA_BIC, SEPARATION = 10.0, 3.0
FLAT_LOG_NORM = 1e-4  # log-norms spread less than this: every vector has the same norm (e.g. unit), no norm evidence
# neighbours: an edge is a pair with |cos| > Z_EDGE / sqrt(d) (4 sigma for unrelated directions); two spaces when the
# best bisection keeps at most CROSS_SHARE of the edges across; no verdict when the graph has under MIN_DENSITY of
# all pairs as edges (isotropic noise: nothing to split). CROSS_SHARE 0.08 lies a factor 2.5 from each side of what
# bench/doctor_minilm.py measures on real 384-d MiniLM embeddings: L6 alone 0.20, L3 alone 0.23, L6 + L3 mixed
# 0.016-0.034 (related models: their cross pairs are not quite chance); synthetic rotations: 0.39 clean, 0.0000 mixed
Z_EDGE, CROSS_SHARE, MIN_DENSITY = 4.0, 0.08, 0.01
BLOCK = 512  # rows of the graph computed at a time (memory: the graph, n x n float32, and BLOCK x n more)


@dataclass(frozen=True)
class Split:
    """A two-group reading of a sample: ``groups`` (0/1 per row, 1 = the minor group), its statistic and verdict
    (``mixed``, ``clean`` or ``undecided``), and the numbers behind it."""

    verdict: str
    groups: np.ndarray
    stats: dict[str, float | None]


def zero_tails(x: np.ndarray) -> np.ndarray:
    """Per row, the number of trailing coordinates that are exactly 0 (an all-zero row: its full width)."""
    nz = np.asarray(x) != 0
    d = nz.shape[1]
    last = d - np.argmax(nz[:, ::-1], axis=1)  # one past the last nonzero
    return np.where(nz.any(axis=1), d - last, d)


def min_tail(d: int) -> int:
    """Trailing zeros that mark a row as padded: a quarter of the width, at least 8 (a dense vector's last 8
    coordinates are all exactly 0 by chance almost never; sparse ReLU features may come near, see docs)."""
    return max(8, d // 4)


def norm_mixture(norms: np.ndarray, *, seed: int = 0) -> Split:
    """One or two populations of ``log(norm)`` (zero norms left out): ``delta_bic`` = BIC(1) - BIC(2),
    ``separation`` (Ashman's D of the two components), ``minor_share``; mixed when all three pass their thresholds."""
    from sklearn.mixture import GaussianMixture

    norms = np.asarray(norms, np.float64)
    groups = np.zeros(len(norms), np.int64)
    keep = norms > 0
    ln = np.log(norms[keep])[:, None]
    if len(ln) < 10 or ln.std() < FLAT_LOG_NORM:
        return Split("undecided", groups, {"delta_bic": 0.0, "separation": 0.0, "minor_share": 0.0,
                                           "log_norm_std": float(ln.std()) if len(ln) else 0.0})
    one = GaussianMixture(1, random_state=seed).fit(ln)
    two = GaussianMixture(2, random_state=seed, n_init=3).fit(ln)
    delta = float(one.bic(ln) - two.bic(ln))
    mu, var = two.means_.ravel(), two.covariances_.ravel()
    separation = float(np.sqrt(2) * abs(mu[0] - mu[1]) / np.sqrt(var.sum()))
    label = two.predict(ln)
    minor = int(np.argmin(np.bincount(label, minlength=2)))
    groups[keep] = (label == minor).astype(np.int64)
    share = float(groups.mean())
    mixed = delta > DELTA_BIC and separation >= SEPARATION and share >= MIN_SHARE
    return Split("mixed" if mixed else "clean", groups,
                 {"delta_bic": delta, "separation": separation, "minor_share": share,
                  "log_norm_std": float(ln.std())})


def space_split(x: np.ndarray, *, seed: int = 0) -> Split:
    """Bisect the sample ``x`` (n, d) by its graph of beyond-chance cosines (module docstring): ``cross_edge_share``
    (edges across the cut / all edges), ``density`` (edges / pairs), ``minor_share``; mixed when the cut keeps at most
    :data:`CROSS_SHARE` of the edges and the minor group is at least :data:`MIN_SHARE` of the sample."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    from engine.core.norms import unit_rows_np

    u = unit_rows_np(np.asarray(x, np.float32))
    n, d = u.shape
    groups = np.zeros(n, np.int64)
    a = np.empty((n, n), np.float32)  # the one n x n array held (rows computed a block at a time)
    for lo in range(0, n, BLOCK):
        a[lo:lo + BLOCK] = np.abs(u[lo:lo + BLOCK] @ u.T) > Z_EDGE / np.sqrt(d)
    np.fill_diagonal(a, 0)
    deg = a.sum(axis=1, dtype=np.float64)
    total = float(deg.sum())
    density = total / max(n * (n - 1), 1)
    if n < 20 or density < MIN_DENSITY:
        return Split("undecided", groups, {"cross_edge_share": None, "density": density, "minor_share": 0.0})
    tau = 0.1 * deg.mean()  # regularised spectral clustering: small stray components cannot take the split
    scale = 1 / np.sqrt(deg + tau)

    def matvec(v: np.ndarray) -> np.ndarray:
        w = scale * np.ravel(v)
        return scale * (a @ w.astype(np.float32) + tau / n * w.sum())

    op = LinearOperator((n, n), matvec=matvec, dtype=np.float64)
    v0 = np.random.default_rng(seed).standard_normal(n)
    _, vecs = eigsh(op, k=2, which="LA", v0=v0, tol=1e-6)
    order = np.argsort(vecs[:, 0] * scale, kind="stable")  # the second eigenvector (eigsh sorts ascending)
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    earlier = np.empty(n)  # per row: its edges to rows before it in the order
    for lo in range(0, n, BLOCK):
        rows = order[lo:lo + BLOCK]
        earlier[lo:lo + len(rows)] = (a[rows] * (rank[None, :] < rank[rows, None])).sum(axis=1, dtype=np.float64)
    inside = np.cumsum(earlier)  # edges within the first t rows
    vol = np.cumsum(deg[order])
    cut = vol - 2 * inside
    t = np.arange(1, n + 1)
    allowed = (t >= np.ceil(MIN_SHARE * n)) & (t <= np.floor((1 - MIN_SHARE) * n))
    conductance = np.where(allowed, cut / np.maximum(np.minimum(vol, total - vol), 1e-12), np.inf)
    b = int(np.argmin(conductance))
    first = np.zeros(n, bool)
    first[order[:b + 1]] = True
    groups = (first if first.sum() <= n / 2 else ~first).astype(np.int64)
    cross = float(2 * cut[b] / total)  # cut edges / all edges (the degrees count each edge twice)
    share = float(groups.mean())
    mixed = cross <= CROSS_SHARE and share >= MIN_SHARE
    return Split("mixed" if mixed else "clean", groups,
                 {"cross_edge_share": cross, "density": density, "minor_share": share})


__all__ = ["CROSS_SHARE", "DELTA_BIC", "MIN_DENSITY", "MIN_SHARE", "SEPARATION", "Z_EDGE", "Split", "min_tail",
           "norm_mixture", "space_split", "zero_tails"]
