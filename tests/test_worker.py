"""The background worker: runs queued jobs, reports failures, honours cancel requests."""
from sqlalchemy import func, select

from engine.core.config import config_from_dict
from engine.jobs.worker import run_one
from storage import enqueue_job, get_engine, init_db, list_jobs, request_cancel, session_scope
from storage.models import Experiment, Job, ModelVersion

TINY = {"methods": ["independent"], "dataset": {"name": "digits"}, "scenario": {"initial_classes": 5, "increment": 5, "num_steps": 2},
        "model": {"width": 8}, "training": {"epochs": 1}}


def _db(tmp_path):
    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(db)
    return db


def test_run_job_goes_from_queued_to_done_with_results(tmp_path):
    db = _db(tmp_path)
    with session_scope(db) as s:
        job_id = enqueue_job(s, "run", {"config": config_from_dict(TINY).to_dict()})
    assert run_one(db, checkpoint_dir=tmp_path / "ckpt") == job_id
    with session_scope(db) as s:
        job = s.get(Job, job_id)
        assert job.status == "done" and job.progress == 1.0 and "study 1" in job.message
        assert s.scalar(select(func.count()).select_from(ModelVersion)) == 2
    assert run_one(db) is None  # queue empty


def test_bad_job_fails_with_its_reason_and_the_worker_lives_on(tmp_path):
    db = _db(tmp_path)
    with session_scope(db) as s:
        bad = enqueue_job(s, "run", {"config": {"methods": ["independent"], "training": {"epoch": 1}}})
        unknown = enqueue_job(s, "paint", {})
    run_one(db)
    run_one(db)
    with session_scope(db) as s:
        assert s.get(Job, bad).status == "failed" and "unknown config key(s) epoch" in s.get(Job, bad).message
        assert s.get(Job, unknown).status == "failed" and "unknown job kind 'paint'" in s.get(Job, unknown).message


def test_cancel_requested_while_running_stops_the_run_and_removes_its_rows(tmp_path, monkeypatch):
    db = _db(tmp_path)
    with session_scope(db) as s:
        job_id = enqueue_job(s, "run", {"config": config_from_dict(TINY).to_dict()})
    import engine.methods.training as training

    real = training.train_step

    def cancel_then_train(*a, **k):  # the user presses "cancel" while step 1 trains
        with session_scope(db) as s:
            request_cancel(s, job_id)
        return real(*a, **k)

    monkeypatch.setattr("engine.run.pipeline.train_step", cancel_then_train)
    run_one(db, checkpoint_dir=tmp_path / "ckpt")
    with session_scope(db) as s:
        assert s.get(Job, job_id).status == "cancelled"
        assert s.scalar(select(func.count()).select_from(ModelVersion)) == 0
        assert [e.status for e in s.scalars(select(Experiment))] == ["cancelled"]
        assert list_jobs(s)[0].id == job_id


def test_a_worker_whose_job_was_failed_as_stale_stops_and_writes_nothing(tmp_path, monkeypatch, capsys):
    from datetime import timedelta

    from storage import fail_stale_jobs
    from storage.types import utcnow

    db = _db(tmp_path)
    with session_scope(db) as s:
        job_id = enqueue_job(s, "run", {"config": config_from_dict(TINY).to_dict()})
    import engine.methods.training as training

    real = training.train_step

    def paused_then_train(*a, **k):  # the worker was paused: another worker fails the job as stale meanwhile
        with session_scope(db) as s:
            assert fail_stale_jobs(s, 60, now=utcnow() + timedelta(seconds=90)) == [job_id]
        return real(*a, **k)

    monkeypatch.setattr("engine.run.pipeline.train_step", paused_then_train)
    assert run_one(db, checkpoint_dir=tmp_path / "ckpt") == job_id
    assert f"job {job_id} is no longer this worker's" in capsys.readouterr().err
    with session_scope(db) as s:
        job = s.get(Job, job_id)
        assert job.status == "failed" and job.message.startswith("worker stopped (no heartbeat for 9")
        experiment = s.scalars(select(Experiment)).one()
        assert job.study_id == experiment.study_id  # the worker linked its job to the study it ran
        assert (experiment.status, experiment.error) == ("failed", job.message)  # the stale reason, not LeaseLost
