"""The upgrade check of two steps of a stored experiment: the ``upgrade`` analysis and ``check-upgrade --experiment``.

Reads the two model versions' stored features through :mod:`engine.analysis.views` (PSP/LSP on the old model's
classes, as the backfill analysis and the matrices' cross-test do) and runs :func:`engine.upgrade.verdict.check_upgrade`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from engine.analysis.views import Progress, StoredVersion, experiment_recipe, load_experiment, load_side, seen_note, version_of_step
from engine.metrics.compatibility import CellFeatures
from engine.upgrade.migration import decide_in_memory
from engine.upgrade.verdict import UpgradeReport, check_upgrade
from storage import get_model_version, session_scope


@dataclass(frozen=True)
class StoredPair:
    """Old and new features of one stored experiment, in one space, with what the report needs to say about them."""

    old: CellFeatures
    new: CellFeatures
    old_version: StoredVersion
    new_version: StoredVersion
    names: tuple[str, str]
    same_set: bool
    notes: tuple[str, ...]


def version_name(version: StoredVersion, name: str | None) -> str:
    """A model's name in a report: the user's name, else ``step N``."""
    return name or f"step {version.step}"


def load_pair(db: Engine, experiment_id: int, old_step: int, new_step: int, view: str = "encoder") -> StoredPair:
    """The two steps' query and gallery features in one space; ``ValueError`` with one sentence when they are not stored."""
    if old_step == new_step:
        raise ValueError(f"the old and new step are both {old_step}; give two different steps")
    config, versions = load_experiment(db, experiment_id)
    old, new = version_of_step(versions, old_step), version_of_step(versions, new_step)
    recipe = experiment_recipe(config, view, new, old)  # the cross-test's cell: new query, old gallery
    sets = []
    for version, side in ((old, "gallery"), (new, "query")):  # each model in its side's columns, the cell's rows
        q, ql, _, _ = load_side(db, version, "query", recipe, side)
        g, gl, _, _ = load_side(db, version, "gallery", recipe, side)
        sets.append(CellFeatures(q, ql, g, gl))
    notes = seen_note(recipe, old)
    if recipe.derived:
        notes.append(f"{view.upper()}: both models projected onto the old model's {len(old.classes)} classes")
    with session_scope(db) as s:
        names = tuple(version_name(v, get_model_version(s, v.id).name) for v in (old, new))
    return StoredPair(sets[0], sets[1], old, new, names, recipe.same_set, tuple(notes))  # type: ignore[arg-type]


def check_stored(db: Engine, experiment_id: int, old_step: int, new_step: int, *, view: str = "encoder",
                 names: Sequence[str] | None = None, **settings: Any) -> tuple[UpgradeReport, StoredPair]:
    """The upgrade verdict of step ``new_step`` over ``old_step`` of a stored experiment.

    ``names`` default to the stored ones; ``settings`` are :func:`check_upgrade`'s metric, resamples, level, seed,
    margin and ties.
    """
    pair = load_pair(db, experiment_id, old_step, new_step, view)
    report = check_upgrade(pair.old, pair.new, names=names or pair.names, same_set=pair.same_set, **settings)
    return report, pair


def compute_upgrade(db: Engine, experiment_id: int, params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """The payload of an ``upgrade`` analysis: the report as JSON, the two models, notes and the migration plan."""
    progress(0.05, "loading features")
    report, pair = check_stored(db, experiment_id, params["step_a"], params["step_b"], view=params["view"],
                                metric=params["metric"], resamples=params["resamples"], level=params["level"],
                                seed=params["seed"], margin=params["margin"], ties=params["ties"])
    progress(0.6, "migration plan")
    plan = decide_in_memory(pair.old, pair.new, report).to_json()  # check-upgrade --experiment gives the same plan
    return {"params": params, "report": report.to_json(), "notes": list(pair.notes),
            "models": [{"step": v.step, "model_version_id": v.id, "name": n}
                       for v, n in zip((pair.old_version, pair.new_version), pair.names)], "plan": plan}
