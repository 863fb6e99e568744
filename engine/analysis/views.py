"""Stored features of an experiment's model versions, read into the views the analyses compare.

Feature views: the engine stores the raw views ``encoder``, ``logits`` and ``softmax`` per model
version and split. Two models compared in one space (map, drift, Definition 1, backfilling, neighbours,
the upgrade check) are read through the recipe of the cell (new / query model, old / gallery model),
:func:`experiment_recipe`, the one the compatibility matrices use (:mod:`engine.core.cell`): ``psp`` / ``lsp``
derived from ``softmax`` / ``logits`` on the *gallery* (old) model's classes, aligned by class name (the first
C^k outputs for a training run's nested models), with the experiment's ``eval.topk`` and, where the rows are
evaluated, its ``eval_classes``; NC1-NC4 and angles use each model's own classes.

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

from engine.core.classes import index_names
from engine.core.contract import available_views
from engine.core.cell import CellRecipe, cell_recipe, recipe_settings
from storage import get_experiment, get_model_version, list_feature_views, list_model_versions, load_feature_set, session_scope

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class StoredVersion:
    """What the analyses need of a model version (plain values, usable after the session closes)."""

    id: int
    step: int
    classes: tuple[int, ...]
    class_names: tuple[str, ...] | None
    checkpoint_path: str | None

    @classmethod
    def of(cls, mv: Any) -> "StoredVersion":
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


def _model_version(s: Session, version_id: int) -> tuple[StoredVersion, int]:
    """A model version and the id of its experiment."""
    mv = get_model_version(s, version_id)
    if mv is None:
        raise ValueError(f"model version {version_id} does not exist")
    return StoredVersion.of(mv), mv.experiment_id


def load_experiment(db: Engine, experiment_id: int) -> tuple[dict[str, Any], list[StoredVersion]]:
    """An experiment's stored config and its model versions in step order."""
    with session_scope(db) as s:
        config = _experiment_config(s, experiment_id)
        return config, [StoredVersion.of(mv) for mv in list_model_versions(s, experiment_id)]


def load_cell_versions(db: Engine, query_version_id: int, gallery_version_id: int
                       ) -> tuple[dict[str, Any], StoredVersion, StoredVersion]:
    """``(config of the gallery model's experiment, query version, gallery version)`` of one cell."""
    with session_scope(db) as s:
        vq, _ = _model_version(s, query_version_id)
        vg, experiment_id = _model_version(s, gallery_version_id)
        return _experiment_config(s, experiment_id), vq, vg


def version_of_step(versions: list[StoredVersion], step: int) -> StoredVersion:
    """The model version of ``step``; ``ValueError`` naming the stored steps otherwise."""
    for v in versions:
        if v.step == step:
            return v
    raise ValueError(f"the experiment has no model of step {step}; stored steps: {[v.step for v in versions] or 'none'}")


def class_list(version: StoredVersion) -> tuple[str, ...]:
    """A model's classes as a cell aligns them: its class names, else its output indices (``"0" .. "C-1"``)."""
    return version.class_names if version.class_names is not None else index_names(len(version.classes))


def experiment_recipe(config: dict[str, Any], view: str, query: StoredVersion, gallery: StoredVersion, *,
                      every_row: bool = False) -> CellRecipe:
    """The recipe of the cell (query model, gallery model) of a stored experiment, as its matrices read it
    (:func:`engine.core.cell.cell_recipe` with the stored ``eval`` settings); ``every_row``: keep every stored row
    whatever ``eval_classes`` says (the map, geometry and neighbours show each stored row)."""
    settings = recipe_settings(config)
    if every_row:
        settings["eval_classes"] = "all"
    return cell_recipe(view, class_list(query), class_list(gallery), **settings)


def topk_note(topk: int | None) -> str:
    """The clause a note adds about the top-k kept (empty when every class is kept)."""
    return "" if topk is None else f", top-{topk} entries kept"


def seen_note(recipe: CellRecipe, gallery: StoredVersion) -> list[str]:
    """The note saying that ``eval_classes = seen`` restricted the rows (empty when it did not)."""
    if recipe.below is None:
        return []
    return [f"eval_classes = seen: queries and gallery restricted to the old model's {len(gallery.classes)} classes"]


def load_side(db: Engine, version: StoredVersion, split: str, recipe: CellRecipe, side: str
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """``(features, labels, image_ids, rows)`` of one model's stored ``split`` read as the ``side`` of a cell
    (:meth:`engine.core.cell.CellRecipe.side`): the recipe's rows (``rows``: their stored positions), in its view."""
    with session_scope(db) as s:
        stored = list_feature_views(s, version.id, split)
        raw = recipe.view if recipe.view in stored else recipe.raw
        if raw not in stored:
            raise ValueError(f"model of step {version.step} has no {split!r} features for view {recipe.view!r}; "
                             f"views available: {', '.join(available_views(stored)) or 'none'}")
        features, labels, image_ids = load_feature_set(s, version.id, split, raw)
    if raw == recipe.view and recipe.derived:  # a PSP/LSP view stored as it is (a feature folder): the rows only
        rows = np.flatnonzero(recipe.kept_rows(labels))
        features, labels = np.asarray(features)[rows], np.asarray(labels)[rows]
    else:
        features, labels, rows = recipe.side(side, features, labels)
    return np.asarray(features), np.asarray(labels), None if image_ids is None else np.asarray(image_ids)[rows], rows


def load_view(db: Engine, version: StoredVersion, split: str, view: str, *, topk: int | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(features, labels, image_ids)`` of one model's own view, every stored row; PSP/LSP keep the model's own
    classes with top-``topk`` (the cell of the model with itself)."""
    own = cell_recipe(view, len(version.classes), len(version.classes), topk=topk)
    return load_side(db, version, split, own, "gallery")[:3]


def joint_pair(db: Engine, old: StoredVersion, new: StoredVersion, split: str, recipe: CellRecipe
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Old and new features of the same images in one space, and labels: ``recipe`` is the cell (new query, old
    gallery), so PSP/LSP are on the old model's classes."""
    f_old, labels, _, _ = load_side(db, old, split, recipe, "gallery")
    f_new, labels_new, _, _ = load_side(db, new, split, recipe, "query")
    if len(labels) != len(labels_new) or not np.array_equal(labels, labels_new):
        raise ValueError(f"the {split} features of steps {old.step} and {new.step} do not embed the same images "
                         f"({len(labels)} vs {len(labels_new)} rows, or different labels); cannot compare them row by row")
    return f_old, f_new, labels


def head_weights(version: StoredVersion) -> tuple[np.ndarray | None, bool]:
    """The classifier rows in class order (row y = class y) and whether they are fixed prototypes (loads torch);
    ``(None, False)`` without a Compatibility Lab network checkpoint (none recorded, gone, or a compared model's
    own file: a state_dict, pretrained weights, a text encoder)."""
    from storage.checkpoint_folders import stored_checkpoint

    file = stored_checkpoint(version.checkpoint_path)
    if file is None:
        return None, False
    import torch
    from safetensors import SafetensorError

    from engine.models import FixedHead, load_checkpoint
    from engine.models.checkpoint import read_checkpoint_meta

    try:
        read_checkpoint_meta(file)  # the header only: is it one of ours?
    except (SafetensorError, ValueError, OSError):
        return None, False
    net = load_checkpoint(file, device="cpu")
    head = net.head
    with torch.no_grad():
        rows = head.class_to_output(torch.arange(head.num_outputs))
        weights = head.weight.detach()[rows].double().numpy()
    return weights, isinstance(head, FixedHead)
