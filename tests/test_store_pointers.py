"""storage.featurestore: a feature set's pointer reaches only the configured store (issue 24, items 6 and 9).

A row planted by someone who shares the database (a ``..`` key, another host, another bucket, a symlink out of the
store) is refused with one line when read and deletes nothing when its set is replaced or its experiment deleted;
only persistent stores are accepted, an S3 bucket must exist, and an unusable store is one line (exit 2 on the CLI).
"""
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select, update

import storage.featurestore as featurestore
from storage import (
    FeatureSet,
    delete_experiment,
    get_engine,
    init_db,
    load_feature_set,
    save_feature_set,
    session_scope,
)
from support.featurestore import arrays, new_version, s3_root  # noqa: F401  (s3_root: moto's S3 on 127.0.0.1)

REPO = Path(__file__).resolve().parents[1]


def stored(engine) -> tuple[int, str]:
    """A model version with one stored set; ``(version, key)``."""
    version = new_version(engine)
    with session_scope(engine) as s:
        save_feature_set(s, version, "gallery", "encoder", *arrays(5))
    with session_scope(engine) as s:
        return version, s.scalar(select(FeatureSet.store_key).where(FeatureSet.model_version_id == version))


def plant(engine, version: int, **values) -> None:
    """Rewrite the set's pointer columns, as a second machine sharing the database could."""
    with session_scope(engine) as s:
        s.execute(update(FeatureSet).where(FeatureSet.model_version_id == version).values(**values))


def experiment_of(engine, version: int) -> int:
    from storage import ModelVersion

    with session_scope(engine) as s:
        return s.get(ModelVersion, version).experiment_id


def sentinel(tmp_path: Path) -> Path:
    """A folder outside the store holding one file, which no deletion may touch."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    return outside


def one_line_error(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and message
    return message


@pytest.mark.parametrize("key", ["mv1/gallery/../../../outside", "../outside", "mv1/../../outside/x"])
@pytest.mark.parametrize("how", ["replace", "delete experiment"])
def test_a_dotdot_key_deletes_nothing_outside_the_store(engine, tmp_path, key, how):
    outside = sentinel(tmp_path)
    version, real_key = stored(engine)
    assert (tmp_path / "features" / real_key).is_dir()
    assert os.path.realpath(tmp_path / "features" / "mv1/gallery/../../../outside") == str(outside)  # it would reach it
    plant(engine, version, store_key=key)
    with session_scope(engine) as s:
        if how == "replace":
            save_feature_set(s, version, "gallery", "encoder", *arrays(3, seed=1))
        else:
            assert delete_experiment(s, experiment_of(engine, version))
    assert (outside / "keep.txt").read_text() == "keep"


@pytest.mark.parametrize("key", ["mv1/gallery/../../../outside", "/etc", "mv1/gallery/s3://other", "mv1\\..\\x/a/b"])
def test_a_key_the_store_never_writes_is_refused_with_one_line(engine, tmp_path, key):
    version, _ = stored(engine)
    plant(engine, version, store_key=key)
    with session_scope(engine) as s:
        assert "no '..'" in one_line_error(lambda: load_feature_set(s, version, "gallery", "encoder"))


def test_a_set_folder_symlinked_out_of_the_store_is_neither_read_nor_deleted(engine, tmp_path):
    outside = sentinel(tmp_path)
    version, key = stored(engine)
    folder = tmp_path / "features" / key
    for file in folder.iterdir():
        (outside / file.name).write_bytes(file.read_bytes())  # the same set, outside the store
        file.unlink()
    folder.rmdir()
    folder.symlink_to(outside, target_is_directory=True)
    with session_scope(engine) as s:
        assert "resolves outside the store" in one_line_error(lambda: load_feature_set(s, version, "gallery", "encoder"))
    with session_scope(engine) as s:
        assert delete_experiment(s, experiment_of(engine, version))
    assert (outside / "keep.txt").read_text() == "keep" and (outside / "shard-00000.npy").is_file()


@pytest.mark.parametrize("file", ["../../../outside/keep.txt", "/etc/passwd", "sub/shard.npy"])
def test_a_layout_file_name_with_a_path_is_not_followed(engine, tmp_path, file):
    sentinel(tmp_path)
    version, _ = stored(engine)
    with session_scope(engine) as s:
        layout = s.scalar(select(FeatureSet.store_layout).where(FeatureSet.model_version_id == version))
    plant(engine, version, store_layout={**layout, "shards": [{**layout["shards"][0], "file": file}]})
    with session_scope(engine) as s:
        message = one_line_error(lambda: load_feature_set(s, version, "gallery", "encoder"))
    assert "not a plain .npy or .parquet name" in message and "keep" not in message.replace("keep.txt", "")


def test_a_shard_replaced_by_another_file_is_refused_without_quoting_it(engine, tmp_path):
    version, key = stored(engine)
    shard = tmp_path / "features" / key / "shard-00000.npy"
    shard.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with session_scope(engine) as s:
        message = one_line_error(lambda: load_feature_set(s, version, "gallery", "encoder"))
    assert "the file was replaced" in message and "root:x" not in message and "/bin/bash" not in message


def listening_socket() -> socket.socket:
    """A listener on 127.0.0.1 in this helper's port range (8660-8669) that records any connection in its backlog."""
    for port in range(8660, 8670):
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        sock.listen(8)
        sock.setblocking(False)
        return sock
    pytest.skip("no free port in 8660-8669")


def connections(sock: socket.socket) -> int:
    """Connections made to ``sock`` so far (a completed TCP handshake waits in the backlog until accepted)."""
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def test_an_http_pointer_is_refused_without_any_connection(engine, tmp_path):
    listener = listening_socket()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/features"
        with socket.create_connection(listener.getsockname()):  # the probe itself works: it does see a connection
            pass
        assert connections(listener) == 1
        version, key = stored(engine)
        plant(engine, version, store_uri=url)
        with session_scope(engine) as s:
            message = one_line_error(lambda: load_feature_set(s, version, "gallery", "encoder"))
        assert "not at the configured store" in message
        with session_scope(engine) as s:  # replacing it: the old pointer's files are not looked for either
            save_feature_set(s, version, "gallery", "encoder", *arrays(2, seed=4))
        assert connections(listener) == 0
    finally:
        listener.close()


def test_a_non_persistent_or_remote_http_store_is_refused_before_writing(engine, tmp_path, monkeypatch):
    version = new_version(engine)
    for uri in ("memory://features", "http://127.0.0.1:8660/features", "ftp://127.0.0.1/features"):
        monkeypatch.setenv(featurestore.STORE_ENV, uri)
        with session_scope(engine) as s:
            message = one_line_error(lambda: save_feature_set(s, version, "gallery", "encoder", *arrays(2)))
            assert "not a persistent store" in message
            assert "not a persistent store" in one_line_error(lambda: featurestore.check_store(s))
    with session_scope(engine) as s:
        assert s.scalar(select(FeatureSet.id)) is None  # nothing written


def test_a_set_in_another_local_store_is_refused(engine, tmp_path, monkeypatch):
    version, _ = stored(engine)
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv(featurestore.STORE_ENV, str(other))
    with session_scope(engine) as s:
        message = one_line_error(lambda: load_feature_set(s, version, "gallery", "encoder"))
    assert "not at the configured store" in message and str(other) in message


def test_an_unusable_local_store_is_one_line_and_exit_2_on_the_command_line(tmp_path):
    folder = tmp_path / "steps"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for t in (1, 2):
        np.savez(folder / f"step_{t}.npz", query_features=rng.standard_normal((6, 4)).astype(np.float32),
                 query_labels=np.arange(6) % 3, gallery_features=rng.standard_normal((6, 4)).astype(np.float32),
                 gallery_labels=np.arange(6) % 3)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    db = tmp_path / "lab.db"
    for store in (str(blocker / "features"), "memory://features"):
        env = {**os.environ, "PYTHONPATH": str(REPO), featurestore.STORE_ENV: store, "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-m", "engine", "evaluate", "--features", str(folder), "--db",
                               f"sqlite:///{db}"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: feature store"), done.stderr
    with session_scope(get_engine(f"sqlite:///{db}")) as s:
        init_db(s.get_bind())
        assert s.scalar(select(FeatureSet.id)) is None  # nothing written


# --- S3 (moto) ----------------------------------------------------------------------------------


def test_a_misspelt_bucket_is_refused_and_not_created(engine, s3_root, monkeypatch):  # noqa: F811 (the fixture)
    import boto3

    monkeypatch.setenv(featurestore.STORE_ENV, "s3://lba/features")
    version = new_version(engine)
    with session_scope(engine) as s:
        message = one_line_error(lambda: save_feature_set(s, version, "gallery", "encoder", *arrays(2)))
    assert "bucket 'lba' does not exist" in message
    endpoint = s3_root.client_kwargs.get("endpoint_url") or s3_root.endpoint_url
    names = [b["Name"] for b in boto3.client("s3", endpoint_url=endpoint).list_buckets()["Buckets"]]
    assert names == ["lab"]


def test_another_bucket_and_a_dotdot_key_are_refused_on_s3(engine, s3_root):  # noqa: F811 (the fixture)
    import boto3

    endpoint = s3_root.client_kwargs.get("endpoint_url") or s3_root.endpoint_url
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="other")
    client.put_object(Bucket="other", Key="features/keep.txt", Body=b"keep")
    version, key = stored(engine)
    plant(engine, version, store_uri="s3://other/features")
    with session_scope(engine) as s:
        assert "not at the configured store" in one_line_error(lambda: load_feature_set(s, version, "gallery", "encoder"))
    plant(engine, version, store_uri="s3://lab/features", store_key="mv1/gallery/../../../other/features")
    with session_scope(engine) as s:
        assert "no '..'" in one_line_error(lambda: load_feature_set(s, version, "gallery", "encoder"))
        assert delete_experiment(s, experiment_of(engine, version))
    assert client.get_object(Bucket="other", Key="features/keep.txt")["Body"].read() == b"keep"


def test_a_folder_swapped_for_a_symlink_after_the_check_leads_no_deletion_out(engine, tmp_path):
    outside = sentinel(tmp_path)
    version, key = stored(engine)
    model_folder = tmp_path / "features" / key.split("/")[0]
    (outside / key.split("/", 1)[1]).mkdir(parents=True)  # outside/gallery/<token>, as the key continues
    (outside / key.split("/", 1)[1] / "keep.txt").write_text("keep")
    with session_scope(engine) as s:
        assert delete_experiment(s, experiment_of(engine, version))  # checked now, deleted at commit
        model_folder.rename(tmp_path / "moved")
        model_folder.symlink_to(outside, target_is_directory=True)  # mv<id> now leads out of the store
    assert (outside / key.split("/", 1)[1] / "keep.txt").read_text() == "keep"
    assert (outside / "keep.txt").read_text() == "keep"
