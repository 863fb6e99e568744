"""Input checks for retrieval cells, with one-line messages a person can act on."""
from __future__ import annotations

import numpy as np


def check_features(name: str, x: np.ndarray) -> None:
    """A 2-D, non-empty, finite numeric feature array."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (items x dims), got shape {x.shape}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {x.shape})")
    if not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"{name} must be numeric, got dtype {x.dtype}")
    _refuse_rows(name, ~np.isfinite(x), "NaN/inf values")
    if x.dtype.kind == "f" and x.dtype.itemsize > 4:  # searched as float32, where these become inf
        _refuse_rows(name, np.abs(x) > np.finfo(np.float32).max, "values beyond the float32 range (|x| > 3.4e38)")


def _refuse_rows(name: str, bad: np.ndarray, what: str) -> None:
    """ValueError naming how many rows of ``bad`` (items x dims, bool) hold a bad value, and the first one."""
    rows = np.flatnonzero(bad.any(1))
    if len(rows):
        raise ValueError(f"{name} has {what} in {len(rows)} row(s) (first: row {rows[0]})")


def check_labels(name: str, labels: np.ndarray, n: int) -> None:
    """A 1-D integer-like label array with one label per feature row."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {labels.shape}")
    if len(labels) != n:
        raise ValueError(f"{name} has {len(labels)} labels for {n} feature rows")


def check_cell(query, query_labels, gallery, gallery_labels, *, same_set: bool) -> None:
    """Validate one (query, gallery) cell before any search."""
    check_features("query features", query)
    check_features("gallery features", gallery)
    check_labels("query labels", query_labels, np.asarray(query).shape[0])
    check_labels("gallery labels", gallery_labels, np.asarray(gallery).shape[0])
    dq, dg = np.asarray(query).shape[1], np.asarray(gallery).shape[1]
    if dq != dg:
        raise ValueError(f"query features are {dq}-d but gallery features are {dg}-d; they are not comparable")
    if same_set:
        if len(query) != len(gallery):
            raise ValueError(f"same_set=True needs one query per gallery item (got {len(query)} queries, {len(gallery)} gallery items)")
        if not np.array_equal(np.asarray(query_labels), np.asarray(gallery_labels)):
            raise ValueError("same_set=True but query and gallery labels differ row by row; are they the same images in the same order?")
