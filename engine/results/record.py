"""Recording an experiment: the one write path of training runs, checkpoint comparisons and evaluate-folder.

An experiment is written as: :func:`start_experiment` -> :func:`record_version` per step (the model and its
outputs per split and view) -> :func:`record_matrices` per view -> :func:`finish`. These take the caller's
session, so the caller picks the transactions: :func:`record_experiment` writes a whole experiment in one
(a comparison or a feature folder: an error leaves nothing), the pipeline commits step by step so that a
killed run resumes (:func:`resume_experiment`) and a cancelled one is wiped (:func:`discard`).
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from engine.core.fingerprint import MAX_TEXT, Fingerprint, normalisation_of
from engine.core.kinds import STRICT
from engine.core.config import neutral_for_hash
from engine.core.contract import RAW_VIEWS
from engine.data.samples import SampleRefs
from engine.data.text_model_files import file_sha256
from engine.metrics.compatibility import MatrixResult, stored_summary
from storage import (
    add_model_version,
    clear_experiment,
    copy_feature_sets,
    create_experiment,
    create_study,
    find_experiment_by_hash,
    get_experiment,
    init_db,
    json_hash,
    list_model_versions,
    list_studies,
    rename_model_version,
    save_feature_sets,
    save_matrix,
    session_scope,
    set_experiment_status,
    set_experiment_study,
)
from storage.checkpoint_folders import stored_checkpoint
from storage.featurestore import check_store


def config_hash(config: dict) -> str:
    """A stable hash of a JSON-able config (key order does not matter); the same hash marks identical jobs.

    Keys added later at their neutral value are left out (``engine.core.config.neutral_for_hash``), so runs stored
    before they existed keep their hash."""
    return json_hash(neutral_for_hash(config))


@dataclass(frozen=True)
class NewVersion:
    """One model version to record: what the model is, and its outputs ``{split: {view: array}}`` with
    ``labels[split]`` (an ``(N, 0)`` output is not stored), or ``copied_from``: the stored model version
    whose raw outputs it shares (a method evaluated on another method's models). ``refs[split]``: where each
    row's image comes from (``engine.data.samples``), stored beside the features; a split without refs has none."""

    architecture: str
    method: str
    classes: Sequence[int]
    num_outputs: int
    feature_dim: int
    outputs: Mapping[str, Mapping[str, np.ndarray]]
    labels: Mapping[str, np.ndarray]
    class_names: Sequence[str] | None = None
    checkpoint_path: str | None = None
    replaced: bool = False
    copied_from: int | None = None
    name: str | None = None  # the user's name for the model (v1, v2, ...), e.g. a checkpoint comparison's label
    refs: Mapping[str, SampleRefs | None] | None = None
    weights_sha256: str | None = None  # of the model's weights file (None: hashed from checkpoint_path when a file)
    pooling: str | None = None  # a text model's pooling (mean, cls), recorded in the encoder view's fingerprint


@dataclass(frozen=True)
class Resumed:
    """The experiment a run continues: its id, the steps already stored, and whether it is finished."""

    experiment_id: int
    done_steps: frozenset[int]
    finished: bool


def start_experiment(s: Session, *, name: str, method: str, config: dict[str, Any], study_id: int | None = None) -> int:
    """Add a queued experiment under its config hash; return its id. An unusable feature store is refused first
    (one-line ``ValueError``), before any work whose features would go there."""
    check_store(s)
    return create_experiment(s, name=name, method=method, config=config, config_hash=config_hash(config),
                             study_id=study_id).id


def record_version(s: Session, experiment_id: int, step: int, version: NewVersion) -> int:
    """Store the model of ``step`` (1-based) with its outputs; return the model version's id."""
    mv = add_model_version(s, experiment_id, step, architecture=version.architecture, method=version.method,
                           classes=list(version.classes), num_outputs=version.num_outputs,
                           feature_dim=version.feature_dim,
                           class_names=None if version.class_names is None else list(version.class_names),
                           checkpoint_path=version.checkpoint_path, replaced=version.replaced)
    compact = {split: r.compact() for split, r in (version.refs or {}).items() if r is not None}
    save_feature_sets(s, mv.id, version.outputs, version.labels, {split: (r.source, r.ids) for split, r in compact.items()},
                      version_fingerprints(version, experiment_id, step))
    if version.name:
        rename_model_version(s, mv.id, version.name)
    if version.copied_from is not None:
        copy_feature_sets(s, version.copied_from, mv.id, RAW_VIEWS)
    return mv.id


def fingerprint_name(name: str | None, architecture: str, method: str, experiment_id: int, step: int) -> str:
    """The name a stored model's fingerprint carries: the user's name for it, else ``ARCH METHOD, experiment E step
    S`` (unique in its database)."""
    return (name or f"{architecture} {method}, experiment {experiment_id} step {step}")[:MAX_TEXT]


def version_fingerprints(version: NewVersion, experiment_id: int, step: int) -> dict[str, dict[str, dict[str, Any]]]:
    """``{split: {view: fingerprint JSON}}`` of a version's outputs: the weights' sha256 (given, or of the checkpoint
    file), the user's name for the model or ``ARCH METHOD, experiment E step S``, each array's width and measured
    normalisation, and the pooling on the encoder view of a text model."""
    sha = version.weights_sha256
    if sha is None and version.checkpoint_path is not None and os.path.isfile(version.checkpoint_path):
        info = os.stat(version.checkpoint_path)
        sha = file_sha256(version.checkpoint_path, info.st_size, info.st_mtime_ns)
    name = fingerprint_name(version.name, version.architecture, version.method, experiment_id, step)
    return {split: {view: Fingerprint(int(np.shape(x)[1]), sha256=sha or None, name=name,
                                      normalisation=normalisation_of(x),
                                      pooling=version.pooling if view == "encoder" else None).to_json()
                    for view, x in views.items() if np.shape(x)[1]}
            for split, views in version.outputs.items()}


def record_matrices(s: Session, experiment_id: int, result: MatrixResult, *, gallery_kind: str, view: str,
                    eval_classes: str = "all", ties: str = STRICT, arithmetic: Mapping[str, Any] | None = None) -> None:
    """Store every metric's matrix of ``result`` for ``view`` with its summary (AC/AA/ACA, update gain, paired test)
    and, when given, the arithmetic that made the features (``summary["arithmetic"]``, ``engine.models.arithmetic``)."""
    for metric, C in result.values.items():
        summary = stored_summary(result, metric, ties=ties)
        if arithmetic is not None:
            summary["arithmetic"] = dict(arithmetic)
        save_matrix(s, experiment_id, metric=metric, gallery_kind=gallery_kind, view=view, values=C,
                    valid_queries=result.valid_queries, no_positive=result.no_positive,
                    summary=summary, eval_classes=eval_classes)


def finish(s: Session, experiment_id: int) -> None:
    """Mark the experiment done."""
    set_experiment_status(s, experiment_id, "done")


def record_experiment(db: Engine, *, name: str, method: str, config: dict[str, Any], versions: Sequence[NewVersion],
                      results: Mapping[str, MatrixResult], gallery_kind: str, ties: str = STRICT,
                      study_kind: str | None = None) -> int:
    """Write a whole experiment (steps 1..T, a matrix set per view, done) in one transaction; return its id.

    ``study_kind``: also create a study of that kind, with the same name and config, holding the experiment.
    """
    init_db(db)
    with session_scope(db) as s:
        study_id = None if study_kind is None else create_study(s, name=name, kind=study_kind, config=config).id
        exp_id = start_experiment(s, name=name, method=method, config=config, study_id=study_id)
        for step, version in enumerate(versions, start=1):
            record_version(s, exp_id, step, version)
        for view, result in results.items():
            record_matrices(s, exp_id, result, gallery_kind=gallery_kind, view=view, ties=ties)
        finish(s, exp_id)
        return exp_id


# --- runs recorded step by step ----------------------------------------------------------------


def open_study(db: Engine, *, name: str, kind: str, config: dict[str, Any]) -> int:
    """The id of the study of ``kind`` with exactly this config (the newest), or of a new one."""
    with session_scope(db) as s:
        same = [st for st in list_studies(s) if st.kind == kind and st.config == config]
        return (same[0] if same else create_study(s, name=name, kind=kind, config=config)).id


def resume_experiment(db: Engine, *, name: str, method: str, config: dict[str, Any], study_id: int | None) -> Resumed:
    """The experiment to continue for ``config``: a finished one is reused as it is, an unfinished one resumes
    (set running, joining ``study_id`` if it had no study) from its steps whose checkpoint file still exists,
    a cancelled one (or none) is replaced by a new experiment."""
    with session_scope(db) as s:
        exp = find_experiment_by_hash(s, config_hash(config), status=None)
        if exp is None or exp.status == "cancelled":
            return Resumed(start_experiment(s, name=name, method=method, config=config, study_id=study_id), frozenset(), False)
        if exp.status == "done":
            return Resumed(exp.id, frozenset(v.step for v in list_model_versions(s, exp.id)), True)
        check_store(s)
        if study_id is not None and exp.study_id is None:
            set_experiment_study(s, exp.id, study_id)
        done = frozenset(v.step for v in list_model_versions(s, exp.id) if stored_checkpoint(v.checkpoint_path))
        set_experiment_status(s, exp.id, "running")
        return Resumed(exp.id, done, False)


def set_status(db: Engine, experiment_id: int, status: str) -> None:
    """Set the experiment's status in its own transaction."""
    with session_scope(db) as s:
        set_experiment_status(s, experiment_id, status)


def experiment_cancelled(db: Engine, experiment_id: int) -> bool:
    """Whether someone cancelled this one experiment (``storage.cancel_experiment``) while its run goes on."""
    with session_scope(db) as s:
        exp = get_experiment(s, experiment_id)
        return exp is not None and exp.status == "cancelled"


def fail(db: Engine, experiment_id: int, exc: BaseException) -> None:
    """Mark the experiment failed with the exception's type and message."""
    with session_scope(db) as s:
        set_experiment_status(s, experiment_id, "failed", error=f"{type(exc).__name__}: {exc}")


def discard(db: Engine, experiment_id: int) -> None:
    """After a cancel: delete everything recorded for the experiment and mark it cancelled (one transaction)."""
    with session_scope(db) as s:
        clear_experiment(s, experiment_id)
        set_experiment_status(s, experiment_id, "cancelled")
