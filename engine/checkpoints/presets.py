"""Comparison presets: named ``compare-checkpoints`` specs (the run presets of ``engine.core.presets`` are training
configs; a comparison of given models is not one).

``text-upgrade``: the offline MiniLM sequence (L3 -> L6 -> L6 int8, ``engine.data.text_model_files.TEXT_SEQUENCE``) on
WordNet's qrels task, 500 example sentences against 2,000 definitions, with a training split of 1,000 other synsets
(2,000 texts labelled by supersense) for paper 004's adapters; encoder view (text encoders have no classifier head).
The dashboard's "Check a text-embedding upgrade" entry fills its form from it (``app.checkpoint_form``), and
``compare-checkpoints --preset text-upgrade`` runs it.
"""
from __future__ import annotations

import copy
from typing import Any

from engine.data.text_model_files import TEXT_SEQUENCE

TEXT_UPGRADE = "text-upgrade"
COMPARISON_PRESETS: dict[str, dict[str, Any]] = {
    TEXT_UPGRADE: {"name": "text upgrade: MiniLM L3 -> L6 -> L6 int8",
                   "models": [{"path": f"pretrained:{name}"} for name in TEXT_SEQUENCE],
                   "dataset": "wordnet:task=qrels,queries=500,gallery=2000,seed=0,train=1000",
                   "views": ["encoder"], "metrics": ["recall@1", "recall@10", "map"]},
}


def comparison_preset(name: str) -> dict[str, Any]:
    """A copy of the comparison spec named ``name``; ``ValueError`` (one line) for an unknown name."""
    if name not in COMPARISON_PRESETS:
        raise ValueError(f"no comparison preset {name!r}; known: {', '.join(COMPARISON_PRESETS)}")
    return copy.deepcopy(COMPARISON_PRESETS[name])


__all__ = ["COMPARISON_PRESETS", "TEXT_UPGRADE", "comparison_preset"]
