"""The arithmetic a run trains and extracts features with: pinned, so a config and seed give the same numbers on any
machine whatever its cores or thread settings, and recorded with what the run stores.

Where the thread count changes results (measured on torch 2.14 CPU, oneDNN 3.12, ``torch.set_num_threads(1)`` vs
``(2)`` on the same inputs, bit for bit): the weight and bias gradients of oneDNN's convolutions (a reduction over
the batch split by thread) and torch's parallel sums over large tensors. Forward passes (convolution, linear,
batch norm), BLAS matrix products (torch and numpy) and the metrics computed from stored features (similarity
search, ranking kernels, bootstrap) gave identical bits with 1 and 2 threads; a 2-epoch ``digits-tiny`` run trained
models whose features differed by up to 1e-6 after two steps, and the demo's three-step runs end in different
models. ``torch.use_deterministic_algorithms`` does not change the CPU convolution (it concerns CUDA), and oneDNN off
(torch's own convolution) is thread-invariant but slower on one thread than oneDNN is.

The least costly fix is therefore to fix the *number* of intra-op threads of the training and extraction arithmetic:
``compute_threads`` in the config (default 1), set with ``torch.set_num_threads`` around each step's training and
extraction, whatever ``OMP_NUM_THREADS``, ``--threads`` or the workers' core sharing gave the process; a count above
the machine's cores still splits the work the same way (OpenMP runs that many threads), only slower. The evaluation
from stored features keeps the process's threads (the cores the worker was given). Deterministic algorithms are on
in the same scope (they matter on CUDA: cuDNN's autotuner off, deterministic kernels, a warning where none exists).
Not pinned: the CPU's instruction set (AVX2 vs AVX-512 kernels may round differently; it is recorded, see
:func:`arithmetic_record`), the library versions (recorded), and data-parallel training (``nproc`` > 1), whose
ranks size their own threads.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch


@contextmanager
def pinned_arithmetic(threads: int) -> Iterator[None]:
    """Run torch on ``threads`` intra-op threads with deterministic algorithms, then restore the process's settings."""
    # cuBLAS is deterministic only with a fixed workspace, read when CUDA first creates a handle (the user's setting stays)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark = torch.backends.cudnn.benchmark
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.set_num_threads(before)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.backends.cudnn.benchmark = benchmark


def arithmetic_record(threads: int, *, nproc: int = 1, device: torch.device | str | None = None) -> dict[str, Any]:
    """What a run's numbers depend on beyond its config: the pinned thread count, deterministic algorithms, the CPU
    instruction set torch dispatches to, the library versions and, when given, the device (with a GPU's name)
    (JSON-able, stored with the run)."""
    import numba

    record: dict[str, Any] = {
        "compute_threads": threads, "deterministic_algorithms": True,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__, "numpy": np.__version__, "numba": numba.__version__,
    }
    if device is not None:
        device = torch.device(device)
        record["device"] = str(device)
        if device.type == "cuda":
            record["gpu"] = torch.cuda.get_device_name(device)
    if nproc > 1:
        record["data_parallel_ranks"] = nproc  # each rank sizes its own threads (engine.run.ddp)
    return record
