"""Cross-model nearest neighbours of one query, computed from stored features with numpy, and the thumbnails of
stored rows (from their sample references, ``engine.data.thumbnails``), or their texts for a text corpus.

The dashboard calls :func:`nearest_neighbours`, :func:`row_thumbnails`, :func:`row_thumbnail_uris` and
:func:`row_texts` in its own
process: this module and what it imports load no torch, torchvision, numba or faiss
(``tests/test_neighbours_torch_free.py``).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine

from engine.analysis.arrays import unit
from engine.analysis.views import experiment_recipe, load_cell_versions, load_side
from engine.data.samples import sample_texts
from engine.data.thumbnails import THUMB_SIZE, can_render, check_reference, data_uri, kind_of, thumbnails
from storage import list_feature_views, load_feature_set, load_image_refs, session_scope


def nearest_neighbours(db: Engine, query_version_id: int, gallery_version_id: int, view: str, query_index: int,
                       k: int = 10) -> dict[str, Any]:
    """The ``k`` gallery items nearest (cosine) to one query, across models: hits share the query's label.

    Query = row ``query_index`` of the query model's ``query`` split; gallery = the gallery model's
    ``gallery`` split (PSP/LSP on the gallery model's classes with the experiment's top-k, as in the matrix cell). In a
    closed-set experiment the query's own image (same row) is excluded from the gallery, by index.
    """
    config, vq, vg = load_cell_versions(db, query_version_id, gallery_version_id)
    recipe = experiment_recipe(config, view, vq, vg, every_row=True)  # a query index is a stored row
    query, q_labels, q_ids, _ = load_side(db, vq, "query", recipe, "query")
    gallery, g_labels, g_ids, _ = load_side(db, vg, "gallery", recipe, "gallery")
    if not 0 <= query_index < len(query):
        raise ValueError(f"query index {query_index} is out of range: the query split has rows 0..{len(query) - 1}")
    if query.shape[1] != gallery.shape[1]:
        raise ValueError(f"the query model gives {query.shape[1]}-d {view} features and the gallery model "
                         f"{gallery.shape[1]}-d ones; choose a view both share (e.g. 'psp' or 'lsp')")
    same_set = recipe.same_set
    # class names are nested (the classes in scenario order): the later model knows the most of them
    named = max((vq, vg), key=lambda v: len(v.class_names or ()))
    sims = unit(gallery) @ unit(query[query_index : query_index + 1])[0]
    if same_set:
        sims[query_index] = -np.inf
    k = max(1, min(int(k), len(sims) - int(same_set)))
    top = np.argsort(-sims, kind="stable")[:k]
    label = int(q_labels[query_index])
    positives = int(np.sum(g_labels == label)) - int(same_set and g_labels[query_index] == label)
    return {
        "query": {"index": int(query_index), "label": label, "name": named.name(label),
                  "image_id": None if q_ids is None else np.asarray(q_ids)[query_index].item()},
        "neighbours": [{"rank": r + 1, "gallery_index": int(i), "label": int(g_labels[i]), "name": named.name(int(g_labels[i])),
                        "similarity": float(sims[i]), "hit": bool(g_labels[i] == label),
                        "image_id": None if g_ids is None else np.asarray(g_ids)[i].item()} for r, i in enumerate(top)],
        "n_gallery": int(len(g_labels)),
        "n_positives": positives,
        "same_set": same_set,
        "query_step": vq.step,
        "gallery_step": vg.step,
    }


def images_note(db: Engine, model_version_id: int, split: str) -> str | None:
    """Why the rows of (model version, split) have no thumbnails, in one sentence; None when they can have them."""
    with session_scope(db) as s:
        refs = load_image_refs(s, model_version_id, split)
    if refs is None:
        return ("This experiment was stored before sample references existed (or from a feature folder), so its "
                "images are unknown; run it again to see them.")
    if sample_texts(refs[0], []) is not None:
        return "Its items are texts (no images): they are shown as text."
    if not can_render(refs[0]):
        return f"Thumbnails of {kind_of(refs[0])} images are not rendered yet (their files are read with torch)."
    try:
        check_reference(refs[0], np.asarray(refs[1], dtype=np.int64))
    except (ValueError, TypeError) as exc:
        return f"Thumbnails cannot be shown: {exc}."
    return None


def row_thumbnails(db: Engine, model_version_id: int, split: str, rows: Sequence[int], *, cache_dir: Path,
                   size: int = THUMB_SIZE) -> list[bytes | None]:
    """PNG thumbnails of stored rows ``rows`` of (model version, split); None where no image can be had."""
    with session_scope(db) as s:
        refs = load_image_refs(s, model_version_id, split)
    if refs is None:
        return [None] * len(rows)
    source, ids = refs
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) and not 0 <= rows.min() <= rows.max() < len(ids):
        raise ValueError(f"rows must lie in 0..{len(ids) - 1} (the stored {split} rows), got {rows.min()}..{rows.max()}")
    picked = np.asarray(ids)[rows]
    if can_render(source):
        try:
            check_reference(source, np.asarray(picked, dtype=np.int64))
        except (ValueError, TypeError):  # a damaged reference: no pictures, and images_note says why
            return [None] * len(rows)
    return thumbnails(source, picked, cache_dir=cache_dir, size=size)


def row_texts(db: Engine, model_version_id: int, split: str, rows: Sequence[int] | None = None) -> list[str] | None:
    """The stored texts of rows ``rows`` (None: every row) of (model version, split), in that order; None when its
    items are not texts (images, or stored without references)."""
    with session_scope(db) as s:
        refs = load_image_refs(s, model_version_id, split)
    if refs is None:
        return None
    source, ids = refs
    ids = np.asarray(ids)
    if rows is not None:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and not 0 <= rows.min() <= rows.max() < len(ids):
            raise ValueError(f"rows must lie in 0..{len(ids) - 1} (the stored {split} rows), got {rows.min()}..{rows.max()}")
        ids = ids[rows]
    return sample_texts(source, ids)


def row_thumbnail_uris(db: Engine, model_version_id: int, split: str, rows: Sequence[int], *, cache_dir: Path,
                       size: int = 32) -> list[str | None]:
    """``data:image/png;base64,...`` URIs of :func:`row_thumbnails` (for a Vega tooltip's ``image`` field)."""
    return [data_uri(png) for png in row_thumbnails(db, model_version_id, split, rows, cache_dir=cache_dir, size=size)]


def split_labels(db: Engine, model_version_id: int, split: str) -> np.ndarray:
    """The labels of the stored rows of (model version, split), row by row."""
    with session_scope(db) as s:
        views = list_feature_views(s, model_version_id, split)
        if not views:
            raise ValueError(f"model version {model_version_id} has no stored {split!r} rows")
        return np.asarray(load_feature_set(s, model_version_id, split, views[0])[1])
