"""Where the evaluation core's arrays live: numpy on the CPU unless torch is asked for or already sees a GPU.

The neighbour passes (:mod:`engine.metrics.search`, :mod:`engine.metrics.backfill`, :mod:`engine.metrics.topk`) take
their similarity blocks from one matrix product per block and read them with the compiled kernels. On the CPU the
product is numpy's (BLAS) and nothing loads torch, so a check from stored vectors starts like a command-line tool;
with a torch device (CUDA, or the CPU when asked for) the arrays are tensors there. "auto" never loads a GPU library
to find out whether there is a GPU: a process that has already loaded torch and sees CUDA computes there (the worker,
a training run), any other computes on the CPU with numpy, which is as fast there (``bench/bench_check_start.py``).
The two CPU products differ in summation order only (numpy's OpenBLAS, torch's MKL): similarities agree to a few
float32 ulps, so a metric can move only where two scores of one query are that close.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

def auto_device() -> torch.device | None:
    """CUDA when torch is already loaded and sees a GPU; otherwise None (numpy on the CPU). Loads nothing."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.device("cuda")
    return None


def torch_device(device: str | torch.device) -> torch.device:
    """A torch device by name ("auto": CUDA when available); loads torch."""
    import torch

    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def on_cpu(x: Any) -> bool:
    """Whether ``x`` (a numpy array or a tensor) lives in host memory, where the compiled kernels read it."""
    return isinstance(x, np.ndarray) or x.device.type == "cpu"


def host(x: Any) -> np.ndarray:
    """A host array as numpy (a CPU tensor's own memory, no copy)."""
    return x if isinstance(x, np.ndarray) else x.numpy()


@contextmanager
def torch_threads_kept() -> Iterator[None]:
    """Around a numba call: numba's OpenMP layer can reset torch's thread count, so a loaded torch gets it back."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        if threads is not None:
            torch.set_num_threads(threads)
