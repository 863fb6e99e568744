"""Device selection: CUDA when it is there, CPU otherwise."""
from __future__ import annotations

import torch


def pick_device(requested: str = "auto") -> torch.device:
    """Return the torch device for ``requested`` ("auto", "cpu", "cuda" or "cuda:N").

    "auto" picks CUDA when available. Asking for CUDA on a machine without it raises
    ``ValueError`` with a sentence a person can act on.
    """
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} was requested but no CUDA GPU is available; use 'cpu' or 'auto'")
    try:
        return torch.device(requested)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {requested!r}; use 'auto', 'cpu' or 'cuda'") from exc
