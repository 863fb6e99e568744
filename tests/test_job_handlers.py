"""The job-handler registry: one handler per job kind of the contract, one signature, the worker dispatching through it."""
import inspect

import pytest

from engine.core import contract
from engine.jobs.job_handlers import JOB_HANDLERS
from engine.jobs.worker import run_one
from storage import enqueue_job, get_engine, init_db, session_scope
from storage.models import Job


def test_the_registry_holds_every_job_kind_of_the_contract_and_nothing_else():
    assert sorted(JOB_HANDLERS) == sorted(contract.JOB_KINDS)
    assert len(JOB_HANDLERS) == len(contract.JOB_KINDS) == 5
    assert set(contract.SHORT_JOB_KINDS) | {"run"} == set(JOB_HANDLERS)  # every lane's kind has a handler
    assert set(contract.JOB_PRIORITY) == set(JOB_HANDLERS)


def test_every_handler_takes_the_database_the_payload_and_the_job_context():
    for kind, handler in JOB_HANDLERS.items():
        assert list(inspect.signature(handler).parameters) == ["db", "payload", "job"], kind


def test_the_worker_runs_a_job_through_the_handler_of_its_kind_with_its_context(tmp_path):
    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(db)
    with session_scope(db) as s:
        job_id = enqueue_job(s, "analysis", contract.analysis_payload(3, "geometry", {"view": "psp"}))
        other = enqueue_job(s, "run", contract.run_preset_payload("quick-demo"))
    seen = []

    def fake_analysis(db, payload, job):
        seen.append((payload, job.checkpoint_dir))
        job.progress(0.5, "half way")
        assert job.should_stop() is False and job.on_study is not None
        return "fake done"

    handlers = {**JOB_HANDLERS, "analysis": fake_analysis}
    assert run_one(db, checkpoint_dir=tmp_path / "ckpt", kinds=["analysis"], handlers=handlers) == job_id
    assert seen == [({"experiment_id": 3, "kind": "geometry", "params": {"view": "psp"}}, tmp_path / "ckpt")]
    with session_scope(db) as s:
        job = s.get(Job, job_id)
        assert (job.status, job.message, job.progress) == ("done", "fake done", 1.0)
        assert s.get(Job, other).status == "queued" and s.get(Job, other).payload == {"preset": "quick-demo"}


def test_a_kind_without_a_handler_fails_with_the_known_kinds(tmp_path):
    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(db)
    with session_scope(db) as s:
        job_id = enqueue_job(s, "analysis", {})
    assert run_one(db, handlers={"run": JOB_HANDLERS["run"]}) == job_id
    with session_scope(db) as s:
        job = s.get(Job, job_id)
        assert job.status == "failed" and "unknown job kind 'analysis'; known kinds: run" in job.message


def test_a_preset_run_payload_names_a_known_preset():
    assert contract.run_preset_payload("quick-demo") == {"preset": "quick-demo"}
    with pytest.raises(ValueError, match="unknown preset 'quik-demo'; known presets: quick-demo"):
        contract.run_preset_payload("quik-demo")

