"""How many compute threads each process uses (torch, BLAS / OpenMP, numba); torch-free (stdlib only).

The rule: ``cores // processes`` threads per process, at least 1, where ``cores`` are the CPUs this process
may run on (``os.sched_getaffinity`` where the platform has it) and ``processes`` the processes computing at the
same time. ``run_app.py``'s workers share the cores (``worker --share-cores``): as each job starts, its worker
takes ``cores // (jobs running on this machine, its own included)``, so the demo alone evaluates on every core and a
check started beside it splits them (the measured reason: two workers at every core each ran the demo 4x slower
under load, one thread each ran it 1.8x slower on an idle machine, see ``bench/bench_demo.py``). The dashboard,
whose Learn pages compute in short bursts, gets ``cores // workers``. A worker on its own keeps the libraries'
defaults, every core. The user's choice replaces the rule: ``--threads N`` (``run_app.py``, ``python -m engine
worker``), else ``$COMPATLAB_THREADS``.

torch, OpenBLAS, MKL and OpenMP read their counts from the environment when they load, so a parent puts
:func:`thread_env` into a child's environment before the child starts; ``engine.models.thread_pools.apply`` (on the torch floor: this module
loads no library) sets them in a process that has already loaded the libraries (the worker) and reports what each library then uses. A count from the
environment above the cores is capped at the cores by torch and OpenBLAS; ``apply`` is not. numba is the
exception: ``$NUMBA_NUM_THREADS`` sizes its pool once, when it loads, and numba reads it again at every compilation
and raises once its threads run if it changed, so ``apply`` sets it only before numba has loaded in this process;
afterwards it leaves the variable (and so a child's numba pool) as numba loaded it and only sets how many of the
pool's threads numba uses (at most the pool: a worker whose first count was 1 keeps one numba thread).

A run's training and feature extraction do not use this count: they run on the config's ``compute_threads`` (default
1), since 1 and 2 threads train different models (``engine.models.arithmetic``); the count here sizes the rest (the
evaluation from stored features, numba's kernels, data preparation, the dashboard's Learn pages).
"""
from __future__ import annotations

import os
from collections.abc import Mapping

THREADS_ENV = "COMPATLAB_THREADS"  # declared in storage.settings (THREADS), which importing here would load SQLAlchemy
# OpenMP (torch's intra-op pool, numba's omp layer), the BLAS libraries numpy or torch may load, and numba
LIBRARY_ENVS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                "NUMEXPR_NUM_THREADS", "NUMBA_NUM_THREADS")


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one, else every CPU)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def parse_count(value: str | int, *, source: str) -> int:
    """A thread count given by the user (``source`` names where, for the error): a whole number >= 1."""
    try:
        count = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{source} must be a whole number of threads (1 or more), got {value!r}") from None
    if count < 1:
        raise ValueError(f"{source} must be a whole number of threads (1 or more), got {value!r}")
    return count


def requested(flag: int | None, environ: Mapping[str, str] | None = None) -> int | None:
    """The user's thread count: ``--threads`` if given, else ``$COMPATLAB_THREADS`` if set, else None (the rule).

    Raises ValueError with one line for a count below 1 or a variable that is not a whole number."""
    if flag is not None:
        return parse_count(flag, source="--threads")
    from storage.settings import THREADS, read_setting  # the one reader; here so that importing this module stays light

    return read_setting(THREADS, environ)


def per_process(*, processes: int, cores: int | None = None, override: int | None = None) -> int:
    """Threads for each of ``processes`` computing processes on ``cores`` CPUs: ``override`` when given, else
    ``cores // processes`` and at least 1."""
    if override is not None:
        return parse_count(override, source="the thread count")
    if processes < 1:
        raise ValueError(f"processes must be 1 or more, got {processes}")
    return max(1, (available_cores() if cores is None else cores) // processes)


def library_env(count: int) -> dict[str, str]:
    """The environment that sizes every library's thread pool in a child process at ``count`` threads."""
    return dict.fromkeys(LIBRARY_ENVS, str(count))


def thread_env(count: int) -> dict[str, str]:
    """The environment that gives a child process ``count`` threads in every library (and tells it the count)."""
    return {THREADS_ENV: str(count), **library_env(count)}
