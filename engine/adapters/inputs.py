"""Input checks shared by training and evaluation: one-line ``ValueError``s a person can act on."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import torch


def _numpy(x: np.ndarray | torch.Tensor | Sequence) -> np.ndarray:
    """``x`` as a numpy array (a tensor detached and moved to the CPU; without torch loaded, ``x`` is no tensor)."""
    torch = sys.modules.get("torch")
    return x.detach().cpu().numpy() if torch is not None and isinstance(x, torch.Tensor) else np.asarray(x)


def as_features(features: np.ndarray | torch.Tensor, what: str) -> np.ndarray:
    """``features`` as a finite float32 (N, d) array; raises on non-2-D, empty, non-numeric, NaN or inf."""
    array = _numpy(features)
    if array.ndim != 2:
        raise ValueError(f"{what} must be a 2-D array (samples x dimensions), got {array.ndim}-D shape {array.shape}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{what} is empty (shape {array.shape})")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{what} must hold numbers, got dtype {array.dtype}")
    array = array.astype(np.float32, copy=False)
    bad = ~np.isfinite(array)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        raise ValueError(
            f"{what} has NaN or inf in {rows.size} row(s), first at row {rows[0]}; drop or re-extract them"
        )
    return array


def as_labels(labels: np.ndarray | torch.Tensor | Sequence, n_rows: int, what: str) -> np.ndarray:
    """``labels`` as a 1-D array with one entry per feature row (any comparable values; NaN refused)."""
    array = _numpy(labels)
    if array.ndim != 1:
        raise ValueError(f"{what} must be 1-D (one label per sample), got shape {array.shape}")
    if array.shape[0] != n_rows:
        raise ValueError(f"{what} has {array.shape[0]} entries but the features have {n_rows} rows; one label per row")
    if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
        raise ValueError(f"{what} contains NaN or inf")
    return array


def check_same_rows(old: np.ndarray, new: np.ndarray, what_old: str, what_new: str) -> None:
    """Old and new features must describe the same samples: same number of rows."""
    if old.shape[0] != new.shape[0]:
        raise ValueError(
            f"{what_old} has {old.shape[0]} rows but {what_new} has {new.shape[0]}; "
            "they must be the same samples in the same row order"
        )


def check_ids(old_ids: Sequence | None, new_ids: Sequence | None, n_rows: int) -> None:
    """When image ids are given (both or neither), they must agree row by row."""
    if old_ids is None and new_ids is None:
        return
    if old_ids is None or new_ids is None:
        raise ValueError("give image ids for both the old and the new features, or for neither")
    old_arr, new_arr = np.asarray(old_ids), np.asarray(new_ids)
    if old_arr.shape != (n_rows,) or new_arr.shape != (n_rows,):
        raise ValueError(
            f"image ids must be 1-D with one id per row ({n_rows}), got {old_arr.shape} and {new_arr.shape}"
        )
    differ = np.flatnonzero(old_arr != new_arr)
    if differ.size:
        i = differ[0]
        raise ValueError(
            f"old and new features are not in the same row order: {differ.size} row(s) differ, first at row {i} "
            f"(old id {old_arr[i]!r}, new id {new_arr[i]!r}); sort both by image id"
        )


def check_class_sizes(codes: np.ndarray, classes: np.ndarray, minimum: int) -> None:
    """Every class needs ``minimum`` samples (the contrastive loss needs same-class positives)."""
    counts = np.bincount(codes, minlength=classes.shape[0])
    small = np.flatnonzero(counts < minimum)
    if small.size:
        shown = ", ".join(f"{classes[c].tolist()!r} ({counts[c]})" for c in small[:5])
        more = f" and {small.size - 5} more" if small.size > 5 else ""
        raise ValueError(
            f"the supervised contrastive loss needs at least {minimum} samples per class, but {small.size} "
            f"class(es) have fewer: {shown}{more}; drop those classes or set its weight w3 to 0"
        )
