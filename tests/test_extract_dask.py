"""engine.checkpoints.extract_dask: one checkpoint's embedding of an image set as feature-store parts (in this process,
on an in-process Dask client, on a LocalCluster of 2 worker processes) equals the single-process extraction (uneven
parts), labels and image ids included; a failed or cancelled run leaves no part file and no row; bad inputs are
one-line errors before anything is written; the ``extract`` command."""
import hashlib
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select
from support.checkpoints_factory import save_state_dict_pt, write_image_folder

import engine.checkpoints.extract_dask as extract_dask
from engine.checkpoints.compare import compare_checkpoints
from engine.checkpoints.extract_dask import extract_on_dask
from engine.cli import main
from engine.core.cluster import LOCAL, ClusterSpec
from engine.core.signals import Cancelled
from engine.evaluate.dask_search import dask_client
from storage import (FeatureSet, add_model_version, create_experiment, feature_set_fingerprint, load_feature_set,
                     load_image_refs, session_scope)
from storage.featurestore import STORE_ENV

distributed = pytest.importorskip("distributed")
CLASSES, PER_CLASS = 3, 10  # 30 images; 7 rows per part: parts of 7, 7, 7, 7 and 2


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "store"))
    return tmp_path / "store"


@pytest.fixture
def inputs(tmp_path):
    images = write_image_folder(tmp_path / "imgs", classes=CLASSES, per_class=PER_CLASS)
    save_state_dict_pt(tmp_path / "m.pt", num_classes=CLASSES, width=8)
    model = {"path": str(tmp_path / "m.pt"), "arch": "small_cnn", "preprocessing": {"input_size": 16}}
    return model, f"imagefolder:{images}"


@pytest.fixture
def inproc():
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as client:
        yield client


def _model_version(engine) -> int:
    with session_scope(engine) as s:
        exp = create_experiment(s, name="x", method="none", config={}, config_hash="h")
        return add_model_version(s, exp.id, 1, architecture="small_cnn", method="none", classes=list(range(CLASSES)),
                                 num_outputs=CLASSES, feature_dim=8).id


def _feature_count(engine) -> int:
    with session_scope(engine) as s:
        return s.scalar(select(func.count()).select_from(FeatureSet))


def _files(store: Path) -> list[Path]:
    return [p for p in store.rglob("*") if p.is_file()]


def _check_stored(engine, mv: int, model, images) -> None:
    cmp = compare_checkpoints({"models": [model], "dataset": images, "views": ["encoder"]})  # one process, whole set
    expected, refs = cmp.outputs[0]["gallery"], cmp.refs["gallery"]
    labels = np.repeat(np.arange(CLASSES), PER_CLASS)  # class_c/0.png ... class_c/9.png, listed class by class
    with session_scope(engine) as s:
        for view in ("encoder", "logits", "softmax"):
            features, stored_labels, ids = load_feature_set(s, mv, "gallery", view)
            np.testing.assert_allclose(features, expected[view], rtol=1e-5, atol=1e-6)
            assert stored_labels.tolist() == labels.tolist() and ids.tolist() == list(range(CLASSES * PER_CLASS))
        source, ids = load_image_refs(s, mv, "gallery")
        assert source == refs.source and ids.tolist() == refs.ids.tolist()
        # the fingerprint: the checkpoint file's sha256 (hashed here), the stored version's name, raw rows
        want = hashlib.sha256(Path(model["path"]).read_bytes()).hexdigest()
        for view in ("encoder", "logits"):
            assert feature_set_fingerprint(s, mv, "gallery", view) == {
                "dim": expected[view].shape[1], "sha256": want, "name": "small_cnn none, experiment 1 step 1",
                "normalisation": "raw", "prefix": None, "pooling": None}
        layout = s.scalar(select(FeatureSet.store_layout).where(FeatureSet.view == "encoder"))
    assert [p["rows"] for p in layout["shards"]] == [7, 7, 7, 7, 2] and layout["shape"] == [30, 8]


@pytest.mark.parametrize("where", ["here", "inproc", "local2"])
def test_the_parts_equal_the_single_process_embedding(engine, store, inputs, request, where):
    model, images = inputs
    mv = _model_version(engine)
    seen = []
    if where == "local2":
        with dask_client(ClusterSpec(LOCAL, workers=2)) as client:
            done = extract_on_dask(engine, client, model_version_id=mv, model=model, images=images, split="gallery",
                                   rows_per_part=7, batch_size=3)  # batches cut across parts unlike one process
    else:
        client = None if where == "here" else request.getfixturevalue("inproc")
        done = extract_on_dask(engine, client, model_version_id=mv, model=model, images=images, split="gallery",
                               rows_per_part=7, batch_size=3, progress=lambda d, t: seen.append((d, t)))
        assert seen[-1] == (5, 5)
    assert done == {"views": ["encoder", "logits", "softmax"], "count": 30, "parts": 5}
    _check_stored(engine, mv, model, images)
    assert len([p for p in _files(store) if p.suffix == ".npy"]) == 5 * 3  # no other part left


@pytest.mark.parametrize("where", ["here", "inproc"])
def test_a_failed_run_leaves_no_part_file_and_no_row(engine, store, inputs, monkeypatch, request, where):
    model, images = inputs
    real = extract_dask.extract_part

    def fails_on_the_third(url, spec, lo, hi):
        parts = real(url, spec, lo, hi)  # written: the run must delete it
        if lo == 14:
            raise RuntimeError("disk on fire")
        return parts

    monkeypatch.setattr(extract_dask, "extract_part", fails_on_the_third)
    client = None if where == "here" else request.getfixturevalue("inproc")
    with pytest.raises(RuntimeError, match="disk on fire"):
        extract_on_dask(engine, client, model_version_id=_model_version(engine), model=model, images=images,
                        split="gallery", rows_per_part=7)
    assert _files(store) == [] and _feature_count(engine) == 0


_RELEASE = threading.Event()  # module-level: a task of the in-process client is pickled by reference to it
_REAL_PART = extract_dask.extract_part


def _held_part(url, spec, lo, hi):
    """``extract_part``, the parts after the first held until the cancel is decided (or a minute)."""
    if lo:
        _RELEASE.wait(60)
    return _REAL_PART(url, spec, lo, hi)


def test_a_cancelled_run_leaves_no_part_file_and_no_row(engine, store, inputs, inproc, monkeypatch):
    # the parts after the first wait until the cancel is decided, then write theirs while the run is cancelling: the
    # run waits for them and deletes every part
    model, images = inputs
    seen = []
    _RELEASE.clear()

    def stop() -> bool:
        if seen:
            _RELEASE.set()
        return bool(seen)

    monkeypatch.setattr(extract_dask, "extract_part", _held_part)
    try:
        with pytest.raises(Cancelled, match="cancelled during the extraction"):
            extract_on_dask(engine, inproc, model_version_id=_model_version(engine), model=model, images=images,
                            split="gallery", rows_per_part=7, progress=lambda d, t: seen.append(d), should_stop=stop)
    finally:
        _RELEASE.set()
    assert seen == [1] and _files(store) == [] and _feature_count(engine) == 0 and not inproc.futures


@pytest.mark.parametrize("change, message", [
    (lambda m, i: ({**m, "path": "/nowhere/m.pt"}, i), "file not found"),
    (lambda m, i: ({**m, "arch": "nosuch"}, i), "unknown architecture"),
    (lambda m, i: (m, "nosuch:x"), "unknown dataset"),
    (lambda m, i: (m, i + "-missing"), "image folder"),
])
def test_bad_model_or_images_are_one_line_errors_before_anything_is_written(engine, store, inputs, change, message):
    mv = _model_version(engine)
    model, images = change(*inputs)
    with pytest.raises(ValueError, match=message) as caught:
        extract_on_dask(engine, None, model_version_id=mv, model=model, images=images, split="gallery")
    assert "\n" not in str(caught.value) and not store.exists()


@pytest.mark.parametrize("kw, message", [({"split": "nosuch"}, "split"), ({"rows_per_part": 0}, "rows_per_part"),
                                         ({"rows_per_part": 3_000_000}, "rows_per_part <= "),
                                         ({"model_version_id": 999}, "no model version 999")])
def test_bad_numbers_are_refused_before_anything_is_written(engine, store, inputs, kw, message):
    model, images = inputs
    args = {"model_version_id": _model_version(engine), "model": model, "images": images, "split": "gallery"} | kw
    with pytest.raises(ValueError, match=message):
        extract_on_dask(engine, None, **args)
    assert not store.exists()


def test_the_extract_command_commits_the_sets_and_refuses_in_one_line(engine, db_url, store, inputs, capsys):
    model, images = inputs
    mv = _model_version(engine)
    argv = ["extract", "--db", db_url, "--model-version", str(mv), "--checkpoint", model["path"], "--arch",
            "small_cnn", "--input-size", "16", "--images", images, "--split", "gallery", "--rows-per-part", "7"]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == (f"30 images embedded in 5 part(s) (in-process): encoder, logits, softmax "
                                               f"of model version {mv} (gallery)")
    assert _feature_count(engine) == 3
    assert main([a if a != images else "nosuch:x" for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown dataset") and err.count("\n") == 1


def test_a_worker_killed_mid_extraction_is_recomputed_and_leaves_no_stray_part(engine, store, inputs):
    # the first part done, one of 2 worker processes gets SIGKILL (its nanny restarts it): Dask embeds its parts
    # again, the commit takes one part per range and sweeps any other (a half-written .tmp one, a lost result's)
    model, images = inputs
    mv = _model_version(engine)
    killed = []
    with dask_client(ClusterSpec(LOCAL, workers=2)) as client:
        def kill_one(done, total):
            if not killed:
                pid = next(iter(client.run(os.getpid).values()))
                os.kill(pid, signal.SIGKILL)
                killed.append((done, total))

        extract_on_dask(engine, client, model_version_id=mv, model=model, images=images, split="gallery",
                        rows_per_part=3, batch_size=3, progress=kill_one)
    assert killed and killed[0][0] < killed[0][1]
    with session_scope(engine) as s:
        shards = s.scalar(select(FeatureSet.store_layout).where(FeatureSet.view == "encoder"))["shards"]
    assert [p["rows"] for p in shards] == [3] * 10  # 30 images in parts of 3
    assert len([p for p in _files(store) if p.suffix == ".npy"]) == 10 * 3 and not any(
        p.name.startswith(".tmp") for p in store.rglob("*"))
    with session_scope(engine) as s:
        features, labels, _ = load_feature_set(s, mv, "gallery", "encoder")
    cmp = compare_checkpoints({"models": [model], "dataset": images, "views": ["encoder"]})
    np.testing.assert_allclose(features, cmp.outputs[0]["gallery"]["encoder"], rtol=1e-5, atol=1e-6)
