"""The feature store: feature sets as files (``.npy`` shards + one Parquet of row data), SQL keeps the pointer.

Layout. Each (model version, split, view) write goes to a fresh key ``<root>/mv<id>/<split>/<token>/`` holding
``shard-00000.npy``, ``shard-00001.npy``, ... (consecutive row ranges of at most :data:`SHARD_BYTES` each) and
``rows.parquet`` (columns ``id`` = the row's position in the set, ``label`` and ``image_id``). The ``feature_sets``
row keeps only the pointer: ``store_uri`` (the root), ``store_key``, and ``store_layout`` (dtype, shape, rows and
sha256 of every shard and of the Parquet), with ``count``/``dim``; its ``features``/``labels`` columns hold a
zero-row placeholder of the right dtype (the columns are NOT NULL in existing databases) and ``image_ids`` is NULL.

Root. ``$COMPATLAB_FEATURE_STORE`` (a folder or ``s3://bucket/prefix``; S3 needs the ``s3`` extra, credentials
and endpoint come from the usual ``AWS_*`` / ``FSSPEC_S3_*`` variables) names it. Only persistent stores that
other processes can read are accepted (``memory://``, ``http://`` and other fsspec kinds are refused), and the S3
bucket must exist already (a misspelt bucket is refused, never created).
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

Sets assembled from parts (an extraction fanned out on Dask, ``engine.checkpoints.extract_dask``). Many writers each
put one part of rows
under the set's key as ``<name>-<token>.npy`` (:func:`write_part`: a fresh name per attempt, renamed into place when
complete), then one writer lists them in order (:func:`commit_parts`: the shards carry their ``file``) and adds
``rows-<token>.parquet`` (``rows_file``) before the pointer commits. Files of attempts that failed, were cancelled or
recomputed are swept (:func:`sweep_parts`): the unreferenced ones when the set commits, the whole folder when the run
fails or is cancelled.

Pointers are confined. A row's ``store_uri`` must name the configured store (another bucket, host or folder is
refused before anything is contacted), its ``store_key`` must be one this module writes (``mv<id>/<split>/<name>``:
no absolute key, no ``..``, no ``://``), the layout's file names plain names, and on a local root the resolved path
must lie under the resolved root before any read or delete; local files are opened by
``storage.safe_open`` (regular files under the root only). A pointer that fails this is refused with one line
when read and left alone when deleted (its files, if any, stay). Errors never quote a file's content.

Existing databases: read both. Rows written before the store (``store_key`` NULL) load from their blobs as
before; every new write goes to the store (no migration step, no rewrite of old rows). Every shard read is checked
against its recorded shape, dtype and sha256 (a changed or truncated file is a one-line ``ValueError``).
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import uuid
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import event, make_url
from sqlalchemy.orm import Session

from storage.safe_open import open_regular
from storage.settings import FEATURE_DTYPE, FEATURE_STORE, read_setting

STORE_ENV = FEATURE_STORE.name
DTYPE_ENV = FEATURE_DTYPE.name
DEFAULT_FOLDER = "features"  # beside a SQLite file; a relative store_uri is resolved from the database's folder
SHARD_BYTES = 64 * 2**20
ROWS_FILE = "rows.parquet"
_MAX_HEADER = 10_000  # bytes of a shard's .npy header read at most
_PENDING = "featurestore_pending"
PERSISTENT = ("file", "local", "s3", "s3a")  # store kinds every process can reach (fsspec protocols)
_FIRST = re.compile(r"mv\d+")
_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.(npy|parquet)")
_BUCKETS_SEEN: set[tuple[str, int]] = set()
LOG = logging.getLogger(__name__)


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


def _checked_kind(uri: str) -> str:
    """``uri`` when it names a persistent store (a folder or S3); ``ValueError`` otherwise."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else "file"
    if scheme not in PERSISTENT:
        raise ValueError(f"feature store {_shown(uri)} is not a persistent store that other processes can read; set "
                         f"${STORE_ENV} to a folder or to s3://bucket/prefix")
    return uri


def _shown(text: str) -> str:
    """A recorded or configured location as printed in errors: quoted, control characters escaped, at most 200."""
    return repr(text[:200])


def store_uri(session: Session) -> str | None:
    """The root new feature sets go to (see the module docstring); None: keep them as blobs in SQL.

    ``ValueError`` when ``$COMPATLAB_FEATURE_STORE`` names a store that is not persistent (``memory://``, ``http://``).
    """
    configured = read_setting(FEATURE_STORE)
    if configured:
        _checked_kind(configured)
        return configured if "://" in configured else str(Path(configured).expanduser().absolute())
    return DEFAULT_FOLDER if _database_folder(session) is not None else None


def _normal(session: Session, uri: str) -> str | None:
    """A store location comparable with another: ``scheme://path`` without a trailing ``/``, a local folder resolved
    (a relative one from the SQLite file's folder); None when a relative folder has no SQLite file to start from."""
    if "://" in uri:
        scheme, rest = uri.split("://", 1)
        scheme = scheme.lower()
        return str(Path(os.path.realpath(rest))) if scheme in ("file", "local") else f"{scheme}://{rest.strip('/')}"
    if not os.path.isabs(uri):
        folder = _database_folder(session)
        if folder is None:
            return None
        uri = str(folder / uri)
    return os.path.realpath(uri)


def _configured_root(session: Session, uri: str) -> str:
    """The recorded ``uri`` when it names the configured store; ``ValueError`` (one line) otherwise, before
    anything is contacted."""
    configured = store_uri(session)
    if configured is None and "://" not in uri and not os.path.isabs(uri):
        raise ValueError(f"feature store {_shown(uri)} is relative to a SQLite file's folder, but the database is not "
                         f"a SQLite file; set ${STORE_ENV}")
    if configured is None:
        raise ValueError(f"a feature set points at the store {_shown(uri)}, but no feature store is configured; set "
                         f"${STORE_ENV} to that store to read it")
    if _normal(session, uri) != _normal(session, configured):
        raise ValueError(f"a feature set points at the store {_shown(uri)}, not at the configured store "
                         f"{_shown(configured)}; only the configured store is read ({STORE_ENV})")
    return configured


def check_key(key: Any) -> str:
    """``key`` when it is one this module writes (``mv<id>/<split>/<name>``); ``ValueError`` (one line) otherwise."""
    parts = key.split("/") if isinstance(key, str) else []
    if (len(parts) != 3 or not _FIRST.fullmatch(parts[0]) or any(p in ("", ".", "..") for p in parts)
            or "://" in key or "\\" in key or any(ord(c) < 32 or c == "\x7f" for c in key)):
        raise ValueError(f"feature store key {_shown(str(key))} is not one the store writes (mv<id>/<split>/<name>: "
                         f"no absolute key, no '..', no '://'); it is not followed")
    return key


def _check_file_name(name: Any) -> str:
    """A layout's file name: a plain ``.npy``/``.parquet`` name; ``ValueError`` otherwise."""
    if not isinstance(name, str) or not _FILE.fullmatch(name):
        raise ValueError(f"feature store file name {_shown(str(name))} is not a plain .npy or .parquet name; it is "
                         f"not followed")
    return name


def _filesystem(session: Session, uri: str) -> tuple[Any, str]:
    """``(fsspec filesystem, root path)`` of a recorded ``store_uri``, which must be the configured store;
    ``ValueError`` when it is not, or cannot be reached (an S3 bucket must exist)."""
    import fsspec

    uri = _configured_root(session, uri)
    if "://" not in uri and not os.path.isabs(uri):
        uri = str(_database_folder(session) / uri)  # the default folder: configured only beside a SQLite file
    try:
        fs, path = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:
        raise ValueError(f"feature store {uri} cannot be opened: {exc}".splitlines()[0]) from None
    root = path.rstrip("/")
    if not _is_local(fs):
        _require_bucket(fs, uri, root)
    return fs, root


def _require_bucket(fs: Any, uri: str, root: str) -> None:
    """``ValueError`` unless the bucket of an object-store root exists (checked once per process and root)."""
    if (uri, id(fs)) in _BUCKETS_SEEN:
        return
    bucket = root.split("/", 1)[0]
    try:
        found = bool(bucket) and fs.exists(bucket)
    except Exception as exc:  # noqa: BLE001 - any client error (credentials, endpoint) is one line
        raise ValueError(f"feature store {uri} cannot be reached ({type(exc).__name__}); check the endpoint and "
                         f"credentials") from None
    if not found:
        raise ValueError(f"feature store {uri}: bucket {bucket!r} does not exist (or these credentials cannot see "
                         f"it); create it first, the store never creates buckets")
    _BUCKETS_SEEN.add((uri, id(fs)))


def _set_path(fs: Any, root: str, key: str, *, follow: bool = True) -> str:
    """``root/key`` for a checked ``key``; on a local root resolved (``follow``) and required to lie under the
    resolved root, so no symlink leads a read or delete out of the store."""
    path = f"{root}/{check_key(key)}"
    if not _is_local(fs):
        return path
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(path)) if follow else Path(path)
    if real_root not in real.parents:
        raise ValueError(f"feature set {_shown(key)} resolves outside the store {real_root}; it is not followed")
    return str(real)


def check_store(session: Session) -> None:
    """``ValueError`` (one line) unless the configured store, if any, can be used: a persistent kind, an existing
    bucket, a local folder that can be created and written. Call it before work whose results go there."""
    uri = store_uri(session)
    if uri is None:
        return
    fs, root = _filesystem(session, uri)
    if _is_local(fs):
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"feature store {root} cannot be created ({exc.strerror or type(exc).__name__}); set "
                             f"${STORE_ENV} to a folder this process can write") from None
        if not os.path.isdir(root) or not os.access(root, os.W_OK | os.X_OK):
            raise ValueError(f"feature store {root} is not a folder this process can write; set ${STORE_ENV}")


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
    """A shard's file: ``shard-<index>.npy``, or the ``file`` named by a set assembled from parts (a plain name)."""
    return f"{base}/{_check_file_name(shard.get('file') or f'shard-{index:05d}.npy')}"


def _open_read(fs: Any, path: str, max_bytes: int | None) -> Any:
    """A store file opened for reading; on a local root through ``storage.safe_open`` (a regular file under the
    root's resolved folder, at most ``max_bytes`` when given), so a FIFO, a device or a symlink out of the store is refused."""
    if not _is_local(fs):
        return fs.open(path, "rb")
    return open_regular(path, roots=[os.path.dirname(path)], what="feature store file", max_bytes=max_bytes)


def _check_header(file: _Hashed, path: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    fmt = np.lib.format
    try:  # numpy's own messages quote the bytes they found: never shown
        version = fmt.read_magic(file)
        if version != (1, 0):
            raise ValueError
        found_shape, fortran, found_dtype = fmt.read_array_header_1_0(file, max_header_size=_MAX_HEADER)
    except (ValueError, SyntaxError, TypeError, EOFError):
        raise ValueError(f"feature shard {path} is not a version 1.0 .npy file: the file was replaced") from None
    if found_shape != shape or found_dtype != dtype or fortran:
        raise ValueError(f"feature shard {path} holds {found_dtype} {found_shape}, the database recorded "
                         f"{dtype} {shape}: the file was replaced")


def _read_npy(fs: Any, path: str, sha256: str, shape: tuple[int, ...], dtype: np.dtype, out: np.ndarray) -> None:
    """Read a shard into ``out`` (shape checked before reading, sha256 after); ``ValueError`` on any mismatch."""
    target = out if out.dtype == dtype else np.empty(shape, dtype)
    try:
        with _open_read(fs, path, target.nbytes + _MAX_HEADER) as raw:
            file = _Hashed(raw)
            _check_header(file, path, shape, dtype)
            filled = file.readinto(memoryview(target).cast("B")) if target.size else 0
            extra = raw.read(1)
    except FileNotFoundError:
        raise ValueError(f"feature shard {path} is missing from the store") from None
    except OSError as exc:
        raise ValueError(f"feature shard {path} cannot be read ({exc.strerror or type(exc).__name__})") from None
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

    path = f"{base}/{_check_file_name(layout.get('rows_file', ROWS_FILE))}"
    bound = rows_bound(layout)
    try:
        with _open_read(fs, path, None) as raw:
            data = raw.read(bound + 1)  # never more than the set's rows can take (the check below says so)
    except FileNotFoundError:
        raise ValueError(f"feature rows {path} are missing from the store") from None
    except OSError as exc:
        raise ValueError(f"feature rows {path} cannot be read ({exc.strerror or type(exc).__name__})") from None
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
    wanted = read_setting(FEATURE_DTYPE)
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
    if _is_local(fs):  # an object store has no folders (and s3fs's makedirs would create a missing bucket)
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
    except BaseException as exc:
        _remove(fs, staging)
        _raise_unwritable(exc, root)
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
    dtype, folder, file = _stored_dtype(features), _set_path(fs, root, key), _check_file_name(f"{name}-{uuid.uuid4().hex}.npy")
    local = _is_local(fs)
    staging = f"{folder}/.tmp-{file}" if local else f"{folder}/{file}"
    try:
        if local:
            fs.makedirs(folder, exist_ok=True)
        sha256 = _write_npy(fs, staging, features.astype(dtype, copy=False))
        if local:
            os.replace(staging, f"{folder}/{file}")
    except BaseException as exc:
        _remove(fs, staging)
        _raise_unwritable(exc, root)
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
    folder = _set_path(fs, root, key)
    for p in parts:
        _check_file_name(p["file"])
    (dtype, read_dtype, dim), = kinds
    rows_file = f"rows-{uuid.uuid4().hex}.parquet"
    layout = {"dtype": dtype, "read_dtype": read_dtype, "shape": [count, dim], "rows_file": rows_file,
              "shards": [{k: p[k] for k in ("file", "rows", "sha256")} for p in parts]}
    try:
        layout |= _write_rows(fs, f"{folder}/{rows_file}", labels, image_ids)
    except OSError as exc:
        _raise_unwritable(exc, root)
    _pending(session)["written"].append((fs, f"{folder}/{rows_file}"))
    return Pointer(uri, key, layout)


def forget(session: Session, uri: str, key: str) -> None:
    """Delete the set at ``key`` once the session commits (its row was replaced or deleted).

    A root this process cannot reach, or a pointer that is not the configured store's (another store, a key with
    ``..``, a path resolving out of the root) is left alone with a logged line: the row still goes, no file is deleted.
    """
    try:
        fs, root = _filesystem(session, uri)
        path = _set_path(fs, root, key)
    except ValueError as exc:
        LOG.warning("feature set files not deleted: %s", exc)
        return
    _pending(session)["replaced"].append((fs, path if not _is_local(fs) else (os.path.realpath(root), key)))


def _raise_unwritable(exc: BaseException, root: str) -> None:
    """Re-raise an ``OSError`` met while writing as a one-line ``ValueError``; anything else is left to the caller."""
    if isinstance(exc, OSError):
        reason = exc.strerror or (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise ValueError(f"feature store {root} cannot be written ({reason}); set "
                         f"${STORE_ENV} to a store this process can write") from None


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
    except OSError as exc:
        LOG.warning("feature store files %s not deleted (%s)", path, exc.strerror or type(exc).__name__)


def _remove_local_set(root: str, key: str) -> None:
    """Delete ``root/key`` walking down from the root without following any symlink (each folder opened with
    ``O_NOFOLLOW`` relative to its parent, the last removed by ``shutil.rmtree(dir_fd=...)``), so a link planted or
    swapped in after the pointer was checked cannot lead the deletion out of the store."""
    import shutil

    *folders, last = check_key(key).split("/")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fds = []
    try:
        fds.append(os.open(root, flags))
        for name in folders:
            fds.append(os.open(name, flags, dir_fd=fds[-1]))
        shutil.rmtree(last, dir_fd=fds[-1])
    except FileNotFoundError:
        pass
    except OSError as exc:  # a symlink on the way (ELOOP / ENOTDIR), permissions: nothing followed, nothing raised
        LOG.warning("feature set %s in %s not deleted (%s)", key, root, exc.strerror or type(exc).__name__)
    finally:
        for fd in fds:
            os.close(fd)


def _pending(session: Session) -> dict[str, list[tuple[Any, Any]]]:
    """Files to delete when the session's transaction ends: new ones on rollback, replaced ones on commit."""
    if _PENDING not in session.info:
        session.info[_PENDING] = {"written": [], "replaced": []}
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_soft_rollback", _after_rollback)
    return session.info[_PENDING]


def _after_commit(session: Session) -> None:
    pending = session.info[_PENDING]
    for fs, path in pending["replaced"]:
        if isinstance(path, tuple):
            _remove_local_set(*path)
        else:
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
    return fs, _set_path(fs, root, pointer.key), np.dtype(layout["dtype"]), np.dtype(layout["read_dtype"])


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
