"""What a checkpoint comparison computed, before (or without) storing it: the record both the image path
(:mod:`engine.checkpoints.compare`) and the text path (:mod:`engine.checkpoints.text_compare`) return, and the two
helpers they share; neither path imports the other for it."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.checkpoints.request import ComparisonSpec, ModelSource, is_text_model, source_name
from engine.data.samples import SampleRefs
from engine.metrics.compatibility import MatrixResult

if TYPE_CHECKING:  # an annotation only: the record itself needs no torch
    from engine.checkpoints.loading import LoadedModel

Progress = Callable[[float, str], None]


@dataclass
class Comparison:
    """Everything computed for a comparison, before (or without) storing it."""

    spec: ComparisonSpec
    models: list[LoadedModel]
    labels: list[str]  # short model names (file stems)
    class_names: list[tuple[str, ...]]  # per model, in output order
    outputs: list[dict[str, dict[str, np.ndarray]]]  # [model][split][raw view]
    split_labels: dict[str, np.ndarray]
    dataset_classes: tuple[str, ...]
    same_set: bool
    shared: np.ndarray  # T x T: classes shared by query model t and gallery model k (-1 above the diagonal)
    results: dict[str, MatrixResult]
    notes: list[str] = field(default_factory=list)
    refs: dict[str, SampleRefs | None] = field(default_factory=dict)  # per split: each row's image (engine.data.samples)
    embedding: list[dict[str, Any]] = field(default_factory=list)  # per model: embedding_time(...), what this run measured

    @property
    def protocol_name(self) -> str:
        return "closed-set" if self.same_set else "open-set"


def embedding_time(model: str, unit: str, items: int, seconds: float, device: str, cached: int = 0) -> dict[str, Any]:
    """What embedding took for one model in this run: ``items`` embedded (reading and preprocessing included) in
    ``seconds`` on ``device``; ``cached``: items read back from a cache instead (not timed)."""
    return {"model": model, "unit": unit, "items": int(items), "seconds": float(seconds), "device": device,
            "cached": int(cached)}


def model_labels(sources: Sequence[ModelSource]) -> list[str]:
    """Short model names: each source's label, else its file stem (``source_name``; ``stem#i`` when two are the same);
    an offline text model is called by its name (``minilm_l6``), its files having generic names."""
    stems = [s.label or (s.pretrained if is_text_model(s.pretrained) else source_name(None, s.path)) for s in sources]
    return [f"{stem}#{i}" if stems.count(stem) > 1 else stem for i, stem in enumerate(stems, start=1)]
