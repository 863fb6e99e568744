"""Sample references: where each stored feature row's image comes from (torch-free).

A :class:`SampleRefs` is a JSON-able ``source`` plus one int64 id per image:

* ``{"dataset": "digits"}``: ids index scikit-learn's bundled ``load_digits()`` (all 1,797 images);
* ``{"dataset": "fashion" | "cifar10" | "cifar100", "split": "train" | "test", "root": ROOT}``: ids index the
  split's files in file order;
* ``{"dataset": "shapes", "split": ..., "seed": S, "first_class": F, "per_class": P}``: id ``i`` is image
  ``i % P`` of generator class ``F + i // P`` (``engine.data.shapes`` renders it bit for bit);
* ``{"root": ROOT, "files": [relative path, ...]}``: an image folder or an upload; ids index ``files``;
* ``{"dataset": "wordnet", "texts": [text, ...]}``: a text corpus's items (a sentence, a definition); ids index
  ``texts``, which the store keeps so the dashboard shows them without reading the corpus (:func:`sample_texts`).

Loaders attach them to an ``ImageSet`` (``refs``), selections carry them along, and the one write path
(``engine.results.record``) stores them beside the feature sets; ``engine.data.thumbnails`` renders them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, eq=False)
class SampleRefs:
    """A JSON-able ``source`` (see the module docstring) and ``ids``: (N,) int64, one per image."""

    source: dict[str, Any]
    ids: np.ndarray

    def __post_init__(self) -> None:
        ids = np.asarray(self.ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"sample ids must be a 1-D integer array, got shape {ids.shape} {ids.dtype}")
        object.__setattr__(self, "ids", ids.astype(np.int64, copy=False))

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def take(self, positions: np.ndarray | Sequence[int]) -> SampleRefs:
        """The references of the images at ``positions`` (a selection of the set), in that order."""
        return SampleRefs(self.source, self.ids[np.asarray(positions, dtype=np.int64)])

    def compact(self) -> SampleRefs:
        """The same references with a file list cut to the files referenced (ids renumbered); datasets unchanged."""
        if "files" not in self.source:
            return self
        used, ids = np.unique(self.ids, return_inverse=True)
        files = self.source["files"]
        return SampleRefs({**self.source, "files": [files[i] for i in used]}, ids.astype(np.int64))


def dataset_refs(source: dict[str, Any], ids: np.ndarray | Sequence[int]) -> SampleRefs:
    """References into a dataset's own numbering (``ids`` of ``source``)."""
    return SampleRefs(dict(source), np.asarray(ids, dtype=np.int64))


def file_refs(root: str, files: Sequence[str]) -> SampleRefs:
    """References of image files (paths relative to ``root``), one per image, in order."""
    return SampleRefs({"root": str(root), "files": list(files)}, np.arange(len(files), dtype=np.int64))


def text_refs(dataset: str, texts: Sequence[str]) -> SampleRefs:
    """References of text items kept with their texts (``{"dataset", "texts"}``), one per item, in order."""
    return SampleRefs({"dataset": dataset, "texts": [str(t) for t in texts]}, np.arange(len(texts), dtype=np.int64))


def sample_texts(source: dict[str, Any] | None, ids: np.ndarray | Sequence[int]) -> list[str] | None:
    """The texts of items ``ids`` of a text source (:func:`text_refs`); None when the source holds no texts."""
    texts = (source or {}).get("texts")
    if not isinstance(texts, list):
        return None
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) and not 0 <= ids.min() <= ids.max() < len(texts):
        raise ValueError(f"text ids must lie in 0..{len(texts) - 1}, got {ids.min()}..{ids.max()}")
    return [str(texts[i]) for i in ids]
