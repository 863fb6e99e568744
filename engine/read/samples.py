"""Stored samples for the pages (numpy only, no torch): thumbnails and texts of the rows a run stored, where their
thumbnails live, and one query's cross-model nearest neighbours (``engine.analysis.neighbours``,
``engine.data.thumbnails``).

Each name is defined and tested where the engine computes it; the pages import it from here."""
from __future__ import annotations

from engine.analysis.neighbours import (images_note, nearest_neighbours, row_texts, row_thumbnail_uris, row_thumbnails,
                                        split_labels)
from engine.data.thumbnails import THUMB_SIZE, thumbnail_dir

__all__ = ["images_note", "nearest_neighbours", "row_texts", "row_thumbnail_uris", "row_thumbnails", "split_labels",
           "THUMB_SIZE", "thumbnail_dir"]
