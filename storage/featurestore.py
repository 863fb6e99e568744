"""The feature store: feature sets as files (``.npy`` shards + one Parquet of row data), SQL keeps the pointer.

Layout. Each (model version, split, view) write goes to a fresh key ``<root>/mv<id>/<split>/<token>/`` holding
``shard-00000.npy``, ``shard-00001.npy``, ... (consecutive row ranges of at most :data:`SHARD_BYTES` each) and
``rows.parquet`` (columns ``id`` = the row's position in the set, ``label`` and ``image_id``). The ``feature_sets``
row keeps only the pointer: ``store_uri`` (the root), ``store_key``, and ``store_layout`` (dtype, shape, rows and
sha256 of every shard and of the Parquet), with ``count``/``dim``; its ``features``/``labels`` columns hold a
zero-row placeholder of the right dtype (the columns are NOT NULL in existing databases) and ``image_ids`` is NULL.

Root. ``$COMPATLAB_FEATURE_STORE`` (a folder or any fsspec URL, e.g. ``s3://bucket/features``; S3 needs the
``s3`` extra, credentials and endpoint come from the usual ``AWS_*`` / ``FSSPEC_S3_*`` variables) names it.
Unset, a SQLite file's features go to ``features/`` beside the database file (as ``thumbnails/`` and
``checkpoints/``), recorded as the relative ``features`` so the folder can move with the database; other
databases (PostgreSQL, in-memory SQLite) keep storing blobs in SQL, so a PostgreSQL shared by several machines
is never pointed at one machine's local folder by accident.

Precision. Features are stored in their own dtype (the engine extracts float32). ``$COMPATLAB_FEATURE_DTYPE=float16``
stores floating features as float16 (half the bytes, about 3 significant digits); such sets are read back as float32.

Atomicity. Shards and Parquet are written under the fresh key (for a local root: a ``.tmp-<token>`` folder renamed
to the key once complete), then the pointer row is written in the caller's transaction. Until that commits nothing
points at the files, so a killed or failing writer leaves no visible shard and no dangling pointer. After a
rollback the new files are deleted; after a commit the files of the set it replaced (or deleted) are. A killed
writer can leave an unreferenced ``.tmp-*`` folder or key, never a half-read set.

Sets assembled from parts (extract tasks, ``engine.jobs.extract_tasks``). Many writers each put one part of rows
under the set's key as ``<name>-<token>.npy`` (:func:`write_part`: a fresh name per attempt, renamed into place when
complete), then one writer lists them in order (:func:`commit_parts`: the shards carry their ``file``) and adds
``rows-<token>.parquet`` (``rows_file``) before the pointer commits. Files of attempts that failed, were cancelled or
lost their lease are swept (:func:`sweep_parts`): the unreferenced ones when the set commits, the whole folder when
the job fails or is cancelled.

Existing databases: read both. Rows written before the store (``store_key`` NULL) load from their blobs as
before; every new write goes to the store (no migration step, no rewrite of old rows). Every shard read is checked
against its recorded shape, dtype and sha256 (a changed or truncated file is a one-line ``ValueError``).
"""
from __future__ import annotations

import hashlib
import io
import os
import uuid
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import event, make_url
from sqlalchemy.orm import Session

STORE_ENV = "COMPATLAB_FEATURE_STORE"
DTYPE_ENV = "COMPATLAB_FEATURE_DTYPE"
DEFAULT_FOLDER = "features"  # beside a SQLite file; a relative store_uri is resolved from the database's folder
SHARD_BYTES = 64 * 2**20
ROWS_FILE = "rows.parquet"
_PENDING = "featurestore_pending"


class FeatureShard(NamedTuple):
    """Consecutive rows of a stored set; ``engine.metrics.sharded.Shard``-compatible (ids = row positions)."""

    features: np.ndarray
    labels: np.ndarray
    ids: np.ndarray


class Pointer(NamedTuple):
    """Where a set lives: the root as recorded, the key under it, and the layout (dtype, shape, shards)."""

    uri: str
    key: str
    layout: dict[str, Any]


# --- where the store is ----------------------------------------------------------------------


def _database_folder(session: Session) -> Path | None:
    url = make_url(str(session.get_bind().url.render_as_string(hide_password=False)))
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(os.path.realpath(Path(database).expanduser().absolute())).parent


def store_uri(session: Session) -> str | None:
    """The root new feature sets go to (see the module docstring); None: keep them as blobs in SQL."""
    configured = os.environ.get(STORE_ENV, "").strip()
    if configured:
        return configured if "://" in configured else str(Path(configured).expanduser().absolute())
    return DEFAULT_FOLDER if _database_folder(session) is not None else None


def _filesystem(session: Session, uri: str) -> tuple[Any, str]:
    """``(fsspec filesystem, root path)`` of a recorded ``store_uri``; ``ValueError`` when it cannot be reached."""
    import fsspec

    if "://" not in uri and not os.path.isabs(uri):
        folder = _database_folder(session)
        if folder is None:
            raise ValueError(f"feature store {uri!r} is relative to a SQLite file's folder, but the database is not "
                             f"a SQLite file; set ${STORE_ENV}")
        uri = str(folder / uri)
    try:
        fs, path = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:
        raise ValueError(f"feature store {uri} cannot be opened: {exc}".splitlines()[0]) from None
    return fs, path.rstrip("/")


def _is_local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


# --- shards ----------------------------------------------------------------------------------


class _Hashed:
    """A file wrapper that feeds every byte written or read to a sha256."""

    def __init__(self, file: Any) -> None:
        self.file, self.hash = file, hashlib.sha256()

    def write(self, data: Any) -> int:
        self.hash.update(data)
        return self.file.write(data)

    def read(self, size: int = -1) -> bytes:
        data = self.file.read(size)
        self.hash.update(data)
        return data

    def readinto(self, buffer: memoryview) -> int:
        done = 0
        while done < len(buffer):
            n = self.file.readinto(buffer[done:])
            if not n:
                break
            done += n
        self.hash.update(buffer[:done])
        return done


def _npy_header(array: np.ndarray) -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
    return header.getvalue()


def _write_file(fs: Any, path: str, parts: list[Any]) -> str:
    """Write ``parts`` (bytes-like) to ``path``, flushed to disk on a local root; return the sha256."""
    with fs.open(path, "wb") as raw:
        out = _Hashed(raw)
        for part in parts:
            out.write(part)
        if _is_local(fs):
            raw.flush()
            os.fsync(raw.fileno())
    return out.hash.hexdigest()


def _write_npy(fs: Any, path: str, array: np.ndarray) -> str:
    array = np.ascontiguousarray(array)
    return _write_file(fs, path, [_npy_header(array), memoryview(array).cast("B")])


def _shard_path(base: str, index: int, shard: dict[str, Any]) -> str:
    """A shard's file: ``shard-<index>.npy``, or the ``file`` named by a set assembled from parts."""
    return f"{base}/{shard.get('file') or f'shard-{index:05d}.npy'}"


def _check_header(file: _Hashed, path: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    fmt = np.lib.format
    version = fmt.read_magic(file)
    if version != (1, 0):
        raise ValueError(f"feature shard {path} is not a version 1.0 .npy file")
    found_shape, fortran, found_dtype = fmt.read_array_header_1_0(file)
    if found_shape != shape or found_dtype != dtype or fortran:
        raise ValueError(f"feature shard {path} holds {found_dtype} {found_shape}, the database recorded "
                         f"{dtype} {shape}: the file was replaced")


def _read_npy(fs: Any, path: str, sha256: str, shape: tuple[int, ...], dtype: np.dtype, out: np.ndarray) -> None:
    """Read a shard into ``out`` (shape checked before reading, sha256 after); ``ValueError`` on any mismatch."""
    target = out if out.dtype == dtype else np.empty(shape, dtype)
    try:
        with fs.open(path, "rb") as raw:
            file = _Hashed(raw)
            _check_header(file, path, shape, dtype)
            filled = file.readinto(memoryview(target).cast("B")) if target.size else 0
            extra = raw.read(1)
    except FileNotFoundError:
        raise ValueError(f"feature shard {path} is missing from the store") from None
    if filled != target.nbytes or extra or file.hash.hexdigest() != sha256:
        raise ValueError(f"feature shard {path} does not match its sha256: the file was changed or truncated")
    if target is not out:
        out[...] = target


def rows_bound(layout: dict[str, Any]) -> int:
    """The most bytes a set's rows Parquet may take: twice its columns' raw size (id, label, image id) plus 1 MB."""
    itemsizes = 8 + sum(np.dtype(layout[k]).itemsize for k in ("labels", "image_ids") if layout.get(k))
    return 1_000_000 + 2 * int(layout["shape"][0]) * itemsizes


def _read_rows(fs: Any, base: str, layout: dict[str, Any]) -> Any:
    """The verified Parquet of a set (``pyarrow.parquet.ParquetFile``)."""
    import pyarrow.parquet as pq

    path = f"{base}/{layout.get('rows_file', ROWS_FILE)}"
    bound = rows_bound(layout)
    try:
        data = fs.cat_file(path, start=0, end=bound + 1)  # never more than the set's rows can take
    except FileNotFoundError:
        raise ValueError(f"feature rows {path} are missing from the store") from None
    if len(data) > bound:
        raise ValueError(f"feature rows {path} are larger than the {bound:,} bytes {layout['shape'][0]:,} rows can "
                         "take: the file was changed; it was not read")
    if hashlib.sha256(data).hexdigest() != layout["rows_sha256"]:
        raise ValueError(f"feature rows {path} do not match their sha256: the file was changed or truncated")
    return pq.ParquetFile(io.BytesIO(data))


def _column(table: Any, name: str, dtype: str | None) -> np.ndarray | None:
    if dtype is None:
        return None
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.dtype(dtype))


def _shard_rows(dim: int, itemsize: int) -> int:
    return max(1, SHARD_BYTES // max(1, dim * itemsize))


def _stored_dtype(features: np.ndarray) -> np.dtype:
    wanted = os.environ.get(DTYPE_ENV, "").strip().lower()
    if wanted not in ("", "float16"):
        raise ValueError(f"${DTYPE_ENV} must be empty (store as given) or 'float16', got {wanted!r}")
    return np.dtype(np.float16) if wanted and features.dtype.kind == "f" else features.dtype


# --- writing ---------------------------------------------------------------------------------


def _rows_table(labels: np.ndarray, image_ids: np.ndarray | None) -> Any:
    import pyarrow as pa

    columns = {"id": pa.array(np.arange(len(labels), dtype=np.int64)), "label": pa.array(labels)}
    if image_ids is not None:
        columns["image_id"] = pa.array(image_ids)
    return pa.table(columns)


def _write_rows(fs: Any, path: str, labels: np.ndarray, image_ids: np.ndarray | None) -> dict[str, Any]:
    """Write the Parquet of a set's rows; return the layout's row fields (label and image id dtypes, sha256)."""
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(_rows_table(labels, image_ids), buffer)
    return {"labels": labels.dtype.str, "image_ids": None if image_ids is None else image_ids.dtype.str,
            "rows_sha256": _write_file(fs, path, [buffer.getvalue()])}


def _read_dtype(stored: np.dtype, given: np.dtype) -> str:
    return (np.dtype(np.float32) if stored != given else stored).str


def _write_files(fs: Any, base: str, features: np.ndarray, labels: np.ndarray, image_ids: np.ndarray | None,
                 dtype: np.dtype) -> dict[str, Any]:
    count, dim = features.shape
    per_shard = _shard_rows(dim, dtype.itemsize)
    fs.makedirs(base, exist_ok=True)
    shards = []
    for index, start in enumerate(range(0, count, per_shard)):
        block = features[start:start + per_shard].astype(dtype, copy=False)
        shards.append({"rows": len(block), "sha256": _write_npy(fs, f"{base}/shard-{index:05d}.npy", block)})
    return {"dtype": dtype.str, "read_dtype": _read_dtype(dtype, features.dtype), "shape": [count, dim],
            "shards": shards, **_write_rows(fs, f"{base}/{ROWS_FILE}", labels, image_ids)}


def write(session: Session, uri: str, model_version_id: int, split: str, features: np.ndarray, labels: np.ndarray,
          image_ids: np.ndarray | None) -> Pointer:
    """Write a set under a fresh key of root ``uri``; the files are deleted again if the session rolls back."""
    fs, root = _filesystem(session, uri)
    token = uuid.uuid4().hex
    key = f"mv{model_version_id}/{split}/{token}"
    final = f"{root}/{key}"
    local = _is_local(fs)
    staging = f"{root}/.tmp-{token}" if local else final
    dtype = _stored_dtype(features)
    try:
        layout = _write_files(fs, staging, features, labels, image_ids, dtype)
        if local:
            fs.makedirs(os.path.dirname(final), exist_ok=True)
            os.replace(staging, final)  # the complete folder appears at once
    except BaseException:
        _remove(fs, staging)
        raise
    _pending(session)["written"].append((fs, final))
    return Pointer(uri, key, layout)


def write_part(session: Session, uri: str, key: str, name: str, features: np.ndarray) -> dict[str, Any]:
    """Write one part (consecutive rows) of a set being assembled under ``key`` of root ``uri``; return its entry
    for :func:`commit_parts` (``file``, ``rows``, ``sha256``, ``dtype``, ``read_dtype``, ``dim``).

    The file gets a fresh name ``<name>-<token>.npy`` (locally written as ``.tmp-*`` and renamed when complete), so
    a retry never overwrites an attempt's file; nothing references it until the set is committed.
    """
    if features.ndim != 2:
        raise ValueError(f"a part must be a 2-D array (rows x dim), got shape {features.shape}")
    fs, root = _filesystem(session, uri)
    dtype, folder, file = _stored_dtype(features), f"{root}/{key}", f"{name}-{uuid.uuid4().hex}.npy"
    local = _is_local(fs)
    staging = f"{folder}/.tmp-{file}" if local else f"{folder}/{file}"
    fs.makedirs(folder, exist_ok=True)
    try:
        sha256 = _write_npy(fs, staging, features.astype(dtype, copy=False))
        if local:
            os.replace(staging, f"{folder}/{file}")
    except BaseException:
        _remove(fs, staging)
        raise
    return {"file": file, "rows": len(features), "sha256": sha256, "dtype": dtype.str,
            "read_dtype": _read_dtype(dtype, features.dtype), "dim": int(features.shape[1])}


def commit_parts(session: Session, uri: str, key: str, parts: list[dict[str, Any]], labels: np.ndarray,
                 image_ids: np.ndarray | None) -> Pointer:
    """The pointer of the set whose parts (:func:`write_part` entries, in row order) lie under ``key``.

    Writes the set's rows Parquet under a fresh name (deleted again if the session rolls back); the caller writes
    the pointer in the same transaction. ``ValueError`` when the parts disagree or do not cover the labels.
    """
    if not parts:
        raise ValueError(f"the set at {key} has no parts")
    kinds = {(p["dtype"], p["read_dtype"], p["dim"]) for p in parts}
    if len(kinds) != 1:
        raise ValueError(f"the parts at {key} disagree on dtype or width: {sorted(kinds)}")
    count = sum(p["rows"] for p in parts)
    if count != len(labels) or (image_ids is not None and len(image_ids) != count):
        raise ValueError(f"the parts at {key} hold {count} rows but the set has {len(labels)} labels")
    fs, root = _filesystem(session, uri)
    (dtype, read_dtype, dim), = kinds
    rows_file = f"rows-{uuid.uuid4().hex}.parquet"
    layout = {"dtype": dtype, "read_dtype": read_dtype, "shape": [count, dim], "rows_file": rows_file,
              "shards": [{k: p[k] for k in ("file", "rows", "sha256")} for p in parts]}
    layout |= _write_rows(fs, f"{root}/{key}/{rows_file}", labels, image_ids)
    _pending(session)["written"].append((fs, f"{root}/{key}/{rows_file}"))
    return Pointer(uri, key, layout)


def forget(session: Session, uri: str, key: str) -> None:
    """Delete the set at ``key`` once the session commits (its row was replaced or deleted).

    A root this process cannot reach is left alone: the row still goes, its files stay unreferenced.
    """
    try:
        fs, root = _filesystem(session, uri)
    except ValueError:
        return
    _pending(session)["replaced"].append((fs, f"{root}/{key}"))


def sweep_parts(session: Session, uri: str, key: str, keep: Collection[str] = ()) -> int:
    """Delete, once the session commits, the files under ``key`` that ``keep`` does not name (the whole folder when
    ``keep`` is empty): parts of attempts that were cancelled, failed or lost their lease, or of a job that ended
    without a set. Return how many files (or folders) are due. A key that could leave the root, or a root this
    process cannot reach, is left alone."""
    if not key or key.startswith("/") or "://" in key or ".." in key.split("/"):
        return 0
    try:
        fs, root = _filesystem(session, uri)
        folder = f"{root}/{key}"
        doomed = [folder] if not keep else [p for p in fs.ls(folder, detail=False) if p.rsplit("/", 1)[-1] not in keep]
    except (ValueError, FileNotFoundError):
        return 0
    _pending(session)["replaced"].extend((fs, path) for path in doomed)
    return len(doomed)


def _remove(fs: Any, path: str) -> None:
    try:
        fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass


def _pending(session: Session) -> dict[str, list[tuple[Any, str]]]:
    """Files to delete when the session's transaction ends: new ones on rollback, replaced ones on commit."""
    if _PENDING not in session.info:
        session.info[_PENDING] = {"written": [], "replaced": []}
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_soft_rollback", _after_rollback)
    return session.info[_PENDING]


def _after_commit(session: Session) -> None:
    pending = session.info[_PENDING]
    for fs, path in pending["replaced"]:
        _remove(fs, path)
    pending["written"].clear()
    pending["replaced"].clear()


def _after_rollback(session: Session, previous_transaction: Any) -> None:
    if previous_transaction.parent is not None or not session.info.get(_PENDING):
        return  # a savepoint: the outer transaction decides
    pending = session.info[_PENDING]
    for fs, path in pending["written"]:
        _remove(fs, path)
    pending["written"].clear()
    pending["replaced"].clear()


# --- reading ---------------------------------------------------------------------------------


def _locate(session: Session, pointer: Pointer) -> tuple[Any, str, np.dtype, np.dtype]:
    fs, root = _filesystem(session, pointer.uri)
    layout = pointer.layout
    return fs, f"{root}/{pointer.key}", np.dtype(layout["dtype"]), np.dtype(layout["read_dtype"])


def read(session: Session, pointer: Pointer) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(features, labels, image_ids)`` of a stored set, each shard verified as it is read."""
    fs, base, dtype, out_dtype = _locate(session, pointer)
    count, dim = pointer.layout["shape"]
    features = np.empty((count, dim), out_dtype)
    start = 0
    for index, shard in enumerate(pointer.layout["shards"]):
        rows = shard["rows"]
        _read_npy(fs, _shard_path(base, index, shard), shard["sha256"], (rows, dim), dtype,
                  features[start:start + rows])
        start += rows
    table = _read_rows(fs, base, pointer.layout).read()
    return features, _column(table, "label", pointer.layout["labels"]), _column(table, "image_id",
                                                                               pointer.layout["image_ids"])


def read_image_ids(session: Session, pointer: Pointer) -> np.ndarray | None:
    """The ``image_ids`` of a stored set (reads the Parquet only)."""
    fs, base, _, _ = _locate(session, pointer)
    table = _read_rows(fs, base, pointer.layout).read(columns=["image_id"] if pointer.layout["image_ids"] else [])
    return _column(table, "image_id", pointer.layout["image_ids"])


def shards(session: Session, pointer: Pointer, *, from_row: int = 0) -> Iterator[FeatureShard]:
    """The set's shards in row order, each read (and verified) when the iterator reaches it; ``from_row``: start
    with the shard holding that row (the ones before it are not read).

    Memory: one shard plus the set's labels. The store is located now; the session may close before iterating.
    """
    fs, base, dtype, out_dtype = _locate(session, pointer)
    return _stored_shards(fs, base, dtype, out_dtype, pointer.layout, from_row)


def _stored_shards(fs: Any, base: str, dtype: np.dtype, out_dtype: np.dtype,
                   layout: dict[str, Any], from_row: int = 0) -> Iterator[FeatureShard]:
    labels = _column(_read_rows(fs, base, layout).read(columns=["label"]), "label", layout["labels"])
    start, dim = 0, layout["shape"][1]
    for index, shard in enumerate(layout["shards"]):
        rows = shard["rows"]
        if start + rows <= from_row:  # before the rows asked for: skipped unread
            start += rows
            continue
        features = np.empty((rows, dim), out_dtype)
        _read_npy(fs, _shard_path(base, index, shard), shard["sha256"], features.shape, dtype, features)
        yield FeatureShard(features, labels[start:start + rows].copy(), np.arange(start, start + rows, dtype=np.int64))
        start += rows


def blob_shards(features: np.ndarray, labels: np.ndarray) -> Iterator[FeatureShard]:
    """Arrays already in memory (a row from before the store) cut as the store cuts them."""
    per_shard = _shard_rows(features.shape[1], features.dtype.itemsize)
    for start in range(0, len(features), per_shard):
        stop = min(start + per_shard, len(features))
        yield FeatureShard(features[start:stop], labels[start:stop], np.arange(start, stop, dtype=np.int64))
