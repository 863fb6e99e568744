"""storage.featurestore: shards + Parquet under a root, pointer in SQL, atomic writes, old blob rows, S3 (moto)."""
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

import storage.featurestore as featurestore
from storage import (
    FeatureSet,
    add_model_version,
    copy_feature_sets,
    create_experiment,
    delete_experiment,
    feature_set_rows,
    get_engine,
    init_db,
    iter_feature_shards,
    load_feature_set,
    load_image_refs,
    save_feature_set,
    session_scope,
)
from storage.migrate import add_missing_columns
from support.featurestore import arrays, new_version, s3_root  # noqa: F401 (fixtures among them)

REPO = Path(__file__).resolve().parents[1]






def pointer_row(engine, version: int, split: str = "gallery", view: str = "encoder"):
    with session_scope(engine) as s:
        return s.execute(select(FeatureSet.store_uri, FeatureSet.store_key, FeatureSet.store_layout,
                                FeatureSet.features).where(FeatureSet.model_version_id == version,
                                                           FeatureSet.split == split, FeatureSet.view == view)).first()


def visible_sets(root: Path) -> list[Path]:
    """Complete set folders under the root's keys (``mv*/split/token``); staging folders excluded."""
    return sorted(p for p in root.glob("mv*/*/*") if p.is_dir())


@pytest.fixture
def small_shards(monkeypatch):
    monkeypatch.setattr(featurestore, "SHARD_BYTES", 4 * 3 * 4)  # 4 rows of 3 float32 per shard


@pytest.mark.both_databases
def test_a_set_round_trips_through_shards_and_sql_keeps_only_the_pointer(engine, tmp_path, monkeypatch,
                                                                         small_shards, db_backend):
    if db_backend == "postgresql":  # no file beside PostgreSQL: name the root
        monkeypatch.setenv(featurestore.STORE_ENV, str(tmp_path / "store"))
    root = tmp_path / ("store" if db_backend == "postgresql" else "features")
    version = new_version(engine)
    features, labels, ids = arrays(10)
    with session_scope(engine) as s:
        save_feature_set(s, version, "gallery", "encoder", features, labels, ids, {"dataset": "digits"})
    row = pointer_row(engine, version)
    assert row.features.shape == (0, 3) and row.store_layout["shape"] == [10, 3]
    assert [sh["rows"] for sh in row.store_layout["shards"]] == [4, 4, 2]
    folder = root / row.store_key
    assert sorted(p.name for p in folder.iterdir()) == ["rows.parquet", "shard-00000.npy", "shard-00001.npy",
                                                      "shard-00002.npy"]
    np.testing.assert_array_equal(np.load(folder / "shard-00002.npy"), features[8:])
    with session_scope(engine) as s:
        got = load_feature_set(s, version, "gallery", "encoder")
        pieces = list(iter_feature_shards(s, version, "gallery", "encoder"))
        assert load_image_refs(s, version, "gallery")[1].tolist() == ids.tolist()
    assert got[0].dtype == np.float32 and got[0].tobytes() == features.tobytes()
    assert got[1].dtype == labels.dtype and got[1].tolist() == labels.tolist() and got[2].tolist() == ids.tolist()
    assert [p.ids.tolist() for p in pieces] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    np.testing.assert_array_equal(np.concatenate([p.features for p in pieces]), features)
    assert np.concatenate([p.labels for p in pieces]).tolist() == labels.tolist()


def test_shards_feed_the_sharded_metrics_like_the_whole_gallery(engine, small_shards):
    from engine.metrics.retrieval import retrieval_metrics
    from engine.metrics.sharded import sharded_retrieval_metrics

    version = new_version(engine)
    gallery, labels, _ = arrays(11, seed=1)
    query, qlabels, _ = arrays(5, seed=2)
    with session_scope(engine) as s:
        save_feature_set(s, version, "gallery", "encoder", gallery, labels)
    with session_scope(engine) as s:
        pieces = list(iter_feature_shards(s, version, "gallery", "encoder"))
    sharded = sharded_retrieval_metrics(query, qlabels, pieces, ks=(1, 3))
    whole = retrieval_metrics(query, qlabels, gallery, labels, ks=(1, 3))
    assert sharded == pytest.approx(whole)


def test_a_row_range_reads_the_same_rows_from_the_store_and_from_an_in_memory_blob(engine, small_shards, tmp_path):
    gallery, labels, _ = arrays(11, seed=3)
    memory = get_engine("sqlite://")  # an in-memory database keeps blobs (no folder beside it)
    init_db(memory)
    for db in (engine, memory):
        version = new_version(db)
        with session_scope(db) as s:
            save_feature_set(s, version, "gallery", "encoder", gallery, labels)
            fid = s.scalar(select(FeatureSet.id).where(FeatureSet.model_version_id == version))
        with session_scope(db) as s:
            for lo, hi in ((0, 11), (3, 9), (4, 8), (10, 11), (5, 5), (9, 20)):  # shards hold 4 rows: 0-3, 4-7, 8-10
                rows, row_labels = feature_set_rows(s, fid, lo, hi)
                np.testing.assert_array_equal(rows, gallery[lo:hi])
                np.testing.assert_array_equal(row_labels, labels[lo:hi])
            with pytest.raises(ValueError, match="no feature set 999"):
                feature_set_rows(s, 999, 0, 1)
    assert pointer_row(engine, 1).store_key is not None


def test_a_write_that_fails_midway_leaves_nothing_visible_and_the_old_set_intact(engine, tmp_path, monkeypatch,
                                                                                 small_shards):
    version = new_version(engine)
    old = arrays(6)
    with session_scope(engine) as s:
        save_feature_set(s, version, "gallery", "encoder", *old)
    before = visible_sets(tmp_path / "features")
    real, calls = featurestore._write_npy, []

    def disk_full_on_second_shard(fs, path, array):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(fs, path, array)

    monkeypatch.setattr(featurestore, "_write_npy", disk_full_on_second_shard)
    with pytest.raises(ValueError, match=r"cannot be written \(disk full\)"):
        with session_scope(engine) as s:
            save_feature_set(s, version, "gallery", "encoder", *arrays(9, seed=3))
    assert len(calls) == 2 and visible_sets(tmp_path / "features") == before
    assert not list((tmp_path / "features").glob(".tmp-*"))  # the staging folder was removed too
    with session_scope(engine) as s:
        assert load_feature_set(s, version, "gallery", "encoder")[0].tobytes() == old[0].tobytes()


def test_a_rollback_after_the_files_were_written_deletes_them_and_a_commit_deletes_the_replaced_set(engine, tmp_path):
    version = new_version(engine)
    with session_scope(engine) as s:
        save_feature_set(s, version, "gallery", "encoder", *arrays(6))
    first = visible_sets(tmp_path / "features")
    with pytest.raises(RuntimeError, match="worker killed"):
        with session_scope(engine) as s:
            save_feature_set(s, version, "gallery", "encoder", *arrays(6, seed=4))
            assert len(visible_sets(tmp_path / "features")) == 2  # written, not yet pointed at
            raise RuntimeError("worker killed")
    assert visible_sets(tmp_path / "features") == first
    with session_scope(engine) as s:
        save_feature_set(s, version, "gallery", "encoder", *arrays(6, seed=5))
    second = visible_sets(tmp_path / "features")
    assert len(second) == 1 and second != first and second[0].name == pointer_row(engine, version).store_key[-32:]
    with session_scope(engine) as s:
        delete_experiment(s, 1)
    assert visible_sets(tmp_path / "features") == []


KILLER = """
import os, signal, sys
import numpy as np
import storage.featurestore as fst
from storage import get_engine, save_feature_set, session_scope
fst.SHARD_BYTES = 12
real = fst._write_npy
def write_then_die(fs, path, array):
    if path.endswith("shard-00002.npy"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(fs, path, array)
fst._write_npy = write_then_die
with session_scope(get_engine(sys.argv[1])) as s:
    save_feature_set(s, int(sys.argv[2]), "gallery", "encoder", np.ones((5, 3), np.float32), np.arange(5))
"""


def test_a_killed_writer_leaves_no_visible_shard_and_no_dangling_pointer(engine, db_url, tmp_path):
    version = new_version(engine)
    old = arrays(4)
    with session_scope(engine) as s:
        save_feature_set(s, version, "gallery", "encoder", *old)
    before = visible_sets(tmp_path / "features")
    done = subprocess.run([sys.executable, "-c", KILLER, db_url, str(version)], cwd=REPO, capture_output=True)
    assert done.returncode == -9, done.stderr.decode()
    assert visible_sets(tmp_path / "features") == before  # only an unreferenced .tmp-* folder may remain
    assert len(list((tmp_path / "features").glob(".tmp-*/shard-*.npy"))) == 2
    with session_scope(engine) as s:
        assert load_feature_set(s, version, "gallery", "encoder")[0].tobytes() == old[0].tobytes()


def test_a_changed_shard_is_refused_with_one_line(engine, tmp_path, small_shards):
    version = new_version(engine)
    with session_scope(engine) as s:
        save_feature_set(s, version, "gallery", "encoder", *arrays(6))
    shard = tmp_path / "features" / pointer_row(engine, version).store_key / "shard-00001.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with session_scope(engine) as s:
        with pytest.raises(ValueError, match="shard-00001.npy does not match its sha256"):
            load_feature_set(s, version, "gallery", "encoder")
    shard.unlink()
    with session_scope(engine) as s:
        pieces = iter_feature_shards(s, version, "gallery", "encoder")
        assert next(pieces).features.shape == (4, 3)  # the first shard is intact
        with pytest.raises(ValueError, match="shard-00001.npy is missing"):
            next(pieces)


def test_float16_is_opt_in_and_reads_back_as_float32(engine, tmp_path, monkeypatch):
    monkeypatch.setenv(featurestore.DTYPE_ENV, "float16")
    version = new_version(engine)
    features, labels, _ = arrays(5)
    with session_scope(engine) as s:
        save_feature_set(s, version, "query", "encoder", features, labels)
        got = load_feature_set(s, version, "query", "encoder")[0]
    row = pointer_row(engine, version, "query")
    assert row.store_layout["dtype"] == "<f2"
    assert np.load(tmp_path / "features" / row.store_key / "shard-00000.npy").dtype == np.float16
    assert got.dtype == np.float32 and got.tolist() == features.astype(np.float16).astype(np.float32).tolist()
    monkeypatch.setenv(featurestore.DTYPE_ENV, "int8")
    with session_scope(engine) as s:
        with pytest.raises(ValueError, match="must be empty .* or 'float16'"):
            save_feature_set(s, version, "query", "encoder", features, labels)


def test_a_database_written_before_the_store_reads_its_blobs_and_writes_new_sets_to_the_store(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    db = get_engine(f"sqlite:///{path}")
    init_db(db)
    version = new_version(db)
    old = arrays(3)
    monkeypatch.setattr(featurestore, "store_uri", lambda session: None)  # the blob path, as before the store
    with session_scope(db) as s:
        save_feature_set(s, version, "gallery", "encoder", *old, {"dataset": "digits"})
    monkeypatch.undo()
    db.dispose()
    with sqlite3.connect(path) as con:  # the schema as it was before the store
        for column in ("store_uri", "store_key", "store_layout"):
            con.execute(f"ALTER TABLE feature_sets DROP COLUMN {column}")
    db = get_engine(f"sqlite:///{path}")
    assert add_missing_columns(db) == ["feature_sets.store_uri", "feature_sets.store_key", "feature_sets.store_layout"]
    target = new_version_in(db)
    with session_scope(db) as s:
        features, labels, ids = load_feature_set(s, version, "gallery", "encoder")
        assert load_image_refs(s, version, "gallery")[1].tolist() == old[2].tolist()
        assert [p.ids.tolist() for p in iter_feature_shards(s, version, "gallery", "encoder")] == [[0, 1, 2]]
        copy_feature_sets(s, version, target, ["encoder"])
    assert features.tobytes() == old[0].tobytes() and labels.tolist() == old[1].tolist()
    assert pointer_row(db, version).store_key is None  # the old row is not rewritten
    assert pointer_row(db, target).store_uri == "features"  # the copy went to the store beside the file
    with session_scope(db) as s:
        assert load_feature_set(s, target, "gallery", "encoder")[0].tobytes() == old[0].tobytes()
    db.dispose()


def new_version_in(db) -> int:
    with session_scope(db) as s:
        exp = create_experiment(s, name="copy", method="bct", config={}, config_hash="h2").id
        return add_model_version(s, exp, 1, architecture="a", method="bct", classes=[0], num_outputs=1,
                                 feature_dim=3).id


def test_an_in_memory_database_keeps_blobs_and_a_relative_root_needs_a_sqlite_file(tmp_path):
    db = get_engine("sqlite://")
    init_db(db)
    version = new_version(db)
    with session_scope(db) as s:
        save_feature_set(s, version, "gallery", "encoder", *arrays(2))
        assert featurestore.store_uri(s) is None
        with pytest.raises(ValueError, match="relative to a SQLite file's folder"):
            featurestore.read(s, featurestore.Pointer("features", "mv1/gallery/x", {}))
    assert pointer_row(db, version).store_key is None


# --- S3 (moto's server on 127.0.0.1) ----------------------------------------------------------




@pytest.mark.both_databases
def test_the_s3_store_round_trips_and_deletes_replaced_sets(engine, s3_root, small_shards):  # noqa: F811
    version = new_version(engine)
    features, labels, ids = arrays(9)
    with session_scope(engine) as s:
        save_feature_set(s, version, "gallery", "encoder", features, labels, ids)
    first = pointer_row(engine, version)
    assert first.store_uri == "s3://lab/features"
    assert sorted(os.path.basename(p) for p in s3_root.ls(f"lab/features/{first.store_key}")) == [
        "rows.parquet", "shard-00000.npy", "shard-00001.npy", "shard-00002.npy"]
    with session_scope(engine) as s:
        got = load_feature_set(s, version, "gallery", "encoder")
        pieces = list(iter_feature_shards(s, version, "gallery", "encoder"))
    assert got[0].tobytes() == features.tobytes() and got[2].tolist() == ids.tolist()
    assert [len(p.ids) for p in pieces] == [4, 4, 1]
    with session_scope(engine) as s:
        save_feature_set(s, version, "gallery", "encoder", *arrays(2, seed=7))
    s3_root.invalidate_cache()
    assert not s3_root.exists(f"lab/features/{first.store_key}/rows.parquet")
