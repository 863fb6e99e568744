"""``check-upgrade --old-gallery`` on Parquet sources, in this process against a ``LocalCluster`` of worker processes.

Writes (seeded, one row group at a time, memory bounded) a Parquet old gallery of ``--rows`` x ``--dim`` float32
vectors with class labels, and ``--queries`` queries embedded by the old and by the new model (new = old through a
partial random mixing plus noise), in a temporary folder. Then runs the whole check
(:func:`engine.upgrade.from_sources.check_sources`, relevance labels, the CLI's defaults) twice, each in its own
child process so each peak memory is its own:

1. in this process (no ``--cluster``), the baseline: its wall time and peak RSS;
2. on a ``LocalCluster`` of ``--workers`` processes of one thread each (what ``--cluster local:N`` starts), reached by
   its address: its wall time (the cluster's start and the workers' imports timed apart), the peak RSS of the client and of each worker
   (``ru_maxrss`` of each worker process, read through ``client.run``), and each task's measured compute time (the
   scheduler's task stream).

Prints the ratio (baseline / cluster, > 1: the cluster is faster), whether the two give the same top-k ids and tie
counts (scores to 1e-6) and the same JSON (every number to 1e-9), and a **projection** of the check's time on more
workers from the measured numbers: the part outside the search (measured: the cluster run's wall time minus its
search span) plus the measured task times scheduled longest first on W workers of one core each. It is arithmetic on
this run's figures, not a measurement on W machines (it leaves out the scheduler's round trips and any read
contention). Run: ``nice python bench/bench_dask_check.py --rows 100000 --queries 1000``.
"""
from __future__ import annotations

import argparse
import heapq
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
ROW_GROUP = 50_000


def _table(ids: np.ndarray, vectors: np.ndarray, labels: np.ndarray) -> pa.Table:
    column = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(vectors).ravel()), vectors.shape[1])
    return pa.table({"id": ids, "vector": column, "label": labels})


def write_sources(folder: Path, *, rows: int, dim: int, queries: int, classes: int, seed: int) -> dict[str, str]:
    """The old gallery and the old and new queries as Parquet files in ``folder``; returns their source texts."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, dim), dtype=np.float32)
    mix = (np.eye(dim) + 0.7 * rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)
    schema = _table(np.zeros(0, np.int64), np.zeros((0, dim), np.float32), np.zeros(0, np.int64)).schema
    with pq.ParquetWriter(folder / "old_gallery.parquet", schema) as writer:
        for lo in range(0, rows, ROW_GROUP):
            n = min(rows, lo + ROW_GROUP) - lo
            labels = rng.integers(0, classes, n)
            vectors = centres[labels] + 1.3 * rng.standard_normal((n, dim), dtype=np.float32)
            writer.write_table(_table(np.arange(lo, lo + n, dtype=np.int64), vectors, labels))
    labels = rng.integers(0, classes, queries)
    old = centres[labels] + 1.3 * rng.standard_normal((queries, dim), dtype=np.float32)
    new = old @ mix + 0.3 * rng.standard_normal((queries, dim), dtype=np.float32)
    q_ids = np.arange(10**9, 10**9 + queries, dtype=np.int64)
    pq.write_table(_table(q_ids, old, labels), folder / "old_queries.parquet")
    pq.write_table(_table(q_ids, new, labels), folder / "new_queries.parquet")
    return {side: str(folder / f"{side}.parquet") for side in ("old_gallery", "old_queries", "new_queries")}


def _peak_mb() -> float:
    """This process's peak resident memory in MB (Linux: ``ru_maxrss`` in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(folder: Path, workers: int, shard_rows: int, block_rows: int) -> None:
    """One check (``workers`` 0: in this process), its lists in ``folder``/lists-N.npz and its figures as JSON."""
    from engine.core.cluster import parse_cluster
    from engine.core.fan_out import FanOut
    from engine.upgrade.from_sources import SourceSpecs, check_sources

    specs = SourceSpecs(**json.loads((folder / "specs.json").read_text()))
    out: dict = {}
    if workers == 0:
        start = time.perf_counter()
        check = check_sources(specs, relevance="labels")
        out["wall_s"] = time.perf_counter() - start
    else:
        import logging

        import distributed

        from engine.core.threads import library_env, per_process

        start = time.perf_counter()
        with (distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                                       silence_logs=logging.ERROR,
                                       env=library_env(per_process(processes=workers))) as cluster,
              distributed.Client(cluster) as client):
            client.wait_for_workers(workers)
            client.run(importlib.import_module, "engine.evaluate.dask_search")  # the workers' imports: in the start
            out["start_s"] = time.perf_counter() - start
            start = time.perf_counter()
            with distributed.get_task_stream(client) as stream:
                check = check_sources(specs, relevance="labels", cluster=parse_cluster(cluster.scheduler_address),
                                      fan_out=FanOut(block_rows=block_rows, shard_rows=shard_rows))
            out["wall_s"] = time.perf_counter() - start
            out["worker_peak_mb"] = sorted(
                v / 1024 for v in client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss).values())
        computes = [(s["start"], s["stop"]) for task in stream.data for s in task["startstops"]
                    if s["action"] == "compute" and str(task["key"]).startswith("partition_topk")]
        out["tasks_s"] = [b - a for a, b in computes]
        out["search_span_s"] = max(b for _, b in computes) - min(a for a, _ in computes)
    lists = check.lists
    np.savez(folder / f"lists-{workers}.npz", ids=lists.old_old.ids, scores=lists.old_old.scores,
             tied=lists.old_old.tied_beyond)
    out["json"] = json.loads(json.dumps(check.to_json()))
    out["peak_mb"] = _peak_mb()
    print(json.dumps(out))


def _run_child(folder: Path, workers: int, args: argparse.Namespace) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", str(workers), "--folder", str(folder),
                           "--shard-rows", str(args.shard_rows), "--block-rows", str(args.block_rows)],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    if done.returncode:
        sys.exit(f"the {'in-process' if workers == 0 else 'cluster'} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def json_differences(a, b, path: str = "") -> list[str]:
    """Where two JSON values differ (numbers beyond 1e-9, NaN equal to NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [path]
        return [d for key in a for d in json_differences(a[key], b[key], f"{path}.{key}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [path]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in json_differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        same = (np.isnan(a) and np.isnan(b)) or abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
        return [] if same else [path]
    return [] if a == b else [path]


def longest_first(tasks: list[float], workers: int) -> float:
    """The makespan of ``tasks`` (seconds) on ``workers`` one-task-at-a-time workers, longest task first."""
    ends = [0.0] * workers
    for t in sorted(tasks, reverse=True):
        heapq.heapreplace(ends, ends[0] + t)
    return max(ends)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--classes", type=int, default=1_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shard-rows", type=int, default=50_000, help="gallery rows per partition")
    ap.add_argument("--block-rows", type=int, default=20_000, help="query rows per block (old and new stacked)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.folder, args.child, args.shard_rows, args.block_rows)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # the sources read only inside the data roots: the bench's folder is one, for the children and the workers
        os.environ["COMPATLAB_DATA_ROOTS"] = os.pathsep.join(filter(None, [os.environ.get("COMPATLAB_DATA_ROOTS"), tmp]))
        load = os.getloadavg()[0]
        start = time.perf_counter()
        specs = write_sources(folder, rows=args.rows, dim=args.dim, queries=args.queries, classes=args.classes,
                              seed=args.seed)
        t_write = time.perf_counter() - start
        (folder / "specs.json").write_text(json.dumps(specs))
        alone = _run_child(folder, 0, args)
        sharded = _run_child(folder, args.workers, args)
        a, b = np.load(folder / "lists-0.npz"), np.load(folder / f"lists-{args.workers}.npz")
        same = np.array_equal(a["ids"], b["ids"]) and np.array_equal(a["tied"], b["tied"])
        score_gap = float(np.max(np.abs(a["scores"].astype(np.float64) - b["scores"])))
    differ = json_differences(alone["json"], sharded["json"])
    tasks = sharded["tasks_s"]
    outside = sharded["wall_s"] - sharded["search_span_s"]
    print(f"old gallery {args.rows:,} x {args.dim} float32 (Parquet, row groups of {ROW_GROUP:,}), {args.queries:,} "
          f"queries per model ({2 * args.queries:,} searched), relevance labels ({args.classes:,} classes), "
          f"{os.cpu_count()} cores, load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(f"sources written in {t_write:.1f} s")
    print(f"in this process (baseline): {alone['wall_s']:.1f} s, peak RSS {alone['peak_mb']:,.0f} MB")
    print(f"LocalCluster({args.workers}): {sharded['wall_s']:.1f} s (+ {sharded['start_s']:.1f} s to start it), "
          f"{len(tasks)} tasks of {args.shard_rows:,} gallery rows x {min(args.block_rows, 2 * args.queries):,} queries, search span "
          f"{sharded['search_span_s']:.1f} s; peak RSS client {sharded['peak_mb']:,.0f} MB, workers "
          f"{', '.join(f'{m:,.0f}' for m in sharded['worker_peak_mb'])} MB")
    print(f"ratio baseline / cluster: {alone['wall_s'] / sharded['wall_s']:.2f}x; with the start: "
          f"{alone['wall_s'] / (sharded['wall_s'] + sharded['start_s']):.2f}x")
    print(f"same top-k ids and tie counts: {same}; largest score gap {score_gap:.1e} (within 1e-6: "
          f"{score_gap <= 1e-6}); JSON equal to 1e-9: {not differ}{'' if not differ else ' ' + ', '.join(differ[:5])}")
    print(f"measured task compute times: median {np.median(tasks):.1f} s, min {min(tasks):.1f} s, max {max(tasks):.1f} s,"
          f" sum {sum(tasks):.1f} s; outside the search {outside:.1f} s")
    print("projection from these measured numbers (outside the search + tasks longest first on W one-core workers; "
          "not measured on W machines):")
    for w in (1, 2, 4, 8, 16, 32):
        print(f"  W = {w:>2}: {outside + longest_first(tasks, w):7.1f} s")


if __name__ == "__main__":
    main()
