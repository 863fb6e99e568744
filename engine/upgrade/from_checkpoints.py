"""``check-upgrade --model OLD --model NEW --dataset ...``: the upgrade verdict of two checkpoints.

The two models are loaded and embed the images once, through ``compare-checkpoints``'s pipeline
(:func:`engine.checkpoints.compare.compare_checkpoints`, one view and one metric); the verdict is
:func:`engine.upgrade.verdict.check_upgrade` on those features, so it equals ``check-upgrade --features`` on a
folder holding the same arrays. With a database the comparison is stored as ``compare-checkpoints`` stores it
(one experiment, steps 1 = old and 2 = new, carrying the report's model names), which the dashboard's
Upgrade check reads back.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine

from engine.core.kinds import STRICT
from engine.checkpoints.compare import Comparison, compare_checkpoints, model_labels
from engine.checkpoints.request import comparison_spec
from engine.checkpoints.store import store_comparison
from engine.core.cell import cell_recipe
from engine.metrics.compatibility import CellFeatures
from engine.upgrade.verdict import DEFAULT_INTERVAL, UpgradeReport, check_settings, check_upgrade


def comparison_pair(cmp: Comparison, view: str) -> tuple[CellFeatures, CellFeatures]:
    """Old (model 1) and new (model 2) features of a comparison in one space: PSP/LSP on the old model's classes."""
    if len(cmp.outputs) != 2:
        raise ValueError(f"an upgrade check compares two models, old then new; the comparison has {len(cmp.outputs)}")
    recipe = cell_recipe(view, cmp.class_names[1], cmp.class_names[0], same_set=cmp.same_set)  # new query, old gallery
    ql, gl = cmp.split_labels["query"], cmp.split_labels["gallery"]
    pair = []
    for raw, side in ((cmp.outputs[0], "gallery"), (cmp.outputs[1], "query")):  # each model in its side's columns
        q, q_labels, _ = recipe.side(side, raw["query"][recipe.raw], ql)
        g, g_labels, _ = recipe.side(side, raw["gallery"][recipe.raw], gl)
        pair.append(CellFeatures(q, q_labels, g, g_labels))
    dims = [p.gallery.shape[1] for p in pair]
    if not recipe.derived and (0 in dims or dims[0] != dims[1]):
        raise ValueError(f"{cmp.labels[0]} has {dims[0]}-d and {cmp.labels[1]} {dims[1]}-d encoder features: a new-query / "
                         "old-gallery search needs one feature space; use --view psp or --view lsp (class outputs)")
    return pair[0], pair[1]


def check_models(spec: Mapping[str, Any], *, view: str = "encoder", names: Sequence[str] | None = None,
                 metric: str = "recall@1", resamples: int, level: float, seed: int, margin: float = 0.0,
                 ties: str = STRICT, interval: str = DEFAULT_INTERVAL,
                 db: Engine | None = None, **backfill: Any) -> tuple[UpgradeReport, Comparison, int | None]:
    """The verdict of the second model of ``spec`` over the first on its images; stored in ``db`` when given.

    ``spec`` is a comparison spec without views or metrics (see :func:`engine.checkpoints.request.comparison_spec`).
    ``names`` default to the checkpoints' file stems; they name the stored models too; ``backfill``: check_upgrade's
    ``orderings`` and ``rollout``. Everything that can be
    checked before the embedding is; ``ValueError`` with one sentence for any bad input, and then nothing is stored.
    """
    checked = comparison_spec({**spec, "views": [view], "metrics": [metric]})
    if len(checked.models) != 2:
        raise ValueError(f"check-upgrade compares two models: --model OLD --model NEW; got {len(checked.models)} --model")
    labels = list(names) if names else model_labels(checked.models)
    try:
        labels, metric = check_settings(labels, metric=metric, resamples=resamples, level=level, margin=margin, ties=ties,
                                        interval=interval)
    except ValueError as exc:
        raise ValueError(f"{exc}{'' if names else ' (the names come from the file names; give --name OLD --name NEW)'}") from None
    checked = dataclasses.replace(checked, models=tuple(dataclasses.replace(m, label=n)
                                                        for m, n in zip(checked.models, labels)))
    cmp = compare_checkpoints(checked)
    old, new = comparison_pair(cmp, view)
    report = check_upgrade(old, new, names=labels, metric=metric, resamples=resamples, level=level, seed=seed,
                           same_set=cmp.same_set, margin=margin, ties=ties, interval=interval, **backfill)
    experiment_id = store_comparison(db, cmp) if db is not None else None
    return report, cmp, experiment_id

