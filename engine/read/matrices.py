"""Stored compatibility matrices read for the Compatibility page (torch-free): each method and view over its seeds
(AC / AA / ACA mean, std and interval, verdicts added or judged on the means, AC's paired range, Γ), the mean
matrix, each seed's verdict per cross-test; and the renderings and bundle the downloads use.

A stored matrix is the dict ``app.queries.matrices`` returns: ``{"metric", "gallery_kind", "view", "eval_classes",
"values", "valid_queries", "no_positive", "summary"}``, its tie rule and paired test in ``summary``. ``family`` is
how the paired verdicts are judged (``engine.metrics.uncertainty.FAMILYWISE``: ``none``, each cell alone, or a
correction over the matrix).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engine.core.conventions import stored_ties
from engine.core.kinds import STRICT
from engine.metrics import ecc_pass, summarize
from engine.metrics.gain import gain_cells, gain_json, gain_text
from engine.metrics.over_seeds import ecc_gain, over_seeds
from engine.metrics.uncertainty import ac_range, familywise_verdicts, seed_interval, verdict_counts
from engine.results.bundle import study_bundle
from engine.results.report import render_matrix, render_summary_table, safe_cell, seed_spread

__all__ = ["ecc_pass", "summarize", "gain_cells", "gain_text", "study_bundle", "render_summary_table", "safe_cell",
           "criterion", "seed_runs", "judged", "verdict_total", "paired_range", "gain_shown", "summary_row", "view_row",
           "spread_summary", "stacked_mean", "seed_verdicts", "matrix_download"]

Stored = Mapping[str, Any]
MARKS = {"pass": "✓", "fail": "✗", "unresolved": "?"}


def criterion(m: Stored) -> np.ndarray:
    """The compatibility criterion per cell of a stored matrix, under the tie rule stored with it."""
    return ecc_pass(m["values"], ties=stored_ties(m["summary"]))


def seed_runs(seeds: Sequence[Stored]) -> list[dict[str, Any]]:
    """Each seed's stored matrix as :func:`engine.metrics.over_seeds.over_seeds` reads it."""
    return [{"matrix": m["values"], "paired": m["summary"].get("paired"), "ties": stored_ties(m["summary"])}
            for m in seeds]


def judged(m: Stored, family: str) -> list[list[str | None]] | None:
    """The stored paired verdicts of a matrix, re-judged family-wise when asked; None without a paired test."""
    p = m["summary"].get("paired")
    return familywise_verdicts(p, method=family) if p else None


def verdict_total(seeds: Sequence[Stored], family: str) -> str:
    """``pass/fail/unresolved`` cross-tests: over several seeds with paired tests, the verdicts of each cross-test's
    mean over the seeds (t-interval over seeds, family-wise as chosen); else added over the seeds: the paired verdicts
    where stored, else the compatibility criterion on point estimates with ``–`` for "not tested"."""
    if len(seeds) > 1 and all(m["summary"].get("paired") for m in seeds):  # the verdicts of the means over the seeds
        mean = over_seeds(seed_runs(seeds))["verdicts"]
        n = verdict_counts(familywise_verdicts(mean, method=family))
        return f"{n['pass']}/{n['fail']}/{n['unresolved']}"
    counts = {"pass": 0, "fail": 0, "unresolved": 0}
    tested = True
    for m in seeds:
        v = judged(m, family)
        if v is None:
            tested = False
            ecc = criterion(m)
            counts["pass"] += int(np.nansum(ecc == 1))
            counts["fail"] += int(np.nansum(ecc == 0))
        else:
            for name, n in verdict_counts(v).items():
                counts[name] += n
    return f"{counts['pass']}/{counts['fail']}/" + (str(counts["unresolved"]) if tested else "–")


def _percent_range(lo: float | None, hi: float | None) -> str | None:
    return None if lo is None or hi is None else f"{100 * lo:.1f} – {100 * hi:.1f}"


def paired_range(seeds: Sequence[Stored], family: str) -> str | None:
    """AC in % from the sure passes to every cell not a sure failure, averaged over the seeds with a paired test."""
    ranges = [ac_range(m["values"], v) for m in seeds if (v := judged(m, family)) is not None]
    ranges = [r for r in ranges if r["AC_lo"] is not None]
    if not ranges:
        return None
    return _percent_range(float(np.mean([r["AC_lo"] for r in ranges])), float(np.mean([r["AC_hi"] for r in ranges])))


def gain_shown(matrices: Sequence[np.ndarray], ties: str = STRICT) -> str:
    """Γ in % averaged over the cross-tests where ECC holds and Γ is defined (paper 002), or "undefined" and why."""
    g = ecc_gain(matrices, ties=ties)
    return f"{100 * g['mean']:.1f}" if g["mean"] is not None else g["why"]


def summary_row(method: str, view: str, seeds: Sequence[Stored], family: str) -> dict[str, Any]:
    """A method and view over its seeds' stored matrices: AC / AA / ACA in % as mean and sample std and the
    Student-t interval of the mean, the cross-tests' verdicts, AC's paired range, mean Γ and the queries without a
    positive."""
    row: dict[str, Any] = {"method": method, "view": view, "seeds": len(seeds), "steps": seeds[0]["values"].shape[0]}
    for name in ("AC", "AA", "ACA"):
        values = [m["summary"].get(name) for m in seeds]
        spread = seed_spread(values)
        row[f"{name} %"] = None if spread["mean"] is None else 100 * spread["mean"]
        row[f"{name} % std"] = None if spread["std"] is None else 100 * spread["std"]
        ci = seed_interval(values, bounds=(0.0, 1.0))  # shares: clipped
        row[f"{name} % 95% CI"] = _percent_range(ci["lo"], ci["hi"])
    row["cells ✓/✗/?"] = verdict_total(seeds, family)
    row["AC % range (paired)"] = paired_range(seeds, family)
    row["mean Γ %"] = gain_shown([m["values"] for m in seeds], stored_ties(seeds[0]["summary"]))
    row["queries without a positive"] = int(sum(np.nansum(np.tril(m["no_positive"])) for m in seeds))
    return row


def view_row(method: str, m: Stored) -> dict[str, Any]:
    """One stored matrix for the views-side-by-side table: AC / AA / ACA in % (NaN where not stored) and how many
    cross-tests fail the criterion."""
    return {"method": method, "view": m["view"],
            **{f"{k} %": np.nan if m["summary"].get(k) is None else 100 * m["summary"][k] for k in ("AC", "AA", "ACA")},
            "failing cross-tests": int(np.sum(criterion(m) == 0))}


def spread_summary(seeds: Sequence[Stored], family: str) -> dict[str, Any]:
    """The first seed's stored summary with the AC / AA / ACA spread over every seed (for the report tables)."""
    first = seeds[0]
    return {**first["summary"], "update_gain": gain_json(first["values"]),  # Γ under one rule
            "spread": {k: seed_spread([m["summary"].get(k) for m in seeds]) for k in ("AC", "AA", "ACA")},
            "matrix": first["values"], "over_seeds": over_seeds(seed_runs(seeds)), "familywise": family}


def stacked_mean(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The cell-wise mean over the seeds' matrices; NaN where no seed defines the cell."""
    stack = np.stack([np.asarray(a, dtype=float) for a in arrays])
    count = (~np.isnan(stack)).sum(axis=0)
    return np.where(count > 0, np.nansum(stack, axis=0) / np.maximum(count, 1), np.nan)


def seed_verdicts(seeds: Sequence[tuple[str, Stored]], names: Sequence[str]) -> list[dict[str, Any]]:
    """One row per cross-test, one column per ``(seed, stored matrix)``: ✓ / ✗ (the compatibility criterion) and the
    value in %, the paired verdict in brackets where stored; then how many seeds pass."""
    T = seeds[0][1]["values"].shape[0]
    criteria = [criterion(m) for _, m in seeds]
    rows = []
    for t in range(1, T):
        for k in range(t):
            row: dict[str, Any] = {"cross-test": f"{names[t]} → {names[k]}"}
            passes = defined = 0
            for (seed, m), ecc in zip(seeds, criteria):
                value = m["values"][t, k]
                if np.isnan(value):
                    row[f"seed {seed}"] = None
                    continue
                ok = bool(ecc[t, k])
                passes, defined = passes + ok, defined + 1
                paired = m["summary"].get("paired")
                mark = MARKS.get(paired["verdict"][t][k]) if paired else None
                extra = f" (paired {mark})" if mark else ""
                row[f"seed {seed}"] = f"{'✓' if ok else '✗'} {100 * value:.1f}{extra}"
            row["seeds passing"] = f"{passes} of {defined}" if defined else None
            rows.append(row)
    return rows


def matrix_download(C: np.ndarray, fmt: str, m: Stored, *, title: str, comparable: np.ndarray | None,
                    replaced: Sequence[int], names: Sequence[str], paired: Mapping[str, Any] | None, family: str,
                    tie_readings: Mapping[str, Any] | None) -> str:
    """A matrix rendered for download, its models named as on the page; the CSV's verdicts as judged on the page
    (family-wise as chosen), the choice in its ``familywise`` column; a single run's Recall@k ties beside each cell."""
    if paired and family != "none":
        paired = {**paired, "verdict": familywise_verdicts(paired, method=family), "familywise": family}
    return render_matrix(C, fmt=fmt, title=title, comparable=comparable, replaced=tuple(replaced), names=list(names),
                         metric=m["metric"], view=m["view"], gallery_kind=m["gallery_kind"],
                         eval_classes=m["eval_classes"], paired=paired if fmt == "csv" else None,
                         ties=stored_ties(m["summary"]), tie_readings=tie_readings)
