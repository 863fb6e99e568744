"""Paper 001's Monte-Carlo check of Definition 1 on hyperspherical caps (Appendix A, Fig. 12).

Features of class y under the old model k are uniform on the cap C(w_y, theta_k) of S^{d-1}
around the d-Simplex prototype w_y; under the new model t on the concentric cap C(w_y, theta_t),
theta_t <= theta_k (A3, "the caps shrink"). The models are independent (A2). With the cosine
distance g(a, b) = 1 - a.b the paper estimates

* same class:      E[D_{k,t}] = E g(H_k^y, H_t^y)   vs  E[D_{k,k}] = E g(H_k^y, H'_k^y)   (1a: <=)
* different class: E[D_{k,t}] = E g(H_k^y, H_t^y')  vs  E[D_{k,k}] = E g(H_k^y, H'_k^y')  (1b: >=)

The appendix prints the different-class line with "<="; (1b) and Fig. 12(b) need ">=" (the
extraction's typo note), which is what is checked here. Paper 000 writes (1b) against the *new*
model, E[D_{t,t}]; ``cap_expectations`` reports that reference too.

Because the caps are rotationally symmetric and the models independent, E[a.b] = m_a m_b cos(alpha)
with m(theta, d) = E[cos psi] the mean resultant length of a uniform cap and alpha the angle
between the prototypes (cos alpha = 1 same class, -1/d for two d-Simplex vertices): the same
closed form as paper 000's vMF proof (Eq. 11), which the page shows next to the Monte-Carlo.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from engine.models import dsimplex_prototypes

_GRID = 4097


def _cap_density(theta: float, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Polar angles on [0, theta], the (unnormalised) density sin^{d-2} of a uniform cap there, and
    trapezoid weights; computed in log space so that large d does not underflow."""
    psi = np.linspace(0.0, theta, _GRID)
    with np.errstate(divide="ignore"):
        log_density = (dim - 2) * np.log(np.sin(psi)) if dim > 2 else np.zeros_like(psi)
    weights = np.full(_GRID, psi[1] - psi[0])
    weights[[0, -1]] /= 2
    return psi, np.exp(log_density - log_density.max()), weights


def _polar_grid(theta: float, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Polar angles on [0, theta] and the cumulative distribution of the polar angle of a uniform cap."""
    psi, density, _ = _cap_density(theta, dim)
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (density[1:] + density[:-1]) * np.diff(psi))])
    return psi, cdf / cdf[-1]


def sample_cap(center: np.ndarray, theta: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` points uniform on the cap of S^{d-1} within angle ``theta`` of the unit vector ``center``.

    The polar angle psi has density proportional to sin^{d-2}(psi) on [0, theta] (inverse CDF on a
    fine grid); the direction u is uniform among unit vectors orthogonal to ``center``; the point is
    cos(psi) center + sin(psi) u (the extraction's recipe for Fig. 12). Returned as float32 (n, d):
    the expectations are averages of O(1) values, and float32 halves the time at large d.
    """
    center = np.asarray(center, np.float64)
    dim = center.shape[0]
    if dim < 2 or not np.isclose(np.linalg.norm(center), 1.0):
        raise ValueError("the cap centre must be a unit vector of dimension >= 2")
    if not 0.0 <= theta <= np.pi:
        raise ValueError(f"the cap angle must lie in [0, pi], got {theta}")
    c = center.astype(np.float32)
    if theta == 0.0:
        return np.tile(c, (size, 1))
    psi_grid, cdf = _polar_grid(theta, dim)
    psi = np.interp(rng.random(size), cdf, psi_grid)
    u = rng.standard_normal((size, dim), dtype=np.float32)
    for _ in range(2):  # the part of a Gaussian vector orthogonal to c (twice: float32 cancellation when d = 2)
        u -= np.outer(u @ c, c)
    u *= (np.sin(psi) / np.maximum(np.linalg.norm(u, axis=1), 1e-30)).astype(np.float32)[:, None]
    u += np.cos(psi).astype(np.float32)[:, None] * c[None, :]
    return u


def mean_resultant_length(theta: float, dim: int) -> float:
    """m(theta, d) = E[cos psi] of a uniform cap of angle ``theta`` (radians) on S^{d-1}."""
    if theta == 0.0:
        return 1.0
    psi, density, weights = _cap_density(theta, dim)
    return float((weights * density * np.cos(psi)).sum() / (weights * density).sum())


def prototype_pair(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Two vertices of the d-Simplex in R^d (``engine.models.dsimplex_prototypes(d + 1)``), cosine -1/d."""
    W = dsimplex_prototypes(dim + 1).to(torch.float64).numpy()
    return W[0] / np.linalg.norm(W[0]), W[1] / np.linalg.norm(W[1])


QUANTITIES = ("E[D_kt]", "E[D_kk]", "E[D_tt]")
# inequality read in expectation: (name, case, reference quantity, required sign of E[D_kt] - reference)
INEQUALITIES = (("1a", "same class", "E[D_kk]", "<= 0"),
                ("1b_old", "different class", "E[D_kk]", ">= 0"),
                ("1b_new", "different class", "E[D_tt]", ">= 0"))


def cap_expectations(
    *, dim: int = 16, theta_old_deg: float = 40.0, theta_new_deg: float = 20.0, samples: int = 20_000, seed: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Monte-Carlo and closed-form expected cosine distances, and the inequalities they imply.

    Returns ``(distances, inequalities)`` from one set of draws:

    * ``distances``: one row per (``case`` in {"same class", "different class"}, ``quantity`` in
      ``QUANTITIES``) with ``monte_carlo`` (mean over ``samples`` pairs), its ``std_error`` and
      ``closed_form`` = 1 - m_a m_b cos(alpha).
    * ``inequalities``: one row per ``INEQUALITIES`` entry: ``inequality`` ("1a"; "1b_old" / "1b_new"
      with the old / new model as (1b)'s reference), ``reference``, ``wanted`` (the sign E[D_kt] -
      reference must have), its ``monte_carlo`` and ``closed_form`` values, the paired
      ``std_error``, ``holds_mc``, ``holds_closed_form`` and ``resolved`` (|monte_carlo| > 2
      std_error: the sign is not Monte-Carlo noise).

    The class-y features are shared by D_kt, D_kk and D_tt (common random numbers), so the
    differences the inequalities are about are less noisy than the means.
    """
    if dim < 2:
        raise ValueError(f"the hypersphere S^(d-1) needs d >= 2, got {dim}")
    if samples < 2:
        raise ValueError(f"need at least 2 Monte-Carlo samples, got {samples}")
    th_k, th_t = np.deg2rad(theta_old_deg), np.deg2rad(theta_new_deg)
    rng = np.random.default_rng(seed)
    w_y, w_other = prototype_pair(dim)
    m_k, m_t = mean_resultant_length(th_k, dim), mean_resultant_length(th_t, dim)
    rows, draws, closed = [], {}, {}
    for case, w2 in (("same class", w_y), ("different class", w_other)):
        cos_alpha = float(w_y @ w2)
        old_y, new_y = sample_cap(w_y, th_k, samples, rng), sample_cap(w_y, th_t, samples, rng)
        old_2, new_2 = sample_cap(w2, th_k, samples, rng), sample_cap(w2, th_t, samples, rng)
        pairs = {"E[D_kt]": (old_y, new_2, m_k * m_t), "E[D_kk]": (old_y, old_2, m_k * m_k),
                 "E[D_tt]": (new_y, new_2, m_t * m_t)}
        for quantity, (a, b, mm) in pairs.items():
            g = 1.0 - np.einsum("ij,ij->i", a, b).astype(np.float64)
            draws[case, quantity], closed[case, quantity] = g, 1.0 - mm * cos_alpha
            rows.append({"case": case, "quantity": quantity, "monte_carlo": float(g.mean()),
                         "std_error": float(g.std(ddof=1) / np.sqrt(samples)), "closed_form": closed[case, quantity]})
    checks = []
    for name, case, reference, wanted in INEQUALITIES:
        delta = draws[case, "E[D_kt]"] - draws[case, reference]
        mc, se = float(delta.mean()), float(delta.std(ddof=1) / np.sqrt(samples))
        cf = closed[case, "E[D_kt]"] - closed[case, reference]
        checks.append({"inequality": name, "reference": reference, "wanted": wanted, "monte_carlo": mc,
                       "std_error": se, "closed_form": cf, "holds_mc": _has_sign(mc, wanted),
                       "holds_closed_form": _has_sign(cf, wanted), "resolved": bool(abs(mc) > 2 * se)})
    return pd.DataFrame(rows), pd.DataFrame(checks)


def _has_sign(value: float, wanted: str) -> bool:
    return bool(value <= 0) if wanted == "<= 0" else bool(value >= 0)


def distances_vs_dimension(
    dims: list[int] | tuple[int, ...], *, theta_old_deg: float, theta_new_deg: float, samples: int = 4000, seed: int = 0
) -> pd.DataFrame:
    """Fig. 12: the ``distances`` of ``cap_expectations`` for each d in ``dims``, stacked with a ``dim`` column."""
    frames = [cap_expectations(dim=d, theta_old_deg=theta_old_deg, theta_new_deg=theta_new_deg, samples=samples,
                               seed=seed + i)[0].assign(dim=d) for i, d in enumerate(dims)]
    return pd.concat(frames, ignore_index=True)


def distances_vs_shrink(*, dim: int, theta_old_deg: float, steps: int = 13) -> pd.DataFrame:
    """Closed-form expected distances as the new cap shrinks from ``theta_old_deg`` to 0.

    Columns ``theta_new_deg``, ``case``, ``quantity``, ``value``: the curves behind "as the caps
    shrink" (cheap enough to draw at every slider move).
    """
    w_y, w_other = prototype_pair(dim)
    m_k = mean_resultant_length(np.deg2rad(theta_old_deg), dim)
    rows = []
    for theta_new in np.linspace(theta_old_deg, 0.0, steps):
        m_t = mean_resultant_length(np.deg2rad(theta_new), dim)
        for case, cos_alpha in (("same class", 1.0), ("different class", float(w_y @ w_other))):
            for quantity, mm in zip(QUANTITIES, (m_k * m_t, m_k * m_k, m_t * m_t)):
                rows.append({"theta_new_deg": float(theta_new), "case": case, "quantity": quantity,
                             "value": 1.0 - mm * cos_alpha})
    return pd.DataFrame(rows)
