"""Benchmark: one retrieval cell (Recall@1/5, mAP@10, full mAP) with the gallery read as shards vs in one piece.

The gallery is written once as .npy shards (features, labels) in a temporary folder, then each variant runs in
its own process so that its peak memory (max RSS) is its own:
  single   reads every shard, concatenates them, engine.metrics.retrieval.retrieval_metrics
  sharded  engine.metrics.sharded.sharded_retrieval_metrics over a generator that reads one shard at a time
Both load the compiled kernels on a tiny cell before the clock starts; "growth" is the peak RSS minus the RSS
after that warm-up, i.e. what the evaluation itself added.

    python bench/bench_sharded.py                                   # 200,000 x 128 gallery, 10,000 queries
    python bench/bench_sharded.py --gallery 1000000 --shard 100000  # the issue's cell
    python bench/bench_sharded.py --gallery 50000 --queries 2000 --shard 8000   # quick run
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_cell(folder: Path, *, gallery: int, queries: int, dim: int, classes: int, shard: int, seed: int = 0) -> int:
    """Class centres + noise, written as shard_XXXX_{x,y}.npy and queries_{x,y}.npy; returns the number of shards."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)).astype(np.float32)
    for name, lo, hi in [("queries", 0, queries)] + [(f"shard_{i:04d}", a, min(a + shard, gallery)) for i, a in enumerate(range(0, gallery, shard))]:
        labels = rng.integers(0, classes, hi - lo)
        np.save(folder / f"{name}_x.npy", centres[labels] + 1.5 * rng.normal(size=(hi - lo, dim)).astype(np.float32))
        np.save(folder / f"{name}_y.npy", labels)
    return -(-gallery // shard)


def _shards(folder: Path, n: int):
    """A fresh generator over the shards on disk, one in memory at a time."""
    from engine.metrics.sharded import Shard

    start = 0
    for i in range(n):
        x, y = np.load(folder / f"shard_{i:04d}_x.npy"), np.load(folder / f"shard_{i:04d}_y.npy")
        yield Shard(x, y, np.arange(start, start + len(x)))
        start += len(x)


def _run(variant: str, folder: Path, n: int) -> dict:
    from engine.metrics.retrieval import retrieval_metrics
    from engine.metrics.sharded import Shard, sharded_retrieval_metrics

    kw = dict(ks=(1, 5), map_at=10)
    tiny = np.eye(4, 8, dtype=np.float32) + 0.1
    retrieval_metrics(tiny, np.arange(4) % 2, tiny, np.arange(4) % 2, **kw)
    sharded_retrieval_metrics(tiny, np.arange(4) % 2, [Shard(tiny, np.arange(4) % 2, np.arange(4))], **kw)
    q, ql = np.load(folder / "queries_x.npy"), np.load(folder / "queries_y.npy")
    before = _rss_mb()
    t0 = time.perf_counter()
    if variant == "single":
        parts = list(_shards(folder, n))
        g, gl = np.concatenate([p.features for p in parts]), np.concatenate([p.labels for p in parts])
        del parts
        m = retrieval_metrics(q, ql, g, gl, **kw)
    else:
        m = sharded_retrieval_metrics(q, ql, lambda: _shards(folder, n), **kw)
    return dict(variant=variant, seconds=time.perf_counter() - t0, before_mb=before, peak_mb=_rss_mb(), metrics=m)


def run(variant: str, folder: Path, n: int) -> dict:
    """One variant in a fresh process, so that its peak RSS is its own."""
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(_run, variant, folder, n).result()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gallery", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--shard", type=int, default=50_000, help="gallery items per shard (the last one may be smaller)")
    args = ap.parse_args()
    if min(args.gallery, args.queries, args.dim, args.classes, args.shard) < 1:
        ap.error("every size must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        n = write_cell(folder, gallery=args.gallery, queries=args.queries, dim=args.dim, classes=args.classes, shard=args.shard)
        gb = args.gallery * args.dim * 4 / 2**20
        print(f"cell: {args.queries:,} queries x {args.gallery:,} gallery items x {args.dim}-d ({gb:.0f} MB float32), "
              f"{n} shards of <= {args.shard:,}")
        res = {v: run(v, folder, n) for v in ("single", "sharded")}
    for v, r in res.items():
        print(f"{v:8s} {r['seconds']:8.2f} s   peak RSS {r['peak_mb']:7.0f} MB   growth {r['peak_mb'] - r['before_mb']:7.0f} MB")
    print(f"time ratio sharded / single: {res['sharded']['seconds'] / res['single']['seconds']:.2f}")
    a, b = res["single"]["metrics"], res["sharded"]["metrics"]
    diff = max(abs(a[k] - b[k]) for k in a)
    print(f"metrics: {a}\nlargest difference sharded vs single: {diff:.3g} (0 unless float32 rounding moves a near-tie)")


if __name__ == "__main__":
    main()
