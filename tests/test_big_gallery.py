"""A gallery larger than one SQL value can hold, written to the file store and evaluated with bounded memory.

SQLite refuses a value over SQLITE_MAX_LENGTH (10**9 bytes by default) and PostgreSQL one over 1 GiB, so the
old one-blob row topped out below 2**30 bytes: 300,000 x 1024 float32 is 1.23e9 bytes. The gallery is
generated chunk by chunk into a memory-mapped file (``save_feature_set`` takes one array: a memmap never
holds the whole set in anonymous memory), then a separate process evaluates it shard by shard through
``iter_feature_shards`` + ``sharded_retrieval_metrics`` and reports its peak RSS growth (VmHWM, reset after the
imports and a warm-up), which must stay under a few 64 MiB store shards (about 280 MB measured).

The answer is known by construction: query ``j`` has one positive, a noisy copy (cosine ~0.89), and
``j % 7`` decoys of other classes closer to it (cosine ~0.995); the rest of the gallery is random directions
(|cosine| < 0.2 at 1024-d). So the positive ranks ``j % 7 + 1``: AP = 1 / rank, Recall@k = rank <= k.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import storage.featurestore as featurestore
from storage import FeatureSet, add_model_version, create_experiment, get_engine, init_db, save_feature_set, session_scope

pytestmark = pytest.mark.slow

ROWS, DIM, QUERIES, DECOYS, CHUNK = 300_000, 1024, 100, 7, 20_000
ONE_VALUE_CAP = min(10**9, 2**30)  # SQLite's default SQLITE_MAX_LENGTH, PostgreSQL's largest field

EVALUATE = """
import json, sys
import numpy as np
import pyarrow.parquet  # the store's row reader, imported before measuring
from engine.metrics.sharded import Shard, sharded_retrieval_metrics
from storage import get_engine, iter_feature_shards, session_scope

def kib(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":"))

url, mv, query_path = sys.argv[1:]
q, ql = np.load(query_path + ".q.npy"), np.load(query_path + ".ql.npy")
tiny = [Shard(q[:5], ql[:5], np.arange(5))]
sharded_retrieval_metrics(q, ql, tiny, ks=(1, 5), map_at=10)  # compile the kernels before measuring
db = get_engine(url)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current RSS
before = kib("VmRSS")
with session_scope(db) as s:
    metrics = sharded_retrieval_metrics(q, ql, lambda: iter_feature_shards(s, int(mv), "gallery", "encoder"),
                                        ks=(1, 5), map_at=10)
print(json.dumps({"metrics": metrics, "growth_bytes": (kib("VmHWM") - before) * 1024}))
"""


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIM), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _planted(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Write the gallery chunk by chunk into a memmap; return it, its labels, the queries and their labels."""
    rng = np.random.default_rng(0)
    q = _unit(rng, QUERIES)
    rows = rng.choice(ROWS, QUERIES * DECOYS, replace=False).reshape(QUERIES, DECOYS)  # column 0: the positive
    planted = {}
    for j in range(QUERIES):
        planted[rows[j, 0]] = q[j] + 0.5 * _unit(rng, 1)[0]
        for r in rows[j, 1: 1 + j % DECOYS]:
            planted[r] = q[j] + 0.1 * _unit(rng, 1)[0]
    gallery = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(ROWS, DIM))
    for lo in range(0, ROWS, CHUNK):
        gallery[lo: lo + CHUNK] = rng.standard_normal((min(CHUNK, ROWS - lo), DIM), dtype=np.float32)
        for r in (r for r in planted if lo <= r < lo + CHUNK):
            gallery[r] = planted[r]
    gallery.flush()
    return gallery, np.arange(ROWS, dtype=np.int64), q, rows[:, 0].astype(np.int64)  # every item its own class


def test_a_gallery_over_the_one_blob_ceiling_is_evaluated_shard_by_shard_in_bounded_memory(tmp_path):
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    db = get_engine(url)
    init_db(db)
    gallery, labels, q, ql = _planted(tmp_path / "gallery.npy")
    with session_scope(db) as s:
        exp = create_experiment(s, name="big", method="none", config={}, config_hash="h")
        mv = add_model_version(s, exp.id, 1, architecture="x", method="none", classes=[0], num_outputs=1, feature_dim=DIM)
        fid = save_feature_set(s, mv.id, "gallery", "encoder", gallery, labels)
    del gallery
    (tmp_path / "gallery.npy").unlink()
    with session_scope(db) as s:
        row = s.get(FeatureSet, fid)
        assert row.store_key is not None and row.features.size == 0  # SQL holds a pointer, not the array
        assert (row.count, row.dim) == (ROWS, DIM)
    stored = sum(f.stat().st_size for f in (tmp_path / "features").rglob("shard-*.npy"))
    assert stored > ROWS * DIM * 4 > ONE_VALUE_CAP  # more than one SQL value could hold
    np.save(tmp_path / "q.q.npy", q)
    np.save(tmp_path / "q.ql.npy", ql)

    done = subprocess.run([sys.executable, "-c", EVALUATE, url, str(mv.id), str(tmp_path / "q")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])

    rank = np.arange(QUERIES) % DECOYS + 1  # the decoys, then the positive
    got = report["metrics"]
    assert got["recall@1"] == pytest.approx(np.mean(rank <= 1), abs=1e-12)
    assert got["recall@5"] == pytest.approx(np.mean(rank <= 5), abs=1e-12)
    assert got["map"] == pytest.approx(np.mean(1 / rank), abs=1e-9)
    assert got["map@10"] == pytest.approx(np.mean(1 / rank), abs=1e-9)
    assert got["n_valid"] == QUERIES
    print(f"gallery {stored / 1e9:.2f} GB in the store, evaluator peak RSS growth {report['growth_bytes'] / 1e6:.0f} MB")
    assert report["growth_bytes"] < 6 * featurestore.SHARD_BYTES < stored / 3  # a few shards, not the gallery
