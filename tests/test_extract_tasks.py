"""engine.checkpoints.extract_tasks: one checkpoint's embedding of an image set fanned out over tasks equals the single-process
extraction (uneven parts), labels and image ids included; a failed attempt's file is never referenced and its retry
completes; the commit sweeps unreferenced parts, a cancelled or failed job leaves none; nothing is visible before the commit; bad inputs are one-line errors before anything is written."""
import hashlib
import multiprocessing
import os
import signal
import threading
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select
from support.checkpoints_factory import save_state_dict_pt, write_image_folder

from engine.checkpoints.compare import compare_checkpoints
from engine.cli import main
from engine.checkpoints.extract_tasks import extract_task, fan_out_extract
from engine.jobs.task_handlers import TASK_HANDLERS
from engine.tasks.loop import run_claimed, run_one_task, run_tasks
from storage import (FeatureSet, Job, add_model_version, create_experiment, feature_set_fingerprint, get_engine,
                     load_feature_set, load_image_refs, session_scope)
from storage import featurestore
from storage.featurestore import STORE_ENV
from storage.models import Task
from storage.tasks import claim_task

CLASSES, PER_CLASS = 3, 10  # 30 images; 7 rows per task: parts of 7, 7, 7, 7 and 2


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


def _one(engine) -> int | None:
    """One task run by worker "w" with the workers' handlers."""
    return run_one_task(engine, "w", has_gpu=False, handlers=TASK_HANDLERS)


def _model_version(engine) -> int:
    with session_scope(engine) as s:
        exp = create_experiment(s, name="x", method="none", config={}, config_hash="h")
        return add_model_version(s, exp.id, 1, architecture="small_cnn", method="none", classes=list(range(CLASSES)),
                                 num_outputs=CLASSES, feature_dim=8).id


def _single_process(model, images):
    """The non-fanned path: compare_checkpoints embeds the whole set in one process (what record_experiment stores)."""
    cmp = compare_checkpoints({"models": [model], "dataset": images, "views": ["encoder"]})
    return cmp.outputs[0]["gallery"], cmp.refs["gallery"]


def _feature_count(engine) -> int:
    with session_scope(engine) as s:
        return s.scalar(select(func.count()).select_from(FeatureSet))


def _check_stored(engine, mv: int, model, images) -> None:
    expected, refs = _single_process(model, images)
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
        assert source["files"][7] == "class_0/7.png" and source["files"][12] == "class_1/2.png"


@pytest.mark.both_databases
def test_fanned_out_extraction_equals_the_single_process_embedding(engine, store, inputs):
    model, images = inputs
    mv = _model_version(engine)
    job_id = fan_out_extract(engine, model_version_id=mv, model=model, images=images, split="gallery", rows_per_task=7,
                             batch_size=3)  # batches cut across task boundaries differently from one process
    assert run_tasks(engine, "w", False, threading.Event(), poll_s=0.01, until_idle=True, handlers=TASK_HANDLERS) == 6  # 5 extract + commit
    with session_scope(engine) as s:
        assert s.get(Job, job_id).status == "done"
        layout = s.scalar(select(FeatureSet.store_layout).where(FeatureSet.view == "encoder"))
    assert [p["rows"] for p in layout["shards"]] == [7, 7, 7, 7, 2] and layout["shape"] == [30, 8]
    _check_stored(engine, mv, model, images)


@pytest.mark.both_databases
def test_an_attempt_that_fails_after_writing_leaves_an_unreferenced_file_and_its_retry_completes(engine, store, inputs):
    model, images = inputs
    mv = _model_version(engine)
    fan_out_extract(engine, model_version_id=mv, model=model, images=images, split="gallery", rows_per_task=7)
    failed = []

    def dies_after_writing(db, task):  # the second part's first attempt: its files are written, then it fails
        result = extract_task(db, task)
        if task.payload["rows"] == [7, 14] and task.attempts == 1:
            failed.append(result[0]["parts"])
            raise RuntimeError("killed after writing")
        return result

    handlers = {**TASK_HANDLERS, "extract": dies_after_writing}
    while True:  # every extract task (and the retry); stop before the commit
        with session_scope(engine) as s:
            left = set(s.scalars(select(Task.kind).where(Task.state != "done")))
        if "extract" not in left:
            break
        run_one_task(engine, "w", has_gpu=False, handlers=handlers)
    assert failed and _feature_count(engine) == 0  # nothing visible before the commit
    orphans = {p["file"] for p in failed[0].values()}
    assert all(any(store.rglob(name)) for name in orphans)  # the failed attempt's files are there, complete ...
    assert _one(engine) is not None  # the commit
    with session_scope(engine) as s:
        referenced = {p["file"] for layout in s.scalars(select(FeatureSet.store_layout)) for p in layout["shards"]}
        attempts = s.scalar(select(Task.attempts).where(Task.kind == "extract").order_by(Task.id).offset(1).limit(1))
    assert not orphans & referenced and len(referenced) == 3 * 5 and attempts == 2  # ... and never referenced
    assert not any(any(store.rglob(name)) for name in orphans)  # the commit swept them
    assert sorted(p.name for p in store.rglob("*.npy")) == sorted(referenced)
    _check_stored(engine, mv, model, images)


def _half_then_die(fs, path, array):
    """featurestore._write_npy in a worker killed mid-write: half the bytes reach the disk, then SIGKILL."""
    data = np.ascontiguousarray(array).tobytes()
    with fs.open(path, "wb") as out:
        out.write(data[:len(data) // 2])
        out.flush()
        os.fsync(out.fileno())
        os.kill(os.getpid(), signal.SIGKILL)


def _victim(url: str) -> None:
    featurestore._write_npy = _half_then_die  # in this child process only
    run_one_task(get_engine(url), "victim", has_gpu=False, lease_s=1.0, handlers=TASK_HANDLERS)


@pytest.mark.both_databases
def test_a_worker_killed_mid_write_leaves_no_referenced_half_file_and_its_task_is_retried(engine, db_url, store, inputs):
    model, images = inputs
    mv = _model_version(engine)
    fan_out_extract(engine, model_version_id=mv, model=model, images=images, split="gallery", rows_per_task=7)
    victim = multiprocessing.get_context("spawn").Process(target=_victim, args=(db_url,))  # no fork after torch ran
    victim.start()
    victim.join(timeout=120)
    assert victim.exitcode == -signal.SIGKILL
    [half] = [p for p in store.rglob(".tmp-*")]
    assert 0 < half.stat().st_size
    ran = run_tasks(engine, "survivor", False, threading.Event(), poll_s=0.05, until_idle=True, handlers=TASK_HANDLERS)  # after the 1 s lease
    assert ran == 6 and not half.exists()  # the commit swept the killed attempt's file
    with session_scope(engine) as s:
        first = s.scalar(select(Task).where(Task.kind == "extract").order_by(Task.id).limit(1))
        assert (first.attempts, first.worker, first.state) == (2, "survivor", "done")
        referenced = {p["file"] for layout in s.scalars(select(FeatureSet.store_layout)) for p in layout["shards"]}
    assert half.name not in referenced and all(not name.startswith(".tmp") for name in referenced)
    _check_stored(engine, mv, model, images)


def _job_files(store: Path) -> list[Path]:
    return [p for p in store.rglob("*") if p.is_file()]


@pytest.mark.both_databases
def test_a_cancelled_extract_job_leaves_no_part_files(engine, store, inputs):
    from storage import request_cancel

    model, images = inputs
    job_id = fan_out_extract(engine, model_version_id=_model_version(engine), model=model, images=images,
                             split="gallery", rows_per_task=7)
    assert _one(engine) and _one(engine)  # two parts written
    assert len(_job_files(store)) == 2 * 3  # two parts of each raw view
    with session_scope(engine) as s:
        assert request_cancel(s, job_id) == "cancelled"
    assert _job_files(store) == [] and _feature_count(engine) == 0


@pytest.mark.both_databases
def test_a_failed_extract_job_leaves_no_part_files(engine, store, inputs):
    model, images = inputs
    job_id = fan_out_extract(engine, model_version_id=_model_version(engine), model=model, images=images,
                             split="gallery", rows_per_task=7, max_attempts=1)

    def fails_after_writing(db, task):
        extract_task(db, task)
        raise RuntimeError("failed after writing its parts")

    assert _one(engine)  # the first part is written and done
    assert run_one_task(engine, "w", has_gpu=False, handlers={**TASK_HANDLERS, "extract": fails_after_writing})
    with session_scope(engine) as s:
        assert s.get(Job, job_id).status == "failed"
    assert _job_files(store) == [] and _feature_count(engine) == 0


def test_a_commit_that_lost_its_lease_writes_nothing(engine, store, inputs):
    model, images = inputs
    mv = _model_version(engine)
    fan_out_extract(engine, model_version_id=mv, model=model, images=images, split="gallery", rows_per_task=15)
    assert _one(engine) and _one(engine)  # the two parts
    slow = claim_task(engine, "slow", has_gpu=False, lease_s=5)
    fast = claim_task(engine, "fast", has_gpu=False, lease_s=5, now=slow.lease_until + timedelta(seconds=1))
    assert (slow.kind, fast.id) == ("commit", slow.id)  # the slow worker's lease expired: the commit was taken over
    run_claimed(engine, slow, handlers=TASK_HANDLERS, lease_s=5)  # the loop completes what the handler returns
    assert _feature_count(engine) == 0 and not any(store.rglob("rows-*"))
    run_claimed(engine, fast, handlers=TASK_HANDLERS, lease_s=5)
    assert _feature_count(engine) == 3 and len(list(store.rglob("rows-*.parquet"))) == 3
    with session_scope(engine) as s:
        assert s.get(Task, fast.id).state == "done"


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
        fan_out_extract(engine, model_version_id=mv, model=model, images=images, split="gallery")
    assert "\n" not in str(caught.value)
    with session_scope(engine) as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 0
    assert not store.exists()


@pytest.mark.parametrize("kw, message", [({"split": "nosuch"}, "split"), ({"rows_per_task": 0}, "rows_per_task"),
                                         ({"rows_per_task": 3_000_000}, "rows_per_task <= "),
                                         ({"model_version_id": 999}, "no model version 999")])
def test_bad_numbers_are_refused_before_anything_is_written(engine, store, inputs, kw, message):
    model, images = inputs
    args = {"model_version_id": _model_version(engine), "model": model, "images": images, "split": "gallery"} | kw
    with pytest.raises(ValueError, match=message):
        fan_out_extract(engine, **args)
    with session_scope(engine) as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 0


def test_cli_prints_the_job_id_and_refuses_in_one_line(engine, db_url, store, inputs, capsys):
    model, images = inputs
    mv = _model_version(engine)
    argv = ["extract-tasks", "--db", db_url, "--model-version", str(mv), "--checkpoint", model["path"], "--arch",
            "small_cnn", "--input-size", "16", "--images", images, "--split", "gallery", "--rows-per-task", "7"]
    assert main(argv) == 0
    job_id = int(capsys.readouterr().out.strip())
    with session_scope(engine) as s:
        assert s.scalar(select(func.count()).select_from(Task).where(Task.job_id == job_id)) == 6
    assert main([a if a != images else "nosuch:x" for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown dataset") and err.count("\n") == 1


def test_the_overview_names_an_extract_job(engine, store, inputs):
    from engine.core.contract import job_label as _job_label

    model, images = inputs
    mv = _model_version(engine)
    job_id = fan_out_extract(engine, model_version_id=mv, model=model, images=images, split="query")
    with session_scope(engine) as s:
        job = s.get(Job, job_id)
        assert _job_label(job.kind, job.payload) == f"extract: {images} by model version #{mv} (query)"
