"""The old gallery's search on Dask against the same search in this process (issue 41).

Writes (seeded, in row groups, never one array in memory) a Parquet gallery of ``--items`` x ``--dim`` float32 vectors
and ``--queries`` queries, then times each query's top-``--k`` over the gallery read from the file:

1. in this process: :func:`engine.metrics.topk.stream_topk` over the source's blocks (what ``check-upgrade --old-gallery``
   does without ``--cluster``), the baseline;
2. on ``--cluster`` (default ``local:2``): :func:`engine.evaluate.dask_search.sharded_topk`, query blocks x gallery
   partitions, each task reading its own rows; the cluster's start is timed apart.

Prints both wall times, the ratio (baseline / Dask search, > 1: Dask is faster) and whether the two give the same ids
and tie counts (scores to 1e-6). On one machine the ratio is bounded by its cores: the point of the cluster is more
machines, which a single-machine run cannot show. Run: ``python bench/bench_dask_search.py --items 200000``.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from engine.core.cluster import parse_cluster
from engine.core.fan_out import FanOut
from engine.evaluate.dask_search import dask_client, sharded_topk
from engine.metrics.topk import stream_topk
from engine.sources import open_source
from engine.upgrade.from_sources import in_order

ROW_GROUP = 50_000


def write_gallery(path: Path, items: int, dim: int, seed: int) -> np.ndarray:
    """A Parquet file of ``items`` rows (id, vector), written a row group at a time; returns the ids in order."""
    rng = np.random.default_rng(seed)
    ids = np.arange(items, dtype=np.int64)
    schema = pa.schema([("id", pa.int64()), ("vector", pa.list_(pa.float32(), dim))])
    with pq.ParquetWriter(path, schema) as writer:
        for lo in range(0, items, ROW_GROUP):
            hi = min(items, lo + ROW_GROUP)
            vectors = rng.standard_normal((hi - lo, dim), dtype=np.float32)
            column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim)
            writer.write_table(pa.table({"id": ids[lo:hi], "vector": column}, schema=schema))
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=2_000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--cluster", default="local:2")
    ap.add_argument("--shard-rows", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    spec = parse_cluster(args.cluster)
    with tempfile.TemporaryDirectory() as tmp:
        # the sources read only inside the data roots: the bench's own folder is one, for it and the cluster's workers
        os.environ["COMPATLAB_DATA_ROOTS"] = os.pathsep.join(filter(None, [os.environ.get("COMPATLAB_DATA_ROOTS"), tmp]))
        path = Path(tmp) / "gallery.parquet"
        ids = write_gallery(path, args.items, args.dim, args.seed)
        queries = np.random.default_rng(args.seed + 1).standard_normal((args.queries, args.dim), dtype=np.float32)
        text = str(path)

        start = time.perf_counter()
        source = open_source(text, what="old gallery")
        try:
            alone = stream_topk(queries, in_order(source, ids, 65536), k=args.k)  # as check-upgrade streams it
        finally:
            source.close()
        t_alone = time.perf_counter() - start

        start = time.perf_counter()
        with dask_client(spec) as client:
            t_start = time.perf_counter() - start
            start = time.perf_counter()
            fan_out = FanOut(block_rows=max(1, args.queries), shard_rows=args.shard_rows)
            sharded = sharded_topk(client, text, "old gallery", ids, queries, k=args.k, fan_out=fan_out)
            t_dask = time.perf_counter() - start
    same = np.array_equal(alone.ids, sharded.ids) and np.array_equal(alone.tied_beyond, sharded.tied_beyond)
    close = np.allclose(alone.scores, sharded.scores, rtol=0, atol=1e-6)
    print(f"gallery {args.items:,} x {args.dim} (Parquet), {args.queries:,} queries, top-{args.k}, cluster {spec}")
    print(f"in this process (baseline): {t_alone:.2f} s")
    print(f"on Dask: {t_dask:.2f} s search (+ {t_start:.2f} s to start the cluster); "
          f"{-(-args.items // args.shard_rows)} partitions")
    print(f"ratio baseline / Dask search: {t_alone / t_dask:.2f}x; with the start: {t_alone / (t_dask + t_start):.2f}x")
    print(f"same ids and tie counts: {same}; scores within 1e-6: {close}")


if __name__ == "__main__":
    main()
