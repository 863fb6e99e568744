"""Repository functions for studies, experiments, model versions, features, matrices and analyses.

Every function takes the caller's ``Session`` and never commits: wrap calls in
:func:`storage.session_scope` so that a block of writes is one transaction.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import select, update
from sqlalchemy.orm import Session, selectinload

from storage import featurestore
from storage.featurestore import FeatureShard
from storage.models import (
    EXPERIMENT_STATUSES,
    FINISHED_STATUSES,
    MAX_MODEL_NAME,
    PROTOCOLS,
    SPLITS,
    Analysis,
    Base,
    CompatibilityMatrix,
    Experiment,
    FeatureSet,
    ModelVersion,
    Study,
)
from storage.types import storable_array, utcnow

RowT = TypeVar("RowT", bound=Base)


def require_row(session: Session, model: type[RowT], row_id: int) -> RowT:
    """The row of ``model`` with primary key ``row_id``; ``ValueError`` when there is none."""
    row = session.get(model, row_id)
    if row is None:
        raise ValueError(f"{model.__name__} {row_id} does not exist")
    return row


def require_choice(what: str, value: str, allowed: Sequence[str]) -> None:
    """``ValueError`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, allowed))}, got {value!r}")


def _upsert(session: Session, model: type[Base], key: dict[str, Any], values: dict[str, Any]) -> int:
    """Insert a row, or update the row with the same unique ``key`` in place; return its id.

    Either way the change is a single INSERT or UPDATE (no delete-then-insert), so there is never a
    moment where the old row is gone and the new one is not there yet. ``created_at`` is reset.
    """
    table_id = model.id  # type: ignore[attr-defined]
    existing = session.scalar(select(table_id).where(*(getattr(model, name) == value for name, value in key.items())))
    if existing is None:
        row = model(**key, **values)
        session.add(row)
        session.flush()
        return row.id  # type: ignore[attr-defined]
    session.execute(update(model).where(table_id == existing).values(**values, created_at=utcnow()))
    return existing


# --- studies and experiments -------------------------------------------------------------------


def create_study(session: Session, *, name: str, kind: str, config: dict[str, Any] | None = None) -> Study:
    """Add a study (a group of experiments run side by side)."""
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
    """Add a queued experiment."""
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
    _forget_feature_files(session, experiment_id)
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
    _forget_feature_files(session, experiment_id)
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
    row_id = _upsert(session, ModelVersion, {"experiment_id": experiment_id, "step": int(step)}, values)
    return require_row(session, ModelVersion, row_id)


def list_model_versions(session: Session, experiment_id: int) -> list[ModelVersion]:
    """The experiment's model versions ordered by step."""
    return list(session.scalars(select(ModelVersion).where(ModelVersion.experiment_id == experiment_id)
                                .order_by(ModelVersion.step)))


def get_model_version(session: Session, model_version_id: int) -> ModelVersion | None:
    """The model version with this id (``.experiment`` reachable while the session is open), or ``None``."""
    return session.get(ModelVersion, model_version_id)


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a model version (1..40 printable characters), or None."""
    if not 1 <= len(name) <= MAX_MODEL_NAME or not name.isprintable():
        return f"model name {name!r} must be 1..{MAX_MODEL_NAME} printable characters"
    return None


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


# --- feature sets ----------------------------------------------------------------------------


def _check_feature_arrays(
    features: np.ndarray, labels: np.ndarray, image_ids: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    features, labels = storable_array(features), storable_array(labels)
    if features.ndim != 2:
        raise ValueError(f"features must be a 2-D array (samples x dim), got shape {features.shape}")
    if features.dtype.kind not in "fiu":
        raise ValueError(f"features must be a float or integer array, got dtype {features.dtype}")
    count = features.shape[0]
    if labels.ndim != 1 or labels.shape[0] != count:
        raise ValueError(f"labels must be 1-D with one label per feature row ({count}), got shape {labels.shape}")
    if labels.dtype.kind not in "iu":
        raise ValueError(f"labels must be integer class indices, got {labels.dtype}")
    if image_ids is not None:
        image_ids = storable_array(image_ids)
        if image_ids.ndim != 1 or image_ids.shape[0] != count:
            raise ValueError(
                f"image_ids must be 1-D with one id per feature row ({count}), got shape {image_ids.shape}"
            )
    return features, labels, image_ids


def _stored_values(
    session: Session, model_version_id: int, split: str, features: np.ndarray, labels: np.ndarray,
    image_ids: np.ndarray | None
) -> dict[str, Any]:
    """The row's array columns: the blobs, or (with a feature store) the pointer and zero-row placeholders."""
    uri = featurestore.store_uri(session)
    if uri is None:
        return {"features": features, "labels": labels, "image_ids": image_ids, "store_uri": None, "store_key": None,
                "store_layout": None}
    pointer = featurestore.write(session, uri, model_version_id, split, features, labels, image_ids)
    return {"features": features[:0], "labels": labels[:0], "image_ids": None, "store_uri": pointer.uri,
            "store_key": pointer.key, "store_layout": pointer.layout}


def _where(model_version_id: int, split: str, view: str) -> tuple[Any, ...]:
    return FeatureSet.model_version_id == model_version_id, FeatureSet.split == split, FeatureSet.view == view


def save_feature_set(
    session: Session,
    model_version_id: int,
    split: str,
    view: str,
    features: np.ndarray,
    labels: np.ndarray,
    image_ids: np.ndarray | None = None,
    image_source: dict[str, Any] | None = None,
) -> int:
    """Store the features of (model version, split, view), replacing any earlier ones; return the row id.

    ``image_source`` (a JSON-able dict, ``engine.data.samples``) says what ``image_ids`` index: with it,
    ``image_ids`` are needed. Inputs are validated before anything is written (``ValueError``). The arrays go to
    the feature store when there is one (``storage.featurestore``), else into the row. The row write is a single
    INSERT or UPDATE, so a failure leaves the previous features intact and never a duplicate.
    """
    require_choice("split", split, SPLITS)
    if not view:
        raise ValueError("view must be a non-empty name such as 'encoder', 'psp' or 'F(old)'")
    features, labels, image_ids = _check_feature_arrays(features, labels, image_ids)
    if image_source is not None and (image_ids is None or image_ids.dtype.kind not in "iu"):
        raise ValueError("an image_source needs integer image_ids (one index into the source per feature row)")
    require_row(session, ModelVersion, model_version_id)
    old = session.execute(select(FeatureSet.store_uri, FeatureSet.store_key)
                          .where(*_where(model_version_id, split, view))).first()
    values = {
        **_stored_values(session, model_version_id, split, features, labels, image_ids),
        "image_source": image_source,
        "dim": int(features.shape[1]),
        "count": int(features.shape[0]),
    }
    row_id = _upsert(session, FeatureSet, {"model_version_id": model_version_id, "split": split, "view": view}, values)
    if old is not None and old.store_key is not None:
        featurestore.forget(session, old.store_uri, old.store_key)
    return row_id


def save_feature_sets(
    session: Session,
    model_version_id: int,
    features: Mapping[str, Mapping[str, np.ndarray]],
    labels: Mapping[str, np.ndarray],
    images: Mapping[str, tuple[dict[str, Any], np.ndarray]] | None = None,
) -> None:
    """Store ``features[split][view]`` with ``labels[split]`` for every split and view (see :func:`save_feature_set`),
    and ``images[split]`` = ``(image_source, image_ids)`` where given.

    An ``(N, 0)`` array (a model without that output) is not stored.
    """
    images = images or {}
    for split, views in features.items():
        source, ids = images.get(split, (None, None))
        for view, array in views.items():
            if np.shape(array)[1]:
                save_feature_set(session, model_version_id, split, view, array, labels[split], ids, source)


def _pointer(row: Any) -> featurestore.Pointer | None:
    return None if row.store_key is None else featurestore.Pointer(row.store_uri, row.store_key, row.store_layout)


def _arrays(session: Session, row: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(features, labels, image_ids)`` of a feature-set row: from the store, or from its blobs (rows from before)."""
    pointer = _pointer(row)
    return (row.features, row.labels, row.image_ids) if pointer is None else featurestore.read(session, pointer)


def copy_feature_sets(session: Session, source_version_id: int, target_version_id: int, views: Sequence[str]) -> None:
    """Copy the source model version's feature sets of ``views`` (every split, image ids included) to the target."""
    source = require_row(session, ModelVersion, source_version_id)
    for fs in source.feature_sets:
        if fs.view in views:
            save_feature_set(session, target_version_id, fs.split, fs.view, *_arrays(session, fs), fs.image_source)


def list_feature_views(session: Session, model_version_id: int, split: str) -> list[str]:
    """Names of the views stored for this model version and split, sorted."""
    require_choice("split", split, SPLITS)
    query = select(FeatureSet.view).where(FeatureSet.model_version_id == model_version_id, FeatureSet.split == split)
    return sorted(session.scalars(query))


def _feature_row(session: Session, model_version_id: int, split: str, view: str) -> Any:
    """The (model version, split, view) row's array columns and pointer; ``ValueError`` naming the stored views."""
    query = select(FeatureSet.features, FeatureSet.labels, FeatureSet.image_ids, FeatureSet.store_uri,
                   FeatureSet.store_key, FeatureSet.store_layout).where(*_where(model_version_id, split, view))
    row = session.execute(query).first()
    if row is None:
        stored = list_feature_views(session, model_version_id, split) if split in SPLITS else []
        raise ValueError(
            f"no {split!r} features with view {view!r} for model version {model_version_id}; "
            f"stored views: {stored or 'none'}"
        )
    return row


def load_feature_set(
    session: Session, model_version_id: int, split: str, view: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(features, labels, image_ids)`` of (model version, split, view); ``ValueError`` naming the stored views."""
    return _arrays(session, _feature_row(session, model_version_id, split, view))


def iter_feature_shards(session: Session, model_version_id: int, split: str, view: str) -> Iterator[FeatureShard]:
    """The set's rows as ``engine.metrics.sharded.Shard``-compatible pieces ``(features, labels, ids)``, in order,
    one shard read at a time (``ids`` = row positions in the set). A row from before the store is sliced likewise.

    The row is looked up now (``ValueError`` when absent); the shards are read as the iterator advances.
    """
    row = _feature_row(session, model_version_id, split, view)
    pointer = _pointer(row)
    return featurestore.blob_shards(row.features, row.labels) if pointer is None else featurestore.shards(session, pointer)


def feature_set_rows(session: Session, feature_set_id: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``lo:hi`` of feature set ``feature_set_id`` as ``(features, labels)``: from the store, only the shards
    holding them (memory: the rows asked for, twice while joined, plus one shard), or from a row's blobs from before."""
    query = select(FeatureSet.features, FeatureSet.labels, FeatureSet.dim, FeatureSet.store_uri, FeatureSet.store_key,
                   FeatureSet.store_layout).where(FeatureSet.id == feature_set_id)
    row = session.execute(query).first()
    if row is None:
        raise ValueError(f"no feature set {feature_set_id} in the database")
    pointer = _pointer(row)
    if pointer is None:
        return row.features[lo:hi], row.labels[lo:hi]
    features, labels = [np.zeros((0, row.dim), np.float32)], [np.zeros(0, np.int64)]
    for shard in featurestore.shards(session, pointer, from_row=lo):  # the shards before ``lo`` are not read
        if not len(shard.ids):
            continue
        start = int(shard.ids[0])
        if start >= hi:
            break
        features.append(shard.features[max(lo - start, 0):hi - start])
        labels.append(shard.labels[max(lo - start, 0):hi - start])
    return np.concatenate(features), np.concatenate(labels)


def load_image_refs(session: Session, model_version_id: int, split: str) -> tuple[dict[str, Any], np.ndarray] | None:
    """``(image_source, image_ids)`` of the model version's ``split`` rows, or None when none were stored."""
    require_choice("split", split, SPLITS)
    query = (select(FeatureSet.image_source, FeatureSet.image_ids, FeatureSet.store_uri, FeatureSet.store_key,
                    FeatureSet.store_layout)
             .where(FeatureSet.model_version_id == model_version_id, FeatureSet.split == split,
                    FeatureSet.image_source.is_not(None))
             .order_by(FeatureSet.id).limit(1))
    row = session.execute(query).first()
    if row is None:
        return None
    pointer = _pointer(row)
    ids = row.image_ids if row.image_ids is not None or pointer is None else featurestore.read_image_ids(session, pointer)
    return row.image_source, ids


def _forget_feature_files(session: Session, experiment_id: int) -> None:
    """Delete the stored files of the experiment's feature sets once the session commits."""
    query = (select(FeatureSet.store_uri, FeatureSet.store_key).join(FeatureSet.model_version)
             .where(ModelVersion.experiment_id == experiment_id, FeatureSet.store_key.is_not(None)))
    for row in session.execute(query):
        featurestore.forget(session, row.store_uri, row.store_key)


# --- compatibility matrices ------------------------------------------------------------------


def save_matrix(
    session: Session,
    experiment_id: int,
    *,
    metric: str,
    protocol: str,
    view: str,
    values: np.ndarray,
    valid_queries: np.ndarray,
    no_positive: np.ndarray,
    summary: dict[str, Any],
    eval_classes: str = "all",
) -> int:
    """Store a T x T compatibility matrix (float64, NaN where undefined), replacing one with the same key."""
    require_choice("protocol", protocol, PROTOCOLS)
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
    key = {"experiment_id": experiment_id, "metric": metric, "protocol": protocol, "view": view,
           "eval_classes": eval_classes}
    return _upsert(session, CompatibilityMatrix, key,
                   {"values": values.astype(np.float64), **counts, "summary": dict(summary)})


def load_matrices(
    session: Session,
    experiment_id: int,
    *,
    metric: str | None = None,
    protocol: str | None = None,
    view: str | None = None,
) -> list[CompatibilityMatrix]:
    """The experiment's matrices, optionally filtered, ordered by (metric, protocol, view, eval_classes)."""
    query = select(CompatibilityMatrix).where(CompatibilityMatrix.experiment_id == experiment_id)
    for column, wanted in ((CompatibilityMatrix.metric, metric), (CompatibilityMatrix.protocol, protocol),
                           (CompatibilityMatrix.view, view)):
        if wanted is not None:
            query = query.where(column == wanted)
    order = (CompatibilityMatrix.metric, CompatibilityMatrix.protocol, CompatibilityMatrix.view,
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
    return _upsert(session, Analysis, {"experiment_id": experiment_id, "kind": kind, "key": key},
                   {"payload": dict(payload), "array": array})


def load_analysis(session: Session, experiment_id: int, kind: str, key: str) -> Analysis | None:
    """The cached result under (experiment, kind, key), or ``None`` on a miss."""
    query = select(Analysis).where(Analysis.experiment_id == experiment_id, Analysis.kind == kind, Analysis.key == key)
    return session.scalars(query).first()
