"""The worker's ``analysis`` job: compute one analysis of an experiment and store it.

Kinds (``run_analysis(db, experiment_id, kind, params)``; parameters, keys, view names and point kinds live
in :mod:`engine.core.contract`, where the dashboard reads them):

* ``projection``: old and new features in one 2-D map (:mod:`engine.analysis.map`).
* ``backfill``: partial-backfilling curves of the new model's queries against the old gallery being
  re-embedded by the new model (:mod:`engine.analysis.backfill_analysis`).
* ``geometry``: NC1-NC4, angles, drift, Definition 1 and stationarity over the steps
  (:mod:`engine.analysis.geometry`).
* ``upgrade``: the upgrade verdict of step_b over step_a (:mod:`engine.upgrade.stored`).
* ``text_upgrade``: every pair of a text comparison's models: matrices, paired verdicts per metric and adapters
  (:mod:`engine.upgrade.text_upgrade`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine

from engine.analysis.backfill_analysis import compute_backfill
from engine.analysis.geometry import compute_geometry
from engine.analysis.map import compute_projection
from engine.analysis.views import Progress, StoredVersion, load_experiment
from engine.core.contract import analysis_key, normalize_params
from engine.upgrade.stored import compute_upgrade
from engine.upgrade.text_upgrade import compute_text_upgrade
from storage import save_analysis, session_scope


@dataclass(frozen=True)
class Inputs:
    """What an analysis reads: the database, the experiment, its stored config and model versions."""

    db: Engine
    experiment_id: int
    config: dict[str, Any]
    versions: list[StoredVersion]


Run = Callable[[Inputs, dict[str, Any], Progress], tuple[dict[str, Any], np.ndarray | None]]

# analysis kind (engine.core.kinds.ANALYSES) -> its computation: the payload and the point array, if any
ANALYSIS_RUNS: dict[str, Run] = {
    "projection": lambda i, p, r: compute_projection(i.db, i.config, i.versions, p, r),
    "backfill": lambda i, p, r: (compute_backfill(i.db, i.config, i.versions, p, r), None),
    "geometry": lambda i, p, r: (compute_geometry(i.db, i.config, i.versions, p, r), None),
    "upgrade": lambda i, p, r: (compute_upgrade(i.db, i.experiment_id, p, r), None),
    "text_upgrade": lambda i, p, r: (compute_text_upgrade(i.db, i.experiment_id, p, r), None),
}


def run_analysis(db_engine: Engine, experiment_id: int, kind: str, params: dict[str, Any], *,
                 progress: Progress | None = None) -> None:
    """Compute one analysis of an experiment and store it under ``(experiment_id, kind, analysis_key(kind, params))``.

    Reads in short transactions, computes without holding a session, writes in one transaction.
    ``progress(fraction, message)`` is called along the way when given.
    """
    params = normalize_params(kind, params)
    report = progress or (lambda fraction, message: None)
    config, versions = load_experiment(db_engine, experiment_id)
    if not versions:
        raise ValueError(f"experiment {experiment_id} has no model versions yet; wait for it to train a step")
    if kind not in ANALYSIS_RUNS:  # normalize_params refuses an unknown kind first; a kind added needs its computation
        raise ValueError(f"no computation for analysis kind {kind!r}")
    payload, array = ANALYSIS_RUNS[kind](Inputs(db_engine, experiment_id, config, versions), params, report)
    report(0.98, "saving")
    with session_scope(db_engine) as s:
        save_analysis(s, experiment_id, kind, analysis_key(kind, params), payload, array)
