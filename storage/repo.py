"""Repository functions for studies, experiments, model versions, matrices and analyses (feature sets:
``storage.feature_sets``; row helpers: ``storage.rows``).

Every function takes the caller's ``Session`` and never commits: wrap calls in
:func:`storage.session_scope` so that a block of writes is one transaction.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from storage.feature_sets import forget_feature_files
from storage.models import (
    EXPERIMENT_STATUSES,
    FINISHED_STATUSES,
    MAX_MODEL_NAME,
    MAX_NAME,
    GALLERY_KINDS,
    Analysis,
    CompatibilityMatrix,
    Experiment,
    ModelVersion,
    Study,
)
from storage.rows import require_choice, require_row, upsert
from storage.types import storable_array, utcnow

# --- studies and experiments -------------------------------------------------------------------


def create_study(session: Session, *, name: str, kind: str, config: dict[str, Any] | None = None) -> Study:
    """Add a study (a group of experiments run side by side); ``ValueError`` for a name :func:`name_problem` refuses."""
    if problem := name_problem(name, what="study name"):
        raise ValueError(problem)
    study = Study(name=name, kind=kind, config=config or {})
    session.add(study)
    session.flush()
    return study


def list_studies(session: Session) -> list[Study]:
    """All studies, newest first."""
    return list(session.scalars(select(Study).order_by(Study.created_at.desc(), Study.id.desc())))


def create_experiment(
    session: Session,
    *,
    name: str,
    method: str,
    config: dict[str, Any],
    config_hash: str,
    study_id: int | None = None,
) -> Experiment:
    """Add a queued experiment; ``ValueError`` for a name :func:`name_problem` refuses."""
    if problem := name_problem(name, what="experiment name"):
        raise ValueError(problem)
    if study_id is not None:
        require_row(session, Study, study_id)
    experiment = Experiment(
        name=name, method=method, config=config, config_hash=config_hash, study_id=study_id, status="queued"
    )
    session.add(experiment)
    session.flush()
    return experiment


def find_experiment_by_hash(session: Session, config_hash: str, *, status: str | None = "done") -> Experiment | None:
    """The newest experiment with this config hash and ``status`` (any status when ``None``)."""
    query = select(Experiment).where(Experiment.config_hash == config_hash)
    if status is not None:
        require_choice("status", status, EXPERIMENT_STATUSES)
        query = query.where(Experiment.status == status)
    return session.scalars(query.order_by(Experiment.created_at.desc(), Experiment.id.desc()).limit(1)).first()


def set_experiment_status(session: Session, experiment_id: int, status: str, *, error: str | None = None) -> None:
    """Set the status (and error); ``finished_at`` is stamped for done/failed/cancelled and cleared otherwise."""
    require_choice("status", status, EXPERIMENT_STATUSES)
    experiment = require_row(session, Experiment, experiment_id)
    experiment.status = status
    experiment.error = error
    experiment.finished_at = utcnow() if status in FINISHED_STATUSES else None
    session.flush()


def list_experiments(
    session: Session, *, study_id: int | None = None, status: str | None = None
) -> list[Experiment]:
    """Experiments, newest first, with ``.study`` loaded (usable after the session closes)."""
    query = select(Experiment).options(selectinload(Experiment.study))
    if study_id is not None:
        query = query.where(Experiment.study_id == study_id)
    if status is not None:
        require_choice("status", status, EXPERIMENT_STATUSES)
        query = query.where(Experiment.status == status)
    return list(session.scalars(query.order_by(Experiment.created_at.desc(), Experiment.id.desc())))


def get_experiment(session: Session, experiment_id: int) -> Experiment | None:
    """The experiment with this id (its config, method, status, study), or ``None``."""
    return session.get(Experiment, experiment_id)


def set_experiment_study(session: Session, experiment_id: int, study_id: int) -> None:
    """Put an experiment into a study (a resumed run joins the study that resumed it)."""
    require_row(session, Study, study_id)
    require_row(session, Experiment, experiment_id).study_id = study_id
    session.flush()


def clear_experiment(session: Session, experiment_id: int) -> None:
    """Delete an experiment's model versions (with their feature sets), matrices and analyses; keep its row."""
    experiment = require_row(session, Experiment, experiment_id)
    forget_feature_files(session, experiment_id)
    for row in [*experiment.model_versions, *experiment.matrices, *experiment.analyses]:
        session.delete(row)
    session.flush()


def delete_experiment(session: Session, experiment_id: int) -> bool:
    """Delete an experiment with its model versions, feature sets, matrices and analyses; False if absent.

    Jobs that pointed at it keep their history with ``experiment_id`` set to NULL.
    """
    experiment = session.get(Experiment, experiment_id)
    if experiment is None:
        return False
    forget_feature_files(session, experiment_id)
    session.delete(experiment)
    session.flush()
    return True


# --- model versions --------------------------------------------------------------------------


def add_model_version(
    session: Session,
    experiment_id: int,
    step: int,
    *,
    architecture: str,
    method: str,
    classes: Sequence[int],
    num_outputs: int,
    feature_dim: int,
    class_names: Sequence[str] | None = None,
    checkpoint_path: str | None = None,
    replaced: bool = False,
) -> ModelVersion:
    """Record the model after training step ``step`` (1-based); the same (experiment, step) is updated in place.

    An updated version keeps its id and its feature sets; re-save those when the weights changed.
    """
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
        raise ValueError(f"step is 1-based: expected an integer >= 1, got {step!r}")
    require_row(session, Experiment, experiment_id)
    values = {
        "architecture": architecture,
        "method": method,
        "classes": [int(c) for c in classes],
        "num_outputs": int(num_outputs),
        "feature_dim": int(feature_dim),
        "class_names": None if class_names is None else [str(name) for name in class_names],
        "checkpoint_path": checkpoint_path,
        "replaced": bool(replaced),
    }
    row_id = upsert(session, ModelVersion, {"experiment_id": experiment_id, "step": int(step)}, values)
    return require_row(session, ModelVersion, row_id)


def list_model_versions(session: Session, experiment_id: int) -> list[ModelVersion]:
    """The experiment's model versions ordered by step."""
    return list(session.scalars(select(ModelVersion).where(ModelVersion.experiment_id == experiment_id)
                                .order_by(ModelVersion.step)))


def get_model_version(session: Session, model_version_id: int) -> ModelVersion | None:
    """The model version with this id (``.experiment`` reachable while the session is open), or ``None``."""
    return session.get(ModelVersion, model_version_id)


def name_problem(name: str, *, what: str = "name", limit: int = MAX_NAME) -> str | None:
    """Why ``name`` cannot name something people see (an experiment, a study, a model), or None.

    A name is 1..``limit`` printable characters, not all blank: no control characters (Unicode Cc), no format characters (Cf:
    bidi marks, zero-width joiners), no line or paragraph separators, so it shows as written on every page, in
    every export and in the study bundle's ``study.toml``. The message shows at most the first 60 characters.
    """
    if name.strip() and len(name) <= limit and name.isprintable():
        return None
    shown = repr(name[:60]) + (f"... ({len(name):,} characters)" if len(name) > 60 else "")
    return (f"{what} must be 1..{limit} printable characters (no control, format or bidi characters), "
            f"got {shown}").strip()


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a model version (:func:`name_problem`, at most 40 characters), or None."""
    return name_problem(name, what="model name", limit=MAX_MODEL_NAME)


def rename_model_version(session: Session, model_version_id: int, name: str | None) -> None:
    """Give a model version the user's name (``v1``, ``v2``, ...); ``None`` or blank clears it.

    A name is 1..40 printable characters, unique among the versions of its experiment.
    """
    mv = require_row(session, ModelVersion, model_version_id)
    name = None if name is None or not str(name).strip() else str(name).strip()
    if name is not None and model_name_problem(name):
        raise ValueError(model_name_problem(name))
    taken = session.scalar(select(ModelVersion.step).where(ModelVersion.experiment_id == mv.experiment_id,
                                                           ModelVersion.name == name, ModelVersion.id != mv.id))
    if name is not None and taken is not None:
        raise ValueError(f"the model of step {taken} is already named {name!r}")
    mv.name = name
    session.flush()


# --- compatibility matrices ------------------------------------------------------------------


def save_matrix(
    session: Session,
    experiment_id: int,
    *,
    metric: str,
    gallery_kind: str,
    view: str,
    values: np.ndarray,
    valid_queries: np.ndarray,
    no_positive: np.ndarray,
    summary: dict[str, Any],
    eval_classes: str = "all",
) -> int:
    """Store a T x T compatibility matrix (float64, NaN where undefined), replacing one with the same key."""
    require_choice("gallery_kind", gallery_kind, GALLERY_KINDS)
    values = np.asarray(values)
    if values.ndim != 2 or values.shape[0] != values.shape[1]:
        raise ValueError(f"values must be a square T x T matrix, got shape {values.shape}")
    if values.dtype.kind not in "fiu":
        raise ValueError(f"values must be numeric, got dtype {values.dtype}")
    counts = {"valid_queries": np.asarray(valid_queries), "no_positive": np.asarray(no_positive)}
    for name, array in counts.items():
        if array.shape != values.shape or array.dtype.kind not in "iu":
            raise ValueError(
                f"{name} must be an integer array shaped like values {values.shape}, got {array.dtype} {array.shape}"
            )
    require_row(session, Experiment, experiment_id)
    key = {"experiment_id": experiment_id, "metric": metric, "gallery_kind": gallery_kind, "view": view,
           "eval_classes": eval_classes}
    return upsert(session, CompatibilityMatrix, key,
                   {"values": values.astype(np.float64), **counts, "summary": dict(summary)})


def load_matrices(
    session: Session,
    experiment_id: int,
    *,
    metric: str | None = None,
    gallery_kind: str | None = None,
    view: str | None = None,
) -> list[CompatibilityMatrix]:
    """The experiment's matrices, optionally filtered, ordered by (metric, gallery kind, view, eval_classes)."""
    query = select(CompatibilityMatrix).where(CompatibilityMatrix.experiment_id == experiment_id)
    for column, wanted in ((CompatibilityMatrix.metric, metric), (CompatibilityMatrix.gallery_kind, gallery_kind),
                           (CompatibilityMatrix.view, view)):
        if wanted is not None:
            query = query.where(column == wanted)
    order = (CompatibilityMatrix.metric, CompatibilityMatrix.gallery_kind, CompatibilityMatrix.view,
             CompatibilityMatrix.eval_classes)
    return list(session.scalars(query.order_by(*order)))


# --- analyses (cache of worker-computed results) ---------------------------------------------


def save_analysis(
    session: Session,
    experiment_id: int,
    kind: str,
    key: str,
    payload: dict[str, Any],
    array: np.ndarray | None = None,
) -> int:
    """Cache a computed result under (experiment, kind, key), replacing an earlier one; return its id."""
    array = None if array is None else storable_array(array)
    require_row(session, Experiment, experiment_id)
    return upsert(session, Analysis, {"experiment_id": experiment_id, "kind": kind, "key": key},
                   {"payload": dict(payload), "array": array})


def load_analysis(session: Session, experiment_id: int, kind: str, key: str) -> Analysis | None:
    """The cached result under (experiment, kind, key), or ``None`` on a miss."""
    query = select(Analysis).where(Analysis.experiment_id == experiment_id, Analysis.kind == kind, Analysis.key == key)
    return session.scalars(query).first()
