"""Embeddings where teams keep them, read-only, through one interface (floor 1: imports core and data only).

``open_source(text, what=...)`` -> :class:`~engine.sources.base.Source`; ``source.blocks(rows)`` yields
:class:`~engine.sources.base.Block` (ids, float32 vectors (n, d), labels or None); ``source.dim``,
``source.count`` (None when unknown), ``source.description`` (masked, for messages). :func:`join_by_id` aligns
the old and new embeddings of the same items. Every refusal is one line, a :class:`SourceError` (a ValueError).

A source text is ``[KIND:]LOCATION[#key=value&...]`` (``engine/sources/text.py``); the kinds and their options:

=========  ==============================================  ====================================================
kind       location                                        options (defaults)
=========  ==============================================  ====================================================
npz        ``file.npz``: arrays ids, vectors [, labels]    id=ids, vector=vectors, label=labels
npy        ``file.npy``: (n, d) vectors; ids = row numbers
parquet    ``.parquet``/``.arrow`` file, folder, fsspec URL id=id, vector=vector, label=label
lance      LanceDB folder (``#table=``) or ``T.lance``     table, id=id, vector=vector, label=label
qdrant     local-mode folder or ``http(s)://`` server      collection, vector (named), label (payload), api_key
sql        SQLAlchemy URL                                  query=SELECT... or table=NAME, id, vector, label
=========  ==============================================  ====================================================

A ``label`` option left out takes the ``label`` column when there is one; ``label=`` (empty) reads no labels.
Local paths are confined to the data roots (``engine.data.roots``); nothing is ever written to a store.
``source.fingerprint``: the model fingerprint the store carries (Parquet / Arrow / LanceDB schema metadata
``compatlab.fingerprint``; ``engine.core.fingerprint``), None when it carries none or its files differ.
"""
from __future__ import annotations

from collections.abc import Callable

from engine.sources.base import Block, Source
from engine.sources.join import Joined, join_by_id
from engine.sources.text import SourceError, SourceText, mask_url, parse, resolve_secrets

__all__ = ["Block", "Joined", "Source", "SourceError", "join_by_id", "mask_url", "open_source"]


def _arrays() -> type[Source]:
    from engine.sources.arrays import ArraySource
    return ArraySource


def _arrow() -> type[Source]:
    from engine.sources.arrow import ArrowSource
    return ArrowSource


def _lance() -> type[Source]:
    from engine.sources.arrow import LanceSource
    return LanceSource


def _qdrant() -> type[Source]:
    from engine.sources.qdrant import QdrantSource
    return QdrantSource


def _sql() -> type[Source]:
    from engine.sources.sql import SqlSource
    return SqlSource


# source kind (engine.core.kinds.SOURCES) -> its reader class, imported when a source of that kind is opened
READERS: dict[str, Callable[[], type[Source]]] = {"npz": _arrays, "npy": _arrays, "parquet": _arrow, "lance": _lance,
                                                  "qdrant": _qdrant, "sql": _sql}


def open_source(text: str, *, what: str, dim: int | None = None, label: str | None = None) -> Source:
    """The source a text names, opened read-only and checked (columns, dimension ``dim`` when given); ``label``
    replaces the text's label option (another column read as each item's label, e.g. its query group)."""
    spec = parse(resolve_secrets(text))
    if label is not None:
        spec = SourceText(spec.kind, spec.location, {**spec.options, "label": label})
    return READERS[spec.kind]()(spec, what=what, expect_dim=dim)
