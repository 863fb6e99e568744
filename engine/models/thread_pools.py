"""The thread rule of :mod:`engine.core.threads` applied to this process's libraries (torch, numba, BLAS / OpenMP):
on the torch floor, so that the core's rule loads no library itself (issue 40)."""
from __future__ import annotations

import os
import sys

from engine.core.threads import thread_env


def apply(count: int) -> dict[str, int]:
    """Use ``count`` threads in this process's torch, numba and loaded BLAS / OpenMP libraries, and in the children
    it starts (environment); return what each library reports afterwards (``blas`` absent when none is loaded).

    ``$NUMBA_NUM_THREADS`` is set only while numba is not loaded in this process (``engine.core.threads``' docstring)."""
    env = thread_env(count)
    if "numba" in sys.modules:  # its pool is sized: a new value would make its next compilation raise
        env.pop("NUMBA_NUM_THREADS")
    os.environ.update(env)  # first: numba sizes its pool from $NUMBA_NUM_THREADS when it loads
    import numba
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    torch.set_num_threads(count)
    numba.set_num_threads(min(count, numba.config.NUMBA_NUM_THREADS))  # the pool numba made when it loaded
    threadpool_limits(limits=count)
    used = {"torch": torch.get_num_threads(), "numba": numba.get_num_threads()}
    blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    if blas:
        used["blas"] = max(blas)
    return used
