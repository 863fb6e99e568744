"""Where the evaluation core's arrays live: numpy on the CPU unless torch is asked for or already sees a GPU.

The neighbour passes (:mod:`engine.metrics.search`, :mod:`engine.metrics.backfill`, :mod:`engine.metrics.topk`) take
their similarity blocks from one matrix product per block and read them with the compiled kernels. On the CPU the
product is numpy's (BLAS) and nothing loads torch, so a check from stored vectors starts like a command-line tool;
with a torch device (CUDA, or the CPU when asked for) the arrays are tensors there. "auto" never loads a GPU library
to find out whether there is a GPU: a process that has already loaded torch and sees CUDA computes there (the worker,
a training run), any other computes on the CPU with numpy, as fast there or faster (``bench/bench_metrics.py --torch-cpu``; README,
Benchmarks), and starts without torch's import (``bench/bench_check_start.py``).
The two CPU products differ in summation order only (numpy's OpenBLAS, torch's MKL): similarities agree to a few
float32 ulps, so a metric can move only where two scores of one query are that close.

A numpy pass runs its products on one BLAS thread (:func:`one_blas_thread`): OpenBLAS's threads spin for a while
after each product and take the cores the compiled kernel that follows needs (measured on the 2-core machine at load
average 4: the ranking pass 2.5x slower right after a two-thread product of 800 x 5,000 x 128; product and pass
0.41 s on one BLAS thread vs 0.62 s on two). It also makes the similarities independent of the number of cores:
OpenBLAS sums in another order with another thread count.
"""
from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
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


@functools.cache
def _thread_pools():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()  # the libraries loaded now (numpy's BLAS among them), inspected once


def one_blas_thread(numpy_products: bool = True) -> AbstractContextManager:
    """Around a pass that alternates numpy products with compiled kernels: BLAS on one thread (see the module
    docstring), the previous count back afterwards; nothing when ``numpy_products`` is false (tensors)."""
    return _thread_pools().limit(limits=1, user_api="blas") if numpy_products else nullcontext()


_ONE_PASS = threading.Lock()


@contextmanager
def one_pass_at_a_time(numpy_products: bool = True) -> Iterator[None]:
    """Around a pass run as a task of a Dask worker, which may run several tasks at once in threads: one such pass at
    a time in this process, on one BLAS thread (:func:`one_blas_thread`). The compiled kernels' thread pool and
    threadpoolctl's limits belong to the process: two threaded tasks launching numba's parallel kernels together
    aborted the process (the test suite, an in-process Dask client of 2 threads), and limits set and restored out of
    order would leave BLAS on the wrong count. A pass already uses every core, so little is lost."""
    with _ONE_PASS, one_blas_thread(numpy_products):
        yield


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
