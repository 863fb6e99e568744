"""Feature sets: one (model version, split, view) of outputs, written to the feature store (storage.featurestore)
or, for rows from before it, read from their SQL blobs. Every function takes the caller's ``Session``."""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import featurestore
from storage.featurestore import FeatureShard
from storage.models import SPLITS, FeatureSet, ModelVersion
from storage.rows import require_choice, require_row, upsert
from storage.types import storable_array

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
    fingerprint: dict[str, Any] | None = None,
) -> int:
    """Store the features of (model version, split, view), replacing any earlier ones; return the row id.

    ``image_source`` (a JSON-able dict, ``engine.data.samples``) says what ``image_ids`` index: with it,
    ``image_ids`` are needed. Inputs are validated before anything is written (``ValueError``). The arrays go to
    the feature store when there is one (``storage.featurestore``), else into the row. The row write is a single
    INSERT or UPDATE, so a failure leaves the previous features intact and never a duplicate. ``fingerprint``: which
    model made the vectors (``engine.core.fingerprint.Fingerprint.to_json()``, its ``dim`` the features' width).
    """
    require_choice("split", split, SPLITS)
    if not view:
        raise ValueError("view must be a non-empty name such as 'encoder', 'psp' or 'F(old)'")
    features, labels, image_ids = _check_feature_arrays(features, labels, image_ids)
    if image_source is not None and (image_ids is None or image_ids.dtype.kind not in "iu"):
        raise ValueError("an image_source needs integer image_ids (one index into the source per feature row)")
    _check_fingerprint(fingerprint, features.shape[1])
    require_row(session, ModelVersion, model_version_id)
    values = _stored_values(session, model_version_id, split, features, labels, image_ids)
    return _upsert_feature_set(session, model_version_id, split, view, values, image_source, fingerprint)


def _check_fingerprint(fingerprint: dict[str, Any] | None, dim: int) -> None:
    """A fingerprint is a JSON object whose ``dim`` is the features' width (its fields are the engine's to check)."""
    if fingerprint is not None and (not isinstance(fingerprint, dict) or fingerprint.get("dim") != dim):
        raise ValueError(f"a feature set's fingerprint must be a JSON object with dim {dim}, got "
                         f"{str(fingerprint)[:100]!r}")


def _upsert_feature_set(session: Session, model_version_id: int, split: str, view: str, values: dict[str, Any],
                        image_source: dict[str, Any] | None, fingerprint: dict[str, Any] | None = None) -> int:
    """Write the row (one INSERT or UPDATE); the replaced set's files go once the session commits."""
    old = session.execute(select(FeatureSet.store_uri, FeatureSet.store_key)
                          .where(*_where(model_version_id, split, view))).first()
    count, dim = (values["store_layout"]["shape"] if values["store_layout"] is not None
                  else values["features"].shape)
    values = {**values, "image_source": image_source, "dim": int(dim), "count": int(count), "fingerprint": fingerprint}
    row_id = upsert(session, FeatureSet, {"model_version_id": model_version_id, "split": split, "view": view}, values)
    if old is not None and old.store_key is not None and (old.store_uri, old.store_key) != (values["store_uri"],
                                                                                             values["store_key"]):
        featurestore.forget(session, old.store_uri, old.store_key)
    return row_id


def save_stored_feature_set(session: Session, model_version_id: int, split: str, view: str,
                            pointer: featurestore.Pointer, image_source: dict[str, Any] | None = None,
                            fingerprint: dict[str, Any] | None = None) -> int:
    """Point (model version, split, view) at a set already in the store (``featurestore.commit_parts``), replacing
    any earlier one; return the row id. ``image_source``, ``fingerprint``: as :func:`save_feature_set`."""
    require_choice("split", split, SPLITS)
    _check_fingerprint(fingerprint, pointer.layout["shape"][1])
    require_row(session, ModelVersion, model_version_id)
    layout = pointer.layout
    values = {"features": np.zeros((0, layout["shape"][1]), np.dtype(layout["read_dtype"])),
              "labels": np.zeros(0, np.dtype(layout["labels"])), "image_ids": None, "store_uri": pointer.uri,
              "store_key": pointer.key, "store_layout": layout}
    return _upsert_feature_set(session, model_version_id, split, view, values, image_source, fingerprint)


def save_feature_sets(
    session: Session,
    model_version_id: int,
    features: Mapping[str, Mapping[str, np.ndarray]],
    labels: Mapping[str, np.ndarray],
    images: Mapping[str, tuple[dict[str, Any], np.ndarray]] | None = None,
    fingerprints: Mapping[str, Mapping[str, dict[str, Any]]] | None = None,
) -> None:
    """Store ``features[split][view]`` with ``labels[split]`` for every split and view (see :func:`save_feature_set`),
    ``images[split]`` = ``(image_source, image_ids)`` and ``fingerprints[split][view]`` where given.

    An ``(N, 0)`` array (a model without that output) is not stored.
    """
    images = images or {}
    for split, views in features.items():
        source, ids = images.get(split, (None, None))
        for view, array in views.items():
            if np.shape(array)[1]:
                save_feature_set(session, model_version_id, split, view, array, labels[split], ids, source,
                                 ((fingerprints or {}).get(split) or {}).get(view))


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
            save_feature_set(session, target_version_id, fs.split, fs.view, *_arrays(session, fs), fs.image_source,
                             fs.fingerprint)


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


def feature_set_ref(session: Session, model_version_id: int, split: str, view: str) -> tuple[int, int]:
    """``(id, dim)`` of the (model version, split, view) set, without reading its arrays; ``ValueError`` when absent."""
    row = session.execute(select(FeatureSet.id, FeatureSet.dim).where(*_where(model_version_id, split, view))).first()
    if row is None:
        _feature_row(session, model_version_id, split, view)  # raises, naming the stored views
    return int(row.id), int(row.dim)


def feature_set_fingerprint(session: Session, model_version_id: int, split: str, view: str) -> dict[str, Any] | None:
    """The fingerprint stored with (model version, split, view) (None: a set stored before fingerprints);
    ``ValueError`` when there is no such set."""
    row = session.execute(select(FeatureSet.id, FeatureSet.fingerprint).where(*_where(model_version_id, split, view))
                          ).first()
    if row is None:
        _feature_row(session, model_version_id, split, view)  # raises, naming the stored views
    return row.fingerprint


def feature_set_size(session: Session, feature_set_id: int) -> tuple[int, int] | None:
    """``(rows, dim)`` of feature set ``feature_set_id`` without reading its arrays; None when there is no such set."""
    row = session.execute(select(FeatureSet.count, FeatureSet.dim).where(FeatureSet.id == feature_set_id)).first()
    return None if row is None else (int(row.count), int(row.dim))


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


def forget_feature_files(session: Session, experiment_id: int) -> None:
    """Delete the stored files of the experiment's feature sets once the session commits."""
    query = (select(FeatureSet.store_uri, FeatureSet.store_key).join(FeatureSet.model_version)
             .where(ModelVersion.experiment_id == experiment_id, FeatureSet.store_key.is_not(None)))
    for row in session.execute(query):
        featurestore.forget(session, row.store_uri, row.store_key)
