"""``python -m engine evaluate``: compatibility matrices for a folder of precomputed features.

The folder holds ``step_1.npz ... step_T.npz``, each with the arrays ``query_features``,
``query_labels``, ``gallery_features`` and ``gallery_labels`` (loaded with ``allow_pickle=False``).
Everything is validated before anything is computed or stored.
"""
from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.metrics import CellFeatures, MatrixResult, compatibility_matrices, summarize
from engine.metrics.retrieval import parse_metric

KEYS = ("query_features", "query_labels", "gallery_features", "gallery_labels")
_STEP = re.compile(r"^step_(\d+)\.npz$")


class FolderError(ValueError):
    """A problem with one file of the folder; the message names the file."""


@dataclass(frozen=True)
class FeatureFolder:
    path: Path
    files: list[Path]
    sets: list[CellFeatures]


def _check_step(path: Path, arrays: dict[str, np.ndarray]) -> CellFeatures:
    missing = [k for k in KEYS if k not in arrays]
    if missing:
        raise FolderError(f"{path}: missing array(s) {', '.join(missing)} (expected {', '.join(KEYS)})")
    for side in ("query", "gallery"):
        feats, labels = arrays[f"{side}_features"], arrays[f"{side}_labels"]
        if feats.ndim != 2 or feats.shape[0] == 0:
            raise FolderError(f"{path}: {side}_features must be a non-empty 2-D array, got shape {feats.shape}")
        if feats.dtype.kind not in "fiu":
            raise FolderError(f"{path}: {side}_features must be numeric, got dtype {feats.dtype}")
        if not np.isfinite(feats).all():
            bad = int((~np.isfinite(feats)).any(1).sum())
            raise FolderError(f"{path}: {side}_features has NaN/inf values in {bad} row(s)")
        if labels.ndim != 1 or len(labels) != feats.shape[0]:
            raise FolderError(f"{path}: {side}_labels has {labels.size} labels for {feats.shape[0]} {side}_features rows")
        if labels.dtype.kind not in "iu":
            raise FolderError(f"{path}: {side}_labels must be integers, got dtype {labels.dtype}")
    dq, dg = arrays["query_features"].shape[1], arrays["gallery_features"].shape[1]
    if dq != dg:
        raise FolderError(f"{path}: query_features are {dq}-d but gallery_features are {dg}-d")
    return CellFeatures(*(arrays[k] for k in KEYS))


def load_feature_folder(folder: str | Path) -> FeatureFolder:
    """Read and validate ``step_*.npz``; raises :class:`FolderError` with one line naming the file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FolderError(f"{folder}: not a folder")
    numbered = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP.match(p.name)))
    if not numbered:
        raise FolderError(f"{folder}: no step_1.npz ... step_T.npz files found")
    steps = [n for n, _ in numbered]
    if steps != list(range(1, len(steps) + 1)):
        raise FolderError(f"{folder}: steps must be numbered 1..T without gaps, found {steps}")
    sets = []
    for _, path in numbered:
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
            raise FolderError(f"{path}: cannot be read as a .npz of plain arrays ({exc})") from None
        sets.append(_check_step(path, arrays))
    dims = {s.query.shape[1] for s in sets}
    if len(dims) > 1:
        per = ", ".join(f"{p.name}: {s.query.shape[1]}-d" for (_, p), s in zip(numbered, sets))
        raise FolderError(f"{folder}: feature dimensions differ between steps ({per}); evaluate needs one feature space")
    return FeatureFolder(folder, [p for _, p in numbered], sets)


def evaluate_folder(folder: FeatureFolder, *, metrics: tuple[str, ...], protocol: str, same_set: bool,
                    ties: str = "pessimistic") -> MatrixResult:
    """All metrics' matrices for the folder (one neighbour pass per cell)."""
    for m in metrics:
        parse_metric(m)
    return compatibility_matrices(folder.sets, metrics=metrics, protocol=protocol, same_set=same_set, ties=ties)


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
    return out
