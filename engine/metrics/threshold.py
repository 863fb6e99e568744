"""A similarity threshold carried from the old model to the new one: the new score with the same precision.

A retrieval system often keeps a cut-off ("a cosine of 0.62 means relevant"). Scores of a new model live on
another scale, so the cut-off must be re-mapped. The mapping here holds **precision** fixed: on scored pairs with
known relevance (class labels or qrels), the old threshold ``t_old`` has precision
``p = #relevant(score >= t_old) / #(score >= t_old)``; the new threshold is the **lowest** new score ``t_new`` whose
pairs at or above it have precision >= ``p`` (lowest: the most recall at that precision). Precision is not
monotone in the threshold, so every distinct score is a candidate; with no candidate reaching ``p`` the mapping
is ``None``. Pure numpy; the pairs of the two models may differ (each model's own top-k candidates).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ThresholdMap:
    """``t_old`` and its precision and recall on the old pairs; ``t_new`` (None: unreachable) and its own."""

    t_old: float
    precision: float
    recall_old: float
    t_new: float | None
    precision_new: float | None
    recall_new: float | None
    n_old: int
    n_new: int


def _pairs(scores: np.ndarray, relevant: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    r = np.asarray(relevant).ravel()
    if s.shape != r.shape:
        raise ValueError(f"{name}: {s.size} scores but {r.size} relevance flags")
    if s.size == 0:
        raise ValueError(f"{name}: no scored pairs")
    if not np.isfinite(s).all():
        raise ValueError(f"{name}: scores must be finite")
    if r.dtype != bool and not np.isin(r, (0, 1)).all():
        raise ValueError(f"{name}: relevance flags must be 0/1 or booleans")
    return s, r.astype(bool)


def precision_recall_at(scores: np.ndarray, relevant: np.ndarray, t: float) -> tuple[float, float]:
    """Precision and recall of the pairs scored >= ``t`` (precision NaN when none is; recall NaN with no relevant)."""
    s, r = _pairs(scores, relevant, "pairs")
    kept = s >= t
    n_rel = int(r.sum())
    precision = float(r[kept].mean()) if kept.any() else float("nan")
    recall = float(r[kept].sum() / n_rel) if n_rel else float("nan")
    return precision, recall


def _curve(s: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each distinct score t (descending): t, precision and recall of the pairs scored >= t."""
    order = np.argsort(-s, kind="stable")
    s, r = s[order], r[order]
    hits = np.cumsum(r)
    last = np.r_[s[1:] != s[:-1], True]  # the last pair of each run of equal scores closes that threshold
    count = np.arange(1, s.size + 1)[last]
    return s[last], hits[last] / count, hits[last] / max(int(r.sum()), 1)


def matched_threshold(old_scores: np.ndarray, old_relevant: np.ndarray, new_scores: np.ndarray,
                      new_relevant: np.ndarray, t_old: float) -> ThresholdMap:
    """The new model's threshold with the old threshold's precision (see the module docstring)."""
    so, ro = _pairs(old_scores, old_relevant, "old pairs")
    sn, rn = _pairs(new_scores, new_relevant, "new pairs")
    if not np.isfinite(t_old):
        raise ValueError(f"the old threshold must be a finite score, got {t_old!r}")
    p, rec = precision_recall_at(so, ro, t_old)
    if np.isnan(p):
        raise ValueError(f"no old pair scores at or above the threshold {t_old:g} (highest {so.max():g})")
    t, prec, recall = _curve(sn, rn)
    ok = np.flatnonzero(prec >= p - 1e-12)
    if ok.size == 0:
        return ThresholdMap(float(t_old), p, rec, None, None, None, so.size, sn.size)
    i = ok[-1]  # the lowest threshold that keeps the precision
    return ThresholdMap(float(t_old), p, rec, float(t[i]), float(prec[i]), float(recall[i]), so.size, sn.size)


def threshold_at_precision(scores: np.ndarray, relevant: np.ndarray, precision: float) -> float | None:
    """The lowest score whose pairs at or above it have precision >= ``precision`` (None: no score reaches it)."""
    if not 0 < precision <= 1:
        raise ValueError(f"the precision must lie in (0, 1], got {precision!r}")
    s, r = _pairs(scores, relevant, "pairs")
    t, prec, _ = _curve(s, r)
    ok = np.flatnonzero(prec >= precision - 1e-12)
    return None if ok.size == 0 else float(t[ok[-1]])
