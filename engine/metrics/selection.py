"""Choosing the best of several candidates (adapters) without an optimistic interval: simultaneous intervals (max-T).

A plan that fits m adapters and ships the one whose interval's lower end is highest reads that interval as if it
had been the only one: with m candidates of equal worth, the largest of m lower ends clears a threshold more often
than one does (the winner's curse), so its interval covers less than its level. The correction here widens every
candidate's interval until all m cover *together* at the level (Mandel & Betensky, "Simultaneous confidence
intervals based on the percentile bootstrap approach", Comput. Stat. Data Anal. 52(4), 2008; the max-T idea of
Westfall & Young 1993 on percentile ranks): one joint bootstrap draws the queries (or query groups) once per
replicate for all candidates; each candidate's replicate means are turned into their ranks ``r`` in (0, 1]; a
replicate's extremeness is ``max_i max(r_i, 1 - r_i)``; its ``level`` quantile ``g`` gives each candidate the
percentile interval ``[1 - g, g]``, i.e. the per-candidate level ``2 g - 1``. Correlated candidates (two adapters
of the same features) cost little (the level stays near the nominal one); independent ones approach Bonferroni's
``1 - (1 - level) / m``, the cap used here. Whatever rule then picks the winner, its interval covers at ``level``.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.metrics.paired import group_index

_CHUNK_ELEMENTS = 1 << 22  # query counts held at once (replicates x queries)


def joint_means(diffs: Sequence[np.ndarray], *, resamples: int, seed: int | tuple[int, ...],
                groups: np.ndarray | None = None) -> np.ndarray:
    """(resamples, m) replicate means of each candidate's per-query differences (NaN = undefined, left out), all
    from the same draws of the queries (``rng.multinomial(n, 1/n)`` per replicate; with ``groups``, of the groups)."""
    d = np.stack([np.asarray(x, np.float64) for x in diffs], axis=1)  # (n, m)
    n = d.shape[0]
    valid = ~np.isnan(d)
    values = np.where(valid, d, 0.0)
    g = np.arange(n) if groups is None else group_index(groups, n)
    n_units = int(g.max()) + 1
    sums = np.zeros((n_units, d.shape[1]))
    sizes = np.zeros((n_units, d.shape[1]))
    np.add.at(sums, g, values)
    np.add.at(sizes, g, valid.astype(np.float64))
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, d.shape[1]))
    chunk = max(1, _CHUNK_ELEMENTS // n_units)
    for start in range(0, resamples, chunk):
        counts = rng.multinomial(n_units, np.full(n_units, 1 / n_units), size=min(chunk, resamples - start))
        with np.errstate(invalid="ignore", divide="ignore"):
            out[start:start + len(counts)] = (counts @ sums) / (counts @ sizes)
    return out


def simultaneous_level(diffs: Sequence[np.ndarray], *, level: float, resamples: int, seed: int | tuple[int, ...],
                       groups: np.ndarray | None = None) -> float:
    """The per-candidate level at which the ``len(diffs)`` candidates' intervals cover together at ``level``
    (module docstring): ``level`` for one candidate, at most ``1 - (1 - level) / m``."""
    m = len(diffs)
    if m <= 1:
        return float(level)
    means = joint_means(diffs, resamples=resamples, seed=seed, groups=groups)
    means = means[~np.isnan(means).any(axis=1)]
    if len(means) < 2:
        return float(level)
    r = (np.argsort(np.argsort(means, axis=0, kind="stable"), axis=0, kind="stable") + 1) / len(means)
    extreme = np.maximum(r, 1 - r + 1 / len(means)).max(axis=1)
    joint = 2 * float(np.quantile(extreme, level)) - 1
    return float(min(max(joint, level), 1 - (1 - level) / m))
