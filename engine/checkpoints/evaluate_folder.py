"""``python -m engine evaluate``: compatibility matrices for a folder of precomputed features.

The folder holds ``step_1.npz ... step_T.npz``, each with the arrays ``query_features``,
``query_labels``, ``gallery_features`` and ``gallery_labels`` (float features, integer labels >= 0), and optionally
``query_groups`` (integers, one per query: which queries are related; ``check-upgrade --query-groups query_groups``).
Each array's header is checked against its member's size and a cap before it is read (never unpickled),
and everything is validated before anything is computed or stored. Each file is opened by
``storage.safe_open`` (a regular file, checked after opening: a FIFO or a device named ``step_1.npz`` is refused at
once); the folder is the operator's own, so its files are not confined to the data roots.
"""
from __future__ import annotations

import math
import re
import zipfile
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
from sqlalchemy import Engine

from storage.safe_open import open_regular
from storage.settings import MAX_ARRAY_BYTES, read_setting
from engine.core.kinds import STRICT
from engine.metrics import summarize
from engine.metrics.compatibility import CellFeatures, MatrixResult, compatibility_matrices, stored_summary
from engine.metrics.paired import PairedOptions
from engine.metrics.retrieval import parse_metric
from engine.results.record import NewVersion, record_experiment

KEYS = ("query_features", "query_labels", "gallery_features", "gallery_labels")
OPTIONAL_KEYS = ("query_groups",)  # integers, one per query: related queries (check-upgrade --query-groups query_groups)
_STEP = re.compile(r"^step_(\d+)\.npz$")
MAX_ARRAY_BYTES_ENV = MAX_ARRAY_BYTES.name
DEFAULT_MAX_ARRAY_BYTES = MAX_ARRAY_BYTES.default  # per array, checked against its declared shape before reading
MAX_LABEL = 2**31 - 1
MAX_STEPS = 200  # models per folder: T^2 cells are searched
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class FolderError(ValueError):
    """A problem with one file of the folder; the message names the file."""


@dataclass(frozen=True)
class FeatureFolder:
    path: Path
    files: list[Path]
    sets: list[CellFeatures]
    query_groups: list[np.ndarray | None] = field(default_factory=list)  # per step: its query_groups array, if any


def max_array_bytes() -> int:
    """The per-array size cap: ``$COMPATLAB_MAX_ARRAY_BYTES`` or 4 GiB."""
    return read_setting(MAX_ARRAY_BYTES)


def _read_member(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo, cap: int) -> np.ndarray:
    """One ``.npy`` member: its header's shape x dtype checked against the member's size and ``cap`` before reading."""
    key = info.filename[:-4]
    if info.file_size > cap + 4096:  # the declared uncompressed size, before inflating anything
        raise FolderError(f"{path}: {key} inflates to {info.file_size} bytes, above the {cap}-byte cap ({MAX_ARRAY_BYTES_ENV})")
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise FolderError(f"{path}: {key} is a .npy of format version {version}; save it with numpy.savez")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f, max_header_size=10_000)
        if dtype.hasobject or dtype.kind not in "biuf" or dtype.fields is not None:
            raise FolderError(f"{path}: cannot be read as a .npz of plain arrays ({key} has dtype {dtype}; never unpickled)")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > cap:
            raise FolderError(f"{path}: {key} declares shape {shape} x {dtype} = {nbytes} bytes, above the {cap}-byte cap "
                              f"({MAX_ARRAY_BYTES_ENV})")
        if f.tell() + nbytes != info.file_size:
            raise FolderError(f"{path}: {key} declares shape {shape} x {dtype} = {nbytes} bytes, but the member holds "
                              f"{info.file_size - f.tell()}")
        buf = bytearray(nbytes)
        if f.readinto(buf) != nbytes:
            raise FolderError(f"{path}: {key} is truncated")
    return np.frombuffer(buf, dtype).reshape(shape, order="F" if fortran else "C")


def read_npz(path: Path, *, cap: int | None = None) -> dict[str, np.ndarray]:
    """The arrays of a ``.npz`` with exactly the :data:`KEYS`, each size-checked before it is read; never unpickles."""
    cap = max_array_bytes() if cap is None else cap
    try:
        handle = open_regular(path, roots=None, what="feature file")
    except OSError as exc:
        raise FolderError(f"{path}: cannot be opened ({exc.strerror or type(exc).__name__})") from None
    except ValueError as exc:  # not a regular file (a FIFO, a device, a folder): refused without reading
        raise FolderError(str(exc)) from None
    with handle:
        return _read_zip(path, handle, cap)


def _read_zip(path: Path, handle: BinaryIO, cap: int) -> dict[str, np.ndarray]:
    if not zipfile.is_zipfile(handle):
        raise FolderError(f"{path}: not a .npz (zip) archive; save the four arrays with numpy.savez")
    try:
        with zipfile.ZipFile(handle) as zf:
            members = {info.filename: info for info in zf.infolist()}
            if len(members) < len(zf.infolist()):
                twice = sorted(n for n, c in Counter(i.filename for i in zf.infolist()).items() if c > 1)
                raise FolderError(f"{path}: holds a member name twice ({', '.join(twice)}); which array is meant is unclear")
            names = {n[:-4] for n in members if n.endswith(".npy")}
            other = sorted(n for n in members if not n.endswith(".npy"))
            missing, extra = [k for k in KEYS if k not in names], sorted(names - set(KEYS) - set(OPTIONAL_KEYS)) + other
            if missing:
                raise FolderError(f"{path}: missing array(s) {', '.join(missing)} (expected {', '.join(KEYS)})")
            if extra:
                raise FolderError(f"{path}: unexpected array(s) {', '.join(extra)} (expected only {', '.join(KEYS)}, and "
                                  f"optionally {', '.join(OPTIONAL_KEYS)})")
            return {k: _read_member(path, zf, members[f"{k}.npy"], cap) for k in (*KEYS, *OPTIONAL_KEYS) if k in names}
    except FolderError:
        raise
    except (ValueError, OSError, EOFError, RuntimeError, NotImplementedError, zipfile.BadZipFile, zlib.error) as exc:
        raise FolderError(f"{path}: cannot be read as a .npz of plain arrays ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else 'corrupt'})") from None


def _check_step(path: Path, arrays: dict[str, np.ndarray]) -> CellFeatures:
    """The step's four arrays, features as float32: every problem is a FolderError naming the file and the array."""
    out = {}
    for side in ("query", "gallery"):
        fk, lk = f"{side}_features", f"{side}_labels"
        feats, labels = arrays[fk], arrays[lk]
        if feats.ndim != 2 or feats.shape[0] == 0 or feats.shape[1] == 0:
            raise FolderError(f"{path}: {fk} must be a non-empty 2-D array (items x dims), got shape {feats.shape}")
        if feats.dtype.kind != "f":
            raise FolderError(f"{path}: {fk} must be floating point (float16/32/64), got dtype {feats.dtype}")
        beyond = np.abs(feats) > _FLOAT32_MAX if feats.dtype.itemsize > 4 else np.zeros(feats.shape, bool)
        for bad, what in ((~np.isfinite(feats), "NaN/inf values"), (beyond, "values beyond float32")):
            rows = np.flatnonzero(bad.any(1))
            if len(rows):
                raise FolderError(f"{path}: {fk} has {what} in {len(rows)} row(s) (first: row {rows[0]})")
        feats = feats.astype(np.float32)
        zero = np.flatnonzero(~feats.any(1))
        if len(zero):
            raise FolderError(f"{path}: {fk} has {len(zero)} all-zero row(s) in float32 (first: row {zero[0]}); "
                              f"cosine similarity is undefined for them")
        if labels.ndim != 1 or len(labels) != feats.shape[0]:
            raise FolderError(f"{path}: {lk} has {labels.size} labels for {feats.shape[0]} {fk} rows (shape {labels.shape})")
        if labels.dtype.kind not in "iu":
            raise FolderError(f"{path}: {lk} must be integers, got dtype {labels.dtype}")
        if labels.min() < 0 or labels.max() > MAX_LABEL:
            raise FolderError(f"{path}: {lk} must lie in 0..{MAX_LABEL}, found {labels.min()}..{labels.max()}")
        out[fk], out[lk] = feats, labels.astype(np.int64)
    dq, dg = out["query_features"].shape[1], out["gallery_features"].shape[1]
    if dq != dg:
        raise FolderError(f"{path}: query_features are {dq}-d but gallery_features are {dg}-d")
    groups = arrays.get("query_groups")
    if groups is not None and (groups.ndim != 1 or len(groups) != len(out["query_labels"]) or groups.dtype.kind not in "iu"):
        raise FolderError(f"{path}: query_groups must be integers, one per query ({len(out['query_labels'])}), got shape "
                          f"{groups.shape} {groups.dtype}")
    return CellFeatures(*(out[k] for k in KEYS))


def load_feature_folder(folder: str | Path, *, cap: int | None = None) -> FeatureFolder:
    """Read and validate ``step_*.npz``; raises :class:`FolderError` with one line naming the file.

    ``cap``: bytes per array (default :func:`max_array_bytes`), checked from the headers before reading.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FolderError(f"{folder}: not a folder")
    numbered = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP.match(p.name)))
    if not numbered:
        raise FolderError(f"{folder}: no step_1.npz ... step_T.npz files found")
    steps = [n for n, _ in numbered]
    if len(steps) > MAX_STEPS:
        raise FolderError(f"{folder}: {len(steps)} step files; at most {MAX_STEPS} (a T x T matrix is computed)")
    if steps != list(range(1, len(steps) + 1)):
        raise FolderError(f"{folder}: steps must be numbered 1..T without gaps or repeats, found {steps}")
    arrays = [read_npz(path, cap=cap) for _, path in numbered]
    sets = [_check_step(path, a) for (_, path), a in zip(numbered, arrays)]
    dims = {s.query.shape[1] for s in sets}
    if len(dims) > 1:
        per = ", ".join(f"{p.name}: {s.query.shape[1]}-d" for (_, p), s in zip(numbered, sets))
        raise FolderError(f"{folder}: feature dimensions differ between steps ({per}); evaluate needs one feature space")
    return FeatureFolder(folder, [p for _, p in numbered], sets, [a.get("query_groups") for a in arrays])


def evaluate_folder(folder: FeatureFolder, *, metrics: tuple[str, ...], gallery_kind: str, same_set: bool,
                    rank_ties: str = "pessimistic", paired: PairedOptions | None = None) -> MatrixResult:
    """All metrics' matrices for the folder (one neighbour pass per cell); with ``paired``, every cross-test's
    interval and verdict as check-upgrade computes them (:mod:`engine.metrics.cell_interval`)."""
    for m in metrics:
        parse_metric(m)
    return compatibility_matrices(folder.sets, metrics=metrics, gallery_kind=gallery_kind, same_set=same_set, rank_ties=rank_ties,
                                  paired=paired)


def result_json(result: MatrixResult, *, ecc_ties: str = "fail") -> dict:
    """JSON-ready dict: per metric the matrix (null above the diagonal), AC/AA/ACA, curves and counts."""
    out = {}
    for name, C in result.values.items():
        out[name] = {
            "matrix": [[None if np.isnan(v) else float(v) for v in row] for row in C],
            **summarize(C, ties=ecc_ties),
            "valid_queries": [[None if v < 0 else int(v) for v in row] for row in result.valid_queries],
            "no_positive": [[None if v < 0 else int(v) for v in row] for row in result.no_positive],
        }
        stored = stored_summary(result, name, ties=ecc_ties)
        if result.paired and name in result.paired:  # each cross-test's interval and verdict, as stored
            out[name]["paired"] = stored["paired"]
        if "tie_readings" in stored:  # Recall@k: each cell's ties and its value under each tie reading
            out[name]["tie_readings"] = stored["tie_readings"]
    return out


def store_feature_evaluation(db: Engine, *, name: str, config: dict, sets: Sequence[CellFeatures], result: MatrixResult,
                             gallery_kind: str, view: str = "external", ties: str = STRICT) -> int:
    """Store an evaluation of external features (one experiment, one model version per step) in one transaction."""
    versions = [NewVersion(architecture="external", method="features",
                        classes=sorted({int(c) for c in fs.gallery_labels} | {int(c) for c in fs.query_labels}),
                        num_outputs=0, feature_dim=int(fs.query.shape[1]),
                        outputs={"query": {view: fs.query}, "gallery": {view: fs.gallery}},
                        labels={"query": fs.query_labels, "gallery": fs.gallery_labels})
                for fs in sets]
    return record_experiment(db, name=name, method="features", config=config, versions=versions, results={view: result},
                             gallery_kind=gallery_kind, ties=ties)
