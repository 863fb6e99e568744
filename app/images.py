"""Thumbnails of stored samples for the pages (cached reads of ``engine.analysis.neighbours``; no torch), or
their texts when the items are texts (a text comparison stores them with its features).

:func:`thumbnail_uris` is what the map puts in its data's ``image`` field for the hover tooltip, :func:`texts`
what it puts in ``text``.
"""
from __future__ import annotations

from typing import Any

import streamlit as st

from app.queries import RESULT_TTL, db_engine
from engine.read.samples import THUMB_SIZE, row_texts, row_thumbnail_uris, row_thumbnails, split_labels, thumbnail_dir
from engine.read.samples import images_note as _images_note


@st.cache_data(ttl=RESULT_TTL, max_entries=256, show_spinner=False)
def thumbnails(url: str, model_version_id: int, split: str, rows: tuple[int, ...],
               size: int = THUMB_SIZE) -> list[bytes | None]:
    """PNG bytes of the stored rows ``rows`` of (model version, split); None where no image can be had."""
    return row_thumbnails(db_engine(url), model_version_id, split, rows, cache_dir=thumbnail_dir(url), size=size)


@st.cache_data(ttl=RESULT_TTL, max_entries=64, show_spinner=False)
def thumbnail_uris(url: str, model_version_id: int, split: str, rows: tuple[int, ...], size: int = 32) -> list[str | None]:
    """``data:image/png;base64,...`` URIs of the rows' thumbnails (a Vega tooltip shows a field named ``image``)."""
    return row_thumbnail_uris(db_engine(url), model_version_id, split, rows, cache_dir=thumbnail_dir(url), size=size)


@st.cache_data(ttl=RESULT_TTL, max_entries=16, show_spinner=False)
def texts(url: str, model_version_id: int, split: str) -> tuple[str, ...] | None:
    """The stored text of every row of (model version, split), row by row; None when its items are not texts."""
    found = row_texts(db_engine(url), model_version_id, split)
    return None if found is None else tuple(found)


@st.cache_data(ttl=RESULT_TTL, max_entries=64, show_spinner=False)
def images_note(url: str, model_version_id: int, split: str) -> str | None:
    """Why (model version, split) shows no images, or None."""
    return _images_note(db_engine(url), model_version_id, split)


@st.cache_data(ttl=RESULT_TTL, max_entries=64, show_spinner=False)
def labels(url: str, model_version_id: int, split: str) -> Any:
    """The labels of the stored rows of (model version, split)."""
    return split_labels(db_engine(url), model_version_id, split)
