"""Stored features of an experiment's model versions, read into the views the analyses compare.

Feature views: the engine stores the raw views ``encoder``, ``logits`` and ``softmax`` per model
version and split. ``psp`` / ``lsp`` are derived from ``softmax`` / ``logits`` by
:func:`engine.features.output_view`, the derivation the compatibility matrices use, with the
experiment's ``eval.topk``. When two models are compared in one space (map, drift, Definition 1,
backfilling, neighbours), both keep the classes of the *gallery* (old) model, aligned by class name
(:func:`engine.checkpoints.classes.aligned_columns`: the first C^k outputs for a training run's nested
models), as the compatibility matrix's cross-test does; NC1-NC4 and angles use each model's own classes.

numpy only (the dashboard reads neighbours through here); :func:`head_weights` imports torch when called.
Rows are read through ``storage/`` functions only.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from engine.checkpoints.classes import aligned_columns, index_names
from engine.contract import DERIVED_VIEWS, available_views
from engine.features import Columns, output_view
from storage import get_experiment, get_model_version, list_feature_views, list_model_versions, load_feature_set, session_scope

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Version:
    """What the analyses need of a model version (plain values, usable after the session closes)."""

    id: int
    step: int
    classes: tuple[int, ...]
    class_names: tuple[str, ...] | None
    checkpoint_path: str | None

    @classmethod
    def of(cls, mv: Any) -> "Version":
        return cls(mv.id, mv.step, tuple(mv.classes), None if mv.class_names is None else tuple(mv.class_names),
                   mv.checkpoint_path)

    def name(self, label: int) -> str:
        if self.class_names is not None and 0 <= label < len(self.class_names):
            return self.class_names[label]
        return f"class {label}"


def _experiment_config(s: Session, experiment_id: int) -> dict[str, Any]:
    """An experiment's stored config."""
    exp = get_experiment(s, experiment_id)
    if exp is None:
        raise ValueError(f"experiment {experiment_id} does not exist")
    return dict(exp.config)


def _model_version(s: Session, version_id: int) -> tuple[Version, int]:
    """A model version and the id of its experiment."""
    mv = get_model_version(s, version_id)
    if mv is None:
        raise ValueError(f"model version {version_id} does not exist")
    return Version.of(mv), mv.experiment_id


def load_experiment(db: Engine, experiment_id: int) -> tuple[dict[str, Any], list[Version]]:
    """An experiment's stored config and its model versions in step order."""
    with session_scope(db) as s:
        config = _experiment_config(s, experiment_id)
        return config, [Version.of(mv) for mv in list_model_versions(s, experiment_id)]


def load_cell_versions(db: Engine, query_version_id: int, gallery_version_id: int
                       ) -> tuple[dict[str, Any], Version, Version]:
    """``(config of the gallery model's experiment, query version, gallery version)`` of one cell."""
    with session_scope(db) as s:
        vq, _ = _model_version(s, query_version_id)
        vg, experiment_id = _model_version(s, gallery_version_id)
        return _experiment_config(s, experiment_id), vq, vg


def version_of_step(versions: list[Version], step: int) -> Version:
    """The model version of ``step``; ``ValueError`` naming the stored steps otherwise."""
    for v in versions:
        if v.step == step:
            return v
    raise ValueError(f"the experiment has no model of step {step}; stored steps: {[v.step for v in versions] or 'none'}")


def topk_of(config: dict[str, Any]) -> int | None:
    """The PSP/LSP top-k of an experiment's stored config (``eval.topk``; None: keep every class)."""
    return config.get("eval", {}).get("topk")


def topk_note(topk: int | None) -> str:
    """The clause a note adds about the top-k kept (empty when every class is kept)."""
    return "" if topk is None else f", top-{topk} entries kept"


def load_view(db: Engine, version: Version, split: str, view: str, *, columns: Columns | None = None,
              topk: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(features, labels, image_ids)`` of one view; PSP/LSP keep ``columns`` of the outputs (default: the model's
    own classes) with top-``topk`` (:func:`engine.features.output_view`)."""
    with session_scope(db) as s:
        stored = list_feature_views(s, version.id, split)
        raw = view if view in stored else DERIVED_VIEWS.get(view)
        if raw is None or raw not in stored:
            raise ValueError(f"model of step {version.step} has no {split!r} features for view {view!r}; "
                             f"views available: {', '.join(available_views(stored)) or 'none'}")
        features, labels, image_ids = load_feature_set(s, version.id, split, raw)
    if raw != view:
        features = output_view({raw: features}, view, columns=len(version.classes) if columns is None else columns,
                               topk=topk)
    return np.asarray(features), np.asarray(labels), image_ids


def cell_columns(query: Version, gallery: Version) -> tuple[np.ndarray, np.ndarray]:
    """The PSP/LSP columns of the cell (query model, gallery model): the gallery's classes the query model knows."""
    def names(v: Version) -> tuple[str, ...]:
        return v.class_names if v.class_names is not None else index_names(len(v.classes))

    return aligned_columns(names(query), names(gallery))


def joint_pair(db: Engine, old: Version, new: Version, split: str, view: str, topk: int | None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Old and new features of the same images in one space (PSP/LSP on the old model's classes), and labels."""
    new_cols, old_cols = cell_columns(new, old)
    f_old, labels, _ = load_view(db, old, split, view, columns=old_cols, topk=topk)
    f_new, labels_new, _ = load_view(db, new, split, view, columns=new_cols, topk=topk)
    if len(labels) != len(labels_new) or not np.array_equal(labels, labels_new):
        raise ValueError(f"the {split} features of steps {old.step} and {new.step} do not embed the same images "
                         f"({len(labels)} vs {len(labels_new)} rows, or different labels); cannot compare them row by row")
    return f_old, f_new, labels


def head_weights(version: Version) -> tuple[np.ndarray | None, bool]:
    """The classifier rows in class order (row y = class y) and whether they are fixed prototypes (loads torch)."""
    from storage.checkpoint_folders import stored_checkpoint

    file = stored_checkpoint(version.checkpoint_path)
    if file is None:
        return None, False
    import torch

    from engine.models import FixedHead, load_checkpoint

    net = load_checkpoint(file, device="cpu")
    head = net.head
    with torch.no_grad():
        rows = head.class_to_output(torch.arange(head.num_outputs))
        weights = head.weight.detach()[rows].double().numpy()
    return weights, isinstance(head, FixedHead)
