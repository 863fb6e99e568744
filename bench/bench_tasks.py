"""Benchmark: one big cell through the task layer, evaluated by 1 worker vs 2 worker processes.

Query and gallery feature sets are written once (chunk by chunk through a memory-mapped file) with
``storage.save_feature_set`` into the file store, on SQLite (store beside the database file) and on a throw-away
PostgreSQL from tests/pgserver.py when one can be started (store: a temporary folder via
$COMPATLAB_FEATURE_STORE). For each worker count the cell is fanned out (``engine.evaluate.search_tasks.fan_out_cell``) and
N fresh processes (each with cores / N threads) run ``run_tasks(..., until_idle=True)``; the wall time runs from the first worker's start to
the last one's exit, each worker reports its own peak RSS, and the metrics of 1 and 2 workers must agree.

    python bench/bench_tasks.py                                        # 1,000,000 x 128 gallery, 10,000 queries
    python bench/bench_tasks.py --gallery 100000 --queries 1000 --shard-rows 20000 --block-rows 500   # quick
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SPAWN = mp.get_context("spawn")  # fresh processes: each worker's peak RSS is its own


def _mb(field: str) -> float:
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field + ":")) / 1024


def _worker(url: str, name: str, threads: int, out: mp.Queue) -> None:
    """Run tasks until none is left; report (name, tasks run, RSS after imports, peak RSS) in MB."""
    import threading

    import numba
    import torch

    from engine.tasks.loop import run_tasks
    from storage import get_engine

    torch.set_num_threads(threads)
    numba.set_num_threads(threads)
    base = _mb("VmRSS")
    ran = run_tasks(get_engine(url), name, False, threading.Event(), poll_s=0.05, until_idle=True)
    out.put((name, ran, base, _mb("VmHWM")))


def _save(db, folder: Path, n: int, dim: int, classes: int, rng: np.random.Generator, centres: np.ndarray,
          split: str, mv: int, chunk: int = 50_000) -> int:
    """Class centres + noise, generated ``chunk`` rows at a time into a memmap, then stored as one feature set."""
    from storage import save_feature_set, session_scope

    path = folder / f"{split}.npy"
    feats = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    labels = rng.integers(0, classes, n)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        feats[lo:hi] = centres[labels[lo:hi]] + 1.5 * rng.standard_normal((hi - lo, dim), dtype=np.float32)
    with session_scope(db) as s:
        fid = save_feature_set(s, mv, split, "encoder", feats, labels)
    del feats
    path.unlink()
    return fid


def bench(url: str, store: str | None, args: argparse.Namespace, folder: Path) -> None:
    if store:
        os.environ["COMPATLAB_FEATURE_STORE"] = store
    from engine.evaluate.search_tasks import fan_out_cell
    from storage import add_model_version, create_experiment, get_engine, init_db, session_scope
    from storage.tasks import job_result

    db = get_engine(url)
    init_db(db)
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((args.classes, args.dim), dtype=np.float32)
    with session_scope(db) as s:
        exp = create_experiment(s, name="bench", method="none", config={}, config_hash="h")
        mv = add_model_version(s, exp.id, 1, architecture="x", method="none", classes=[0], num_outputs=1,
                               feature_dim=args.dim).id
    t = time.perf_counter()
    gallery = _save(db, folder, args.gallery, args.dim, args.classes, rng, centres, "gallery", mv)
    query = _save(db, folder, args.queries, args.dim, args.classes, rng, centres, "query", mv)
    print(f"  wrote {args.gallery:,} x {args.dim} gallery + {args.queries:,} queries in {time.perf_counter() - t:.1f} s")
    results, times = {}, {}
    for n in (1, 2):
        job = fan_out_cell(db, query=query, gallery=gallery, ks=(1, 5), map_at=10, block_rows=args.block_rows,
                           shard_rows=args.shard_rows)
        out = SPAWN.Queue()
        threads = max(1, (os.cpu_count() or 1) // n)  # one machine: the workers share its cores
        procs = [SPAWN.Process(target=_worker, args=(url, f"w{i}", threads, out)) for i in range(n)]
        t = time.perf_counter()
        for p in procs:
            p.start()
        reports = sorted(out.get() for _ in procs)
        for p in procs:
            p.join()
        times[n] = time.perf_counter() - t
        with session_scope(db) as s:
            results[n] = job_result(s, job)["metrics"]
        shown = ", ".join(f"{name}: {tasks} tasks, peak RSS {peak:.0f} MB ({peak - base:+.0f} MB over its imports)"
                          for name, tasks, base, peak in reports)
        print(f"  {n} worker(s): {times[n]:.1f} s  ({shown})")
    same = all(abs(results[1][k] - results[2][k]) <= 1e-12 for k in results[1])
    print(f"  1 worker / 2 workers time ratio: {times[1] / times[2]:.2f}x; same metrics: {same}; "
          f"recall@1 {results[1]['recall@1']:.4f}, mAP {results[1]['map']:.4f}")


def _load_pgserver():
    """The tests' throw-away PostgreSQL helper (tests/pgserver.py), loaded from its file: tests/ is not a package."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "tests" / "pgserver.py"
    spec = importlib.util.spec_from_file_location("pgserver", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gallery", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--classes", type=int, default=10_000)
    parser.add_argument("--shard-rows", type=int, default=100_000, help="gallery rows per search task")
    parser.add_argument("--block-rows", type=int, default=2_000, help="query rows per search task")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    args = parser.parse_args()
    print(f"cell: {args.gallery:,} x {args.dim} gallery, {args.queries:,} queries, {args.classes:,} classes; "
          f"tasks of {args.block_rows:,} queries x {args.shard_rows:,} gallery rows; {os.cpu_count()} CPU cores")
    if not args.no_sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            print("SQLite + file store:")
            bench(f"sqlite:///{Path(tmp) / 'bench.db'}", None, args, Path(tmp))
    if args.no_postgres:
        return
    pgserver = _load_pgserver()
    try:
        server = pgserver.start()
    except pgserver.Unavailable as err:
        print(f"PostgreSQL: skipped ({err})")
        return
    try:
        with tempfile.TemporaryDirectory() as tmp:
            print("PostgreSQL + file store:")
            bench(server.create_database(), str(Path(tmp) / "store"), args, Path(tmp))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
