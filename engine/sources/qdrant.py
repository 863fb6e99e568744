"""Qdrant collections: a local-mode folder (read straight from its files) or a server URL (``qdrant-client``).

``qdrant:FOLDER#collection=NAME`` or ``qdrant:http://host:6333#collection=NAME&api_key=KEY``; ``vector=NAME``
picks a named vector (required when the collection has several), ``label=KEY`` a payload field (default
``label`` when the first point has it; empty: no labels). Ids are the point ids.

A local-mode folder (what ``QdrantClient(path=...)`` writes) is read without qdrant-client: ``meta.json`` for the
collection's vectors, and its ``storage.sqlite`` opened read-only (``mode=ro``) and paged by row. qdrant-client
keeps each point there as a pickle; it is decoded by an unpickler that knows one class, ``PointStruct``, rebuilt
as plain data, so no code from the folder ever runs, and nothing (not even the client's ``.lock``) is written.
These are qdrant-client's private files (its public API would write a lock into the folder): the layout is pinned
to :data:`LOCAL_LAYOUT_VERSION` and a folder of another layout is refused in one line.
A server is read with ``scroll`` in pages of a block.
"""
from __future__ import annotations

import io
import json
import pickle
import sqlite3
import time
import warnings
from collections.abc import Iterator
from urllib.parse import quote

import numpy as np

from engine.sources.base import Raw, Source
from engine.sources.text import SourceError, SourceText, check_url, first_line, is_url, local_path

POINT_CLASS = ("qdrant_client.http.models.models", "PointStruct")
# The local-mode layout this reader knows: qdrant-client's private files, pinned to the version the tests write with
# (requirements-qdrant.txt); a folder of another layout is refused in one line naming it, not misread.
LOCAL_LAYOUT_VERSION = "1.20.0"
LOCAL_POINTS_COLUMNS = ("id", "point")  # storage.sqlite's table points: the point id and its pickled PointStruct


class _Point:
    """A ``PointStruct``'s pickled state, kept as plain data."""
    state: dict

    def __setstate__(self, state: dict) -> None:
        self.state = state.get("__dict__", state) if isinstance(state, dict) else {}


class _PointUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # pickle's signature
        if (module, name) == POINT_CLASS:
            return _Point
        raise pickle.UnpicklingError(f"{module}.{name} is not a point")


def _decode(blob: bytes, *, where: str) -> dict:
    try:
        point = _PointUnpickler(io.BytesIO(blob)).load()
    except Exception as exc:  # a foreign or damaged row becomes the one line
        raise SourceError(f"{where} holds a point that cannot be read safely ({first_line(exc)})") from exc
    if not isinstance(point, _Point):
        raise SourceError(f"{where} holds a row that is not a point")
    return point.state


def _vector_config(config: object, name: str | None, *, where: str) -> tuple[str | None, int | None]:
    """(vector name or None for the unnamed vector, its size) from a collection's vectors config."""
    if isinstance(config, dict) and "size" in config:
        if name:
            raise SourceError(f"{where} has one unnamed vector, not a vector named {name!r}; drop #vector=")
        return None, int(config["size"])
    named = dict(config or {})
    if name is None:
        if len(named) != 1:
            raise SourceError(f"{where} has the named vectors {', '.join(named) or 'none'}; pick one with #vector=NAME")
        name = next(iter(named))
    if name not in named:
        raise SourceError(f"{where} has no vector named {name!r} (named vectors: {', '.join(named) or 'none'})")
    size = named[name].get("size") if isinstance(named[name], dict) else getattr(named[name], "size", None)
    return name, None if size is None else int(size)


def _pick(vector: object, name: str | None, *, where: str, point_id: object) -> list:
    if isinstance(vector, dict):
        vector = vector.get(name) if name else None
    if not isinstance(vector, (list, tuple)):
        raise SourceError(f"{where}: point {point_id} has no {'vector ' + repr(name) if name else 'dense vector'}")
    return list(vector)


LOCAL_TIMEOUT_S = 600  # one connection to a local-mode storage.sqlite (a pass over its points)


class QdrantPoints:
    """A collection's points in pages, read-only: a local-mode folder from its files, a server through ``scroll``
    (``#collection=NAME``, ``#api_key=KEY``). Every failure is one line naming ``where`` (masked); what the points
    mean is the caller's (:class:`QdrantSource`'s vectors, qrels' payloads)."""

    def __init__(self, text: SourceText, *, what: str, where: str) -> None:
        self.text, self.what, self.where = text, what, where
        self.collection = text.option("collection")
        if not self.collection:
            raise SourceError(f"{where} names no collection; add #collection=NAME")
        if "/" in self.collection or "\\" in self.collection or self.collection in (".", ".."):
            raise SourceError(f"{where}: {self.collection!r} is not a collection name")
        self.server = is_url(text.location)
        self.client = None
        if self.server:
            check_url(text.location, what=where)
            self.vectors = self._server_config()
        else:
            self.vectors = self._local_config()

    # local mode
    def _local_config(self) -> object:
        folder = local_path(self.text.location, what=self.what)
        meta_path = folder / "meta.json"
        if not meta_path.is_file():
            raise SourceError(f"{self.where}: {folder} is not a Qdrant local-mode folder (no meta.json)")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            config = meta["collections"][self.collection]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            names = ", ".join(meta.get("collections", {})) if isinstance(locals().get("meta"), dict) else "?"
            raise SourceError(f"{self.where} has no collection {self.collection!r} (collections: {names})") \
                from exc
        self.storage = local_path(str(folder / "collection" / self.collection / "storage.sqlite"), what=self.what)
        if not self.storage.is_file():
            raise SourceError(f"{self.where}: collection {self.collection!r} has no storage.sqlite")
        with self._connect() as conn:
            kind = conn.execute("SELECT type FROM sqlite_master WHERE name = 'points'").fetchone()
            if kind is None or kind[0] != "table":  # a view (an endless recursive one) is not Qdrant's storage
                raise SourceError(f"{self.where}: storage.sqlite's points is {kind[0] if kind else 'missing'}, not "
                                  "Qdrant's table")
            columns = tuple(row[1] for row in conn.execute("PRAGMA table_info(points)"))
            if columns != LOCAL_POINTS_COLUMNS:
                raise SourceError(f"{self.where}: storage.sqlite's points has columns {', '.join(columns)}, not "
                                  f"{', '.join(LOCAL_POINTS_COLUMNS)}: a local-mode layout this reader does not know "
                                  f"(it reads qdrant-client {LOCAL_LAYOUT_VERSION}'s)")
            self.count = conn.execute("SELECT count(*) FROM points").fetchone()[0]
        return config.get("vectors") if isinstance(config, dict) else None

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(f"file:{quote(str(self.storage))}?mode=ro", uri=True)
            deadline = time.monotonic() + LOCAL_TIMEOUT_S  # a statement past it is interrupted (one line below)
            conn.set_progress_handler(lambda: time.monotonic() > deadline, 10_000)
            return conn
        except sqlite3.Error as exc:
            raise SourceError(f"{self.where} cannot be opened: {first_line(exc)}") from exc

    def _local_points(self, block_rows: int) -> Iterator[list[dict]]:
        conn = self._connect()
        try:
            last = -1
            while True:
                rows = conn.execute("SELECT rowid, point FROM points WHERE rowid > ? ORDER BY rowid LIMIT ?",
                                    (last, block_rows)).fetchall()
                if not rows:
                    return
                last = rows[-1][0]
                yield [_decode(blob, where=self.where) for _, blob in rows]
        except sqlite3.Error as exc:
            raise SourceError(f"{self.where} cannot be read: {first_line(exc)}") from exc
        finally:
            conn.close()

    # server
    def _server_config(self) -> object:
        try:
            from qdrant_client import QdrantClient
        except ModuleNotFoundError as exc:
            raise SourceError(f"reading {self.where} needs the qdrant extra: pip install -e .[qdrant]") from exc
        try:
            with warnings.catch_warnings():  # an api key over http, an unknown server version: not errors here
                warnings.simplefilter("ignore", UserWarning)
                self.client = QdrantClient(url=self.text.location, api_key=self.text.option("api_key"), timeout=30,
                                           check_compatibility=False)
            info = self.client.get_collection(self.collection)
        except Exception as exc:  # unreachable server, refused key, missing collection
            raise SourceError(f"{self.where} cannot be reached: {first_line(exc)}") from exc
        self.count = info.points_count
        vectors = info.config.params.vectors
        if hasattr(vectors, "size"):
            return {"size": vectors.size}
        return {k: {"size": v.size} for k, v in (vectors or {}).items()}

    def _server_points(self, block_rows: int, vectors: list[str] | bool, payload: list[str] | bool
                       ) -> Iterator[list[dict]]:
        offset = None
        while True:
            try:
                records, offset = self.client.scroll(self.collection, limit=block_rows, offset=offset,
                                                     with_vectors=vectors, with_payload=payload)
            except Exception as exc:
                raise SourceError(f"{self.where} cannot be read: {first_line(exc)}") from exc
            if records:
                yield [{"id": r.id, "vector": r.vector, "payload": r.payload} for r in records]
            if offset is None:
                return

    def pages(self, block_rows: int, *, vectors: list[str] | bool, payload: list[str] | bool) -> Iterator[list[dict]]:
        """The points (``id``, ``vector``, ``payload``), ``block_rows`` at a time; a server sends only the ``vectors``
        and ``payload`` fields asked for (a local point is stored whole: what is not asked for is dropped)."""
        if self.server:
            yield from self._server_points(block_rows, vectors, payload)
            return
        for points in self._local_points(block_rows):
            yield [{"id": p.get("id"), "vector": p.get("vector") if vectors else None,
                    "payload": _fields(p.get("payload"), payload)} for p in points]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def _fields(payload: object, wanted: list[str] | bool) -> dict | None:
    """The ``wanted`` fields of a payload (all of them for True, none for False), as a server's scroll sends them."""
    if not wanted or not isinstance(payload, dict):
        return None
    return payload if wanted is True else {k: payload[k] for k in wanted if k in payload}


class QdrantSource(Source):
    def __init__(self, text: SourceText, *, what: str, expect_dim: int | None) -> None:
        super().__init__(text, what=what, expect_dim=expect_dim)
        self.points = QdrantPoints(text, what=what, where=self.description)
        self.count = self.points.count
        self.label_key = text.option("label")
        self.vector_name, dim = _vector_config(self.points.vectors, text.option("vector"), where=self.description)
        if dim is not None:
            self._check_dim(dim)

    def _raw(self, block_rows: int) -> Iterator[Raw]:
        with_vectors = [self.vector_name] if self.vector_name else True
        with_payload = [self.label_key or "label"] if self.label_key != "" else False  # never the documents' text
        for points in self.points.pages(block_rows, vectors=with_vectors, payload=with_payload):
            if self.label_key is None:
                first = points[0].get("payload") or {}
                self.label_key = "label" if "label" in first else ""
            ids = np.array([p["id"] for p in points], dtype=object)
            rows = [_pick(p.get("vector"), self.vector_name, where=self.description, point_id=p["id"]) for p in points]
            if len({len(r) for r in rows}) > 1:
                raise SourceError(f"{self.description}: vectors of different lengths (ragged)")
            labels = None
            if self.label_key:
                missing = [p["id"] for p in points if self.label_key not in (p.get("payload") or {})]
                if missing:
                    raise SourceError(f"{self.description}: {len(missing)} points have no payload field "
                                      f"{self.label_key!r} (e.g. {missing[0]})")
                labels = np.array([p["payload"][self.label_key] for p in points], dtype=object)
            yield ids, np.array(rows, dtype=np.float64).reshape(len(rows), -1), labels

    def close(self) -> None:
        self.points.close()
