"""Benchmark: write and read throughput of the feature store against the old blob-in-SQL path, same run.

One synthetic set (float32 features, int64 labels and image ids) is saved and loaded through
``storage.save_feature_set`` / ``load_feature_set`` on a fresh SQLite file, once with the store (the default:
``features/`` beside the file) and once as a blob (the path databases used before the store), then read shard by
shard with ``iter_feature_shards``. Each timing is the best of ``--repeat`` runs; ratios are store / blob
throughput (> 1: the store is faster). The blob path is capped near 1 GB per value by SQLite and PostgreSQL.

    python bench/bench_store.py                          # 200,000 x 512 float32 (410 MB)
    python bench/bench_store.py --rows 50000 --dim 256   # quick run
"""
from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np

import storage.featurestore as featurestore
from storage import (add_model_version, create_experiment, get_engine, init_db, iter_feature_shards,
                     load_feature_set, save_feature_set, session_scope)


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The shortest wall time of ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(folder: Path, features: np.ndarray, labels: np.ndarray, ids: np.ndarray, *, blob: bool,
            repeat: int) -> dict[str, float]:
    """Seconds to save, load and iterate the set on a fresh SQLite database in ``folder``."""
    db = get_engine(f"sqlite:///{folder / 'bench.db'}")
    init_db(db)
    with session_scope(db) as s:
        exp = create_experiment(s, name="bench", method="m", config={}, config_hash="h").id
        version = add_model_version(s, exp, 1, architecture="a", method="m", classes=[0], num_outputs=1,
                                    feature_dim=features.shape[1]).id

    def save() -> None:
        with session_scope(db) as s:
            save_feature_set(s, version, "gallery", "encoder", features, labels, ids)

    def load() -> None:
        with session_scope(db) as s:
            load_feature_set(s, version, "gallery", "encoder")

    def iterate() -> None:
        with session_scope(db) as s:
            for _ in iter_feature_shards(s, version, "gallery", "encoder"):
                pass

    with mock.patch.object(featurestore, "store_uri", lambda session: None) if blob else contextlib.nullcontext():
        times = {"write": best_of(repeat, save), "read": best_of(repeat, load), "shards": best_of(repeat, iterate)}
    db.dispose()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    features = rng.standard_normal((args.rows, args.dim), dtype=np.float32)
    labels, ids = rng.integers(0, 1000, args.rows), np.arange(args.rows, dtype=np.int64)
    mb = features.nbytes / 2**20
    print(f"{args.rows:,} x {args.dim} float32 = {mb:,.0f} MiB, best of {args.repeat}, SQLite file")
    results = {}
    for name, blob in (("blob", True), ("store", False)):
        with tempfile.TemporaryDirectory() as tmp:
            results[name] = measure(Path(tmp), features, labels, ids, blob=blob, repeat=args.repeat)
    print(f"{'':8}{'blob MiB/s':>12}{'store MiB/s':>13}{'store/blob':>12}")
    for what in ("write", "read", "shards"):
        blob_rate, store_rate = mb / results["blob"][what], mb / results["store"][what]
        print(f"{what:8}{blob_rate:12,.0f}{store_rate:13,.0f}{store_rate / blob_rate:11.2f}x")


if __name__ == "__main__":
    main()
