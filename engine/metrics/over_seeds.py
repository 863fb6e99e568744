"""A study's verdicts over seeds, from the matrices it stored: the verdict of the mean, and Γ where ECC holds
(numpy and the standard library only: the dashboard imports it).

A stored matrix keeps, per cross-test, the paired difference cross - self and its interval over the seed's items
(:mod:`engine.metrics.cell_interval`), not the per-item outcomes. Over seeds:

* each cross-test's mean difference over the seeds with a Student-t interval over the per-seed differences
  (:func:`engine.metrics.uncertainty.seed_interval`), its half-width combined (root sum of squares) with the seeds'
  mean item half-width: a study's seeds are scored on the *same* test queries, so the query sample's noise is shared
  by every seed and does not average out over them (it is absent from the seeds' spread); adding it is conservative
  where the seeds' item errors are partly independent. The hierarchical bootstrap (:mod:`engine.metrics.hierarchical`)
  needs the per-item outcomes, which a stored matrix does not keep. With one seed, that seed's item interval. The verdict of that mean under the stored rule (:func:`engine.metrics.decision.decide`): the study
  table counts these, never one seed's;
* Γ (CoReS Eq. 3) averaged over the (seed, cross-test) cells where ECC holds under the stored tie rule and the new
  model beats the old on its own by ``MIN_GAIN`` (paper 002 reports Γ only where ECC holds); undefined, with the
  reason, where no cell qualifies.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.core.kinds import STRICT, beats
from engine.metrics.decision import Rule, decide
from engine.metrics.gain import MIN_GAIN, gain_cells
from engine.metrics.uncertainty import seed_interval


def _matrix(rows: Sequence[Sequence[float | None]] | np.ndarray) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64)


def mean_verdicts(paired: Sequence[dict], *, ties: str = STRICT, confidence: float = 0.95) -> dict:
    """Per cross-test, the mean paired difference over seeds, its interval and the verdict of the mean.

    ``paired``: each seed's stored paired test (``diff``/``lo``/``hi`` rows, None where undefined). Returns
    ``{"diff", "lo", "hi", "verdict", "seeds", "counts", "interval", "rule", "confidence"}`` (T x T rows, None off the cross-tests;
    ``seeds``: per cell the seeds with a difference; ``interval``: "t over seeds" or "one seed's items")."""
    if not paired:
        raise ValueError("no seed's paired test to summarise")
    diffs = [_matrix(p["diff"]) for p in paired]
    T = diffs[0].shape[0]
    if any(d.shape != (T, T) for d in diffs):
        raise ValueError("the seeds' matrices differ in size: they are not one study's")
    rule = Rule(0.0, ties)
    out = {key: [[None] * T for _ in range(T)] for key in ("diff", "lo", "hi", "verdict", "seeds")}
    for t in range(T):
        for k in range(t):
            here = [(d[t, k], p) for d, p in zip(diffs, paired) if not np.isnan(d[t, k])]
            if not here:
                continue
            if len(here) == 1:
                d, p = here[0]
                lo, hi = p["lo"][t][k], p["hi"][t][k]
                if lo is None or hi is None:
                    continue
                mean = float(d)
            else:  # t over seeds, widened by the seeds' mean item half-width: the seeds share their test items
                s = seed_interval([d for d, _ in here], confidence=confidence)
                halves = [(p["hi"][t][k] - p["lo"][t][k]) / 2 for _, p in here
                          if p["lo"][t][k] is not None and p["hi"][t][k] is not None]
                item = float(np.mean(halves)) if halves else 0.0
                half = float(np.hypot(s["hi"] - s["mean"], item))
                mean, lo, hi = s["mean"], s["mean"] - half, s["mean"] + half
            out["diff"][t][k], out["lo"][t][k], out["hi"][t][k] = mean, float(lo), float(hi)
            out["verdict"][t][k] = decide(mean, float(lo), float(hi), rule)[0]
            out["seeds"][t][k] = len(here)
    flat = [v for row in out["verdict"] for v in row if v]
    out["counts"] = {v: flat.count(v) for v in ("pass", "fail", "unresolved")}
    out["interval"] = "t over seeds" if len(paired) > 1 else "one seed's items"
    out["rule"] = rule.name
    out["confidence"] = confidence  # engine.metrics.uncertainty.familywise_verdicts re-judges these like a stored test
    return out


def ecc_gain(matrices: Sequence[np.ndarray | Sequence], *, ties: str = STRICT, min_gain: float = MIN_GAIN) -> dict:
    """Γ averaged over the (seed, cross-test) cells where ECC holds and Γ is defined: ``{"mean", "cells", "why"}``
    (``mean`` None and ``why`` a sentence when no cell qualifies)."""
    values, crosses, ecc_cells = [], 0, 0
    for C in matrices:
        C = _matrix(C)
        gain, _ = gain_cells(C, min_gain=min_gain)
        for t in range(C.shape[0]):
            for k in range(t):
                if np.isnan(C[t, k]) or np.isnan(C[k, k]):
                    continue
                crosses += 1
                if not beats(C[t, k], C[k, k], ties):
                    continue
                ecc_cells += 1
                if not np.isnan(gain[t, k]):
                    values.append(gain[t, k])
    if values:
        return {"mean": float(np.mean(values)), "cells": len(values), "why": None}
    if not crosses:
        why = "undefined: no cross-test"
    elif not ecc_cells:
        why = f"undefined: no cross-test passes ECC ({crosses} over the seeds); Γ is reported only where ECC holds"
    else:
        why = (f"undefined: in the {ecc_cells} cross-tests that pass ECC the new model is not {100 * min_gain:g} point "
               "better than the old on its own (Γ divides by that gain)")
    return {"mean": None, "cells": 0, "why": why}


def over_seeds(runs: Sequence[dict], *, confidence: float = 0.95) -> dict:
    """The study table's numbers for one (method, view, metric) from each seed's stored entry (``matrix`` rows,
    ``paired`` test or None, ``ties``): ``{"verdicts": mean_verdicts(...) or None, "gain": ecc_gain(...), "seeds"}``.
    The tie rule is the first seed's (a study stores one)."""
    runs = [r for r in runs if r and r.get("matrix") is not None]
    if not runs:
        return {"verdicts": None, "gain": {"mean": None, "cells": 0, "why": "undefined: no matrix"}, "seeds": 0}
    ties = runs[0].get("ties") or STRICT
    paired = [r["paired"] for r in runs if r.get("paired")]
    return {"verdicts": mean_verdicts(paired, ties=ties, confidence=confidence) if paired else None,
            "gain": ecc_gain([r["matrix"] for r in runs], ties=ties), "seeds": len(runs)}
