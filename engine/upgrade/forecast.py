"""The recovery forecast: what a query-side adapter will recover, predicted before the plan fits one (torch-free).

A query-side adapter maps v2's queries onto v1's gallery, so its score on that gallery is capped near v1's own: its
share of a full re-embedding (adapted/old / new/new) is its share of today's system (adapted/old / old/old) times the
ceiling old/old / new/new (:func:`engine.upgrade.plan.recovery_rows`). The forecast reads what a check already has,
per query on its (possibly small) sample: both self-tests, and the Procrustes-bound estimate, the score on v1's gallery
of v2's queries through an orthogonal map fitted on a few hundred paired gallery items (:func:`procrustes_map`; the
plan then fits its adapters on half the gallery), with that map's residual on the queries (:func:`procrustes_residual`:
1 - mean cosine to v1's own query embeddings).

The small fit underestimates what the plan's larger fit recovers, the more so the further apart the two models are, so
the share of today's system is predicted as the sample's paired ratio adapted/old over old/old plus ``bias x
residual``, and the share of the re-embedding as that times the sample's ceiling. Each comes with a 90 % prediction
interval of half-width ``q x sqrt(tau^2 + se^2)``: ``se`` the sample's standard error of its ratio (delta method, paired
over the queries) and ``tau`` the model's own error (normalised split-conformal). The constants (:data:`CALIBRATION`)
were fitted on the evidence base of ``bench/bench_evidence.py``; :func:`validate` re-fits them leaving each run (and
each corpus) out and measures the coverage and half-width the held-out runs get.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from engine.core.norms import unit_rows_np
from engine.upgrade.plan import forecast_line

LEVEL = 0.9
TARGETS = {"coverage": 0.90, "half_width": 0.05}  # issue 37: coverage >= 90 %, half-width <= 5 points


@dataclass(frozen=True)
class Calibration:
    """The forecast's constants: the small fit's bias per unit of residual, each share's model error ``tau`` and
    conformal factor ``q``."""

    bias: float
    tau_old: float
    q_old: float
    tau_new: float
    q_new: float
    fitted_on: str = ""


# fitted by bench/bench_evidence.py on its 54 runs (the whole corpus and 648 draws of 1-10 % of the queries; validate()'s
# held-out figures are in docs/evidence/summary.json under "forecast")
CALIBRATION = Calibration(bias=0.03353, tau_old=0.01042, q_old=1.542, tau_new=0.01112, q_new=1.655,
                          fitted_on="702 samples (54 whole corpora, 648 draws) of 54 runs, bench/bench_evidence.py")


@dataclass(frozen=True)
class Forecast:
    """The predicted shares (fractions) and their prediction intervals, the ceiling and what they were read from."""

    share_of_new: float
    new_lo: float
    new_hi: float
    share_of_old: float
    old_lo: float
    old_hi: float
    ceiling: float
    residual: float
    n_queries: int
    level: float = LEVEL

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self, old: str, new: str) -> str:
        """The forecast in words (:func:`engine.upgrade.plan.forecast_line`), as the plan prints it."""
        return forecast_line(self.to_json(), old, new)


def procrustes_map(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """The orthogonal ``W`` (d x d) minimising ``||N W - O||_F`` over unit-normalised paired rows (``U V^T`` of the
    SVD of ``N^T O``); ``ValueError`` for fewer than 2 pairs or two widths."""
    n, o = unit_rows_np(new, np.float64), unit_rows_np(old, np.float64)
    if n.ndim != 2 or n.shape != o.shape or len(n) < 2:
        raise ValueError(f"a Procrustes fit needs at least 2 paired rows of one width, got {n.shape} and {o.shape}")
    u, _, vt = np.linalg.svd(n.T @ o)
    return u @ vt


def procrustes_residual(new: np.ndarray, old: np.ndarray, w: np.ndarray) -> float:
    """1 - the mean cosine between ``new W`` and ``old`` (paired rows): 0 when the map reproduces the old embeddings."""
    a, b = unit_rows_np(np.asarray(new, np.float64) @ w, np.float64), unit_rows_np(old, np.float64)
    if a.shape != b.shape or not len(a):
        raise ValueError(f"the residual needs paired rows of one width, got {a.shape} and {b.shape}")
    return float(1.0 - np.mean(np.sum(a * b, axis=1)))


def paired_ratio(a: np.ndarray, b: np.ndarray) -> tuple[float, float, int]:
    """``(mean a / mean b, its standard error, n)`` over the positions where both are scored (delta method of a ratio
    of paired means); ``ValueError`` when fewer than 2 are or the mean of ``b`` is not above 0."""
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"the scores must be paired per query, got shapes {x.shape} and {y.shape}")
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    n = len(x)
    if n < 2 or y.mean() <= 0:
        raise ValueError(f"the forecast needs at least 2 queries scored on both sides with a mean above 0, got {n}")
    r = x.mean() / y.mean()
    return float(r), float(((x - r * y) / y.mean()).std(ddof=1) / math.sqrt(n)), n


def forecast_recovery(oo: np.ndarray, nn: np.ndarray, adapted: np.ndarray, residual: float, *,
                      calibration: Calibration = CALIBRATION) -> Forecast:
    """The Procrustes adapter's recovery predicted from a sample's per-query self-tests (``oo``, ``nn``), its queries
    through the small Procrustes fit on the old gallery (``adapted``) and that fit's residual (see the module
    docstring). NaN marks a query without a positive; only queries scored in all three count."""
    if math.isnan(residual) or not 0 <= residual <= 2:
        raise ValueError(f"a Procrustes residual (1 - mean cosine) lies in [0, 2], got {residual!r}")
    o, n, a = (np.asarray(x, np.float64) for x in (oo, nn, adapted))
    if not o.shape == n.shape == a.shape:
        raise ValueError(f"the scores must be paired per query, got shapes {o.shape}, {n.shape} and {a.shape}")
    keep = ~(np.isnan(o) | np.isnan(n) | np.isnan(a))
    o, n, a = o[keep], n[keep], a[keep]
    ceiling, _, count = paired_ratio(o, n)
    of_old, se_old, _ = paired_ratio(a, o)
    _, se_new, _ = paired_ratio(a, n)
    c = calibration
    s_old = of_old + c.bias * residual
    s_new = s_old * ceiling
    half_old = c.q_old * math.sqrt(c.tau_old ** 2 + se_old ** 2)
    half_new = c.q_new * math.sqrt(c.tau_new ** 2 + se_new ** 2)
    return Forecast(s_new, max(0.0, s_new - half_new), s_new + half_new, s_old, max(0.0, s_old - half_old),
                    s_old + half_old, ceiling, float(residual), count)


# ------------------------------------------------------------------------------------------------ calibration
def _conformal(scores: Sequence[float], level: float = LEVEL) -> float:
    """The split-conformal quantile: the ceil((n + 1) level)-th smallest score (inf when n is too small)."""
    s = sorted(scores)
    k = math.ceil((len(s) + 1) * level)
    return s[k - 1] if k <= len(s) else math.inf


def fit_calibration(rows: Sequence[Mapping[str, Any]], level: float = LEVEL, fitted_on: str = "") -> Calibration:
    """Fit :class:`Calibration` on rows holding ``oo``, ``nn``, ``adapted`` (per query), ``residual`` and the truth
    ``share_of_old``/``share_of_new``: the bias by least squares of the share of old's error on the residual (through
    0), ``tau`` the median absolute error of each share, ``q`` the conformal quantile of the normalised errors."""
    raw = [forecast_recovery(x["oo"], x["nn"], x["adapted"], x["residual"], calibration=Calibration(0, 0, 0, 0, 0))
           for x in rows]
    r = np.array([x["residual"] for x in rows], np.float64)
    e = np.array([x["share_of_old"] - f.share_of_old for x, f in zip(rows, raw)])
    bias = float((r @ e) / (r @ r)) if (r @ r) > 0 else 0.0
    unit = Calibration(bias, 0.0, 1.0, 0.0, 1.0)
    got = [(x, forecast_recovery(x["oo"], x["nn"], x["adapted"], x["residual"], calibration=unit)) for x in rows]
    e_old = [abs(x["share_of_old"] - f.share_of_old) for x, f in got]
    e_new = [abs(x["share_of_new"] - f.share_of_new) for x, f in got]
    se_old = [f.old_hi - f.share_of_old for _, f in got]  # q = 1, tau = 0: the half-width is the sample's se
    se_new = [f.new_hi - f.share_of_new for _, f in got]
    tau_old, tau_new = max(float(np.median(e_old)), 1e-4), max(float(np.median(e_new)), 1e-4)
    q_old = _conformal([err / math.hypot(tau_old, se) for err, se in zip(e_old, se_old)], level)
    q_new = _conformal([err / math.hypot(tau_new, se) for err, se in zip(e_new, se_new)], level)
    return Calibration(bias, tau_old, q_old, tau_new, q_new, fitted_on)


def validate(rows: Sequence[Mapping[str, Any]], level: float = LEVEL) -> dict[str, Any]:
    """Coverage and mean half-width of both shares' intervals for each held-out group, the calibration fitted on the
    rest: leave one run out, then one corpus out; overall and per sample (``fraction``: a share of the queries, or
    ``whole``: the check's own queries), against :data:`TARGETS`."""
    if not rows:
        return {"rows": 0}
    out: dict[str, Any] = {"rows": len(rows), "runs": len({x["run"] for x in rows}), "targets": TARGETS}
    for scheme, key in (("leave_one_run_out", "run"), ("leave_one_corpus_out", "corpus")):
        hits = []
        for group in sorted({x[key] for x in rows}, key=str):
            train = [x for x in rows if x[key] != group]
            if not train:
                continue
            cal = fit_calibration(train, level)
            for x in (x for x in rows if x[key] == group):
                f = forecast_recovery(x["oo"], x["nn"], x["adapted"], x["residual"], calibration=cal)
                hits.append({"fraction": x["fraction"], "corpus": x["corpus"],
                             "new_in": f.new_lo <= x["share_of_new"] <= f.new_hi,
                             "old_in": f.old_lo <= x["share_of_old"] <= f.old_hi,
                             "new_half": (f.new_hi - f.new_lo) / 2, "old_half": (f.old_hi - f.old_lo) / 2,
                             "new_err": f.share_of_new - x["share_of_new"], "old_err": f.share_of_old - x["share_of_old"]})
        out[scheme] = {str(k): _score([h for h in hits if k == "all" or h["fraction"] == k])
                       for k in ["all", *sorted({h["fraction"] for h in hits}, key=str)]}
    full = fit_calibration(rows, level, fitted_on=f"{len(rows)} draws of {out['runs']} runs")
    out["calibration"] = asdict(full)
    out["overall"] = out["leave_one_run_out"]
    return out


def _score(hits: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    if not hits:
        return {"n": 0}
    n = len(hits)
    got = {"n": n}
    for side in ("new", "old"):
        cov = sum(h[f"{side}_in"] for h in hits) / n
        half = float(np.mean([h[f"{side}_half"] for h in hits]))
        got[side] = {"coverage": cov, "half_width": half, "mae": float(np.mean([abs(h[f"{side}_err"]) for h in hits])),
                     "meets": cov >= TARGETS["coverage"] and half <= TARGETS["half_width"]}
    return got
