"""Job lanes, queue positions, the study ETA and identical launches (storage.jobs, the worker's ``--kinds``, run_app).

The lane test holds a real training run inside its first ``train_step`` on an event the test controls (no sleep),
and checks that the short-job worker claims and finishes a map job on another experiment meanwhile.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from datetime import timedelta

import numpy as np
import pytest

import run_app
from engine.core.config import config_from_dict
from engine.core.contract import JOB_LANES, JOB_PRIORITY, SHORT_JOB_KINDS, analysis_key, analysis_payload
from engine.jobs.worker import run_one
from storage import (
    IdenticalJob,
    Job,
    QueuePlace,
    add_model_version,
    claim_next_job,
    create_experiment,
    create_study,
    enqueue_job,
    fail_job,
    find_identical_job,
    finish_job,
    get_engine,
    init_db,
    load_analysis,
    queue_positions,
    request_cancel,
    save_feature_set,
    session_scope,
    study_remaining_s,
)
from storage.types import utcnow

WAIT_S = 300  # generous: a loaded 2-core machine
TINY = {"name": "held", "methods": ["independent"], "dataset": {"name": "digits"},
        "scenario": {"initial_classes": 5, "increment": 5, "num_steps": 2}, "model": {"width": 8},
        "training": {"epochs": 1}}


@pytest.fixture
def db(tmp_path):
    engine = get_engine(f"sqlite:///{tmp_path / 'lanes.db'}")
    init_db(engine)
    return engine


def _job(db, job_id: int) -> Job:
    with session_scope(db) as s:
        return s.get(Job, job_id)


def _stored_experiment(db) -> int:
    """An experiment with two model versions and random 4-d encoder features (enough for a PCA map)."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 5)
    with session_scope(db) as s:
        exp = create_experiment(s, name="other", method="bct", config={}, config_hash="other")
        for step in (1, 2):
            v = add_model_version(s, exp.id, step, architecture="mlp", method="bct", classes=[0, 1, 2], num_outputs=3,
                                  feature_dim=4)
            for split in ("query", "gallery"):
                save_feature_set(s, v.id, split, "encoder", rng.normal(size=(15, 4)).astype(np.float32), labels)
        return exp.id


# ------------------------------------------------------------------------------------------------ lanes


def test_a_map_job_is_done_while_a_training_run_holds_the_main_worker(db, tmp_path, monkeypatch):
    with session_scope(db) as s:
        run_id = enqueue_job(s, "run", {"config": config_from_dict(TINY).to_dict()})
    exp_id = _stored_experiment(db)
    params = {"step_a": 1, "step_b": 2, "method": "pca"}

    training, release = threading.Event(), threading.Event()
    import engine.methods.training as training_module

    real = training_module.train_step

    def held_train_step(*a, **k):  # the run trains for as long as the test says
        training.set()
        assert release.wait(WAIT_S), "the test never released the training run"
        return real(*a, **k)

    monkeypatch.setattr("engine.run.pipeline.train_step", held_train_step)
    main = threading.Thread(target=run_one, args=(db,), kwargs={"checkpoint_dir": tmp_path / "ckpt"}, daemon=True)
    main.start()
    try:
        assert training.wait(WAIT_S), "the main worker never started training"
        assert _job(db, run_id).status == "running"
        with session_scope(db) as s:  # queued now: a free general worker would take it before a run (priority)
            map_id = enqueue_job(s, "analysis", analysis_payload(exp_id, "projection", params), experiment_id=exp_id)

        assert run_one(db, kinds=SHORT_JOB_KINDS) == map_id  # the short lane's worker
        assert _job(db, map_id).status == "done"
        with session_scope(db) as s:
            assert load_analysis(s, exp_id, "projection", analysis_key("projection", params)) is not None
        assert _job(db, run_id).status == "running" and not release.is_set()  # training is still held
    finally:
        release.set()
        main.join(WAIT_S)
    assert not main.is_alive() and _job(db, run_id).status == "done"


def test_a_lane_worker_claims_only_its_kinds_oldest_first(db):
    with session_scope(db) as s:
        run = enqueue_job(s, "run", {"preset": "digits-tiny"})
        adapters = enqueue_job(s, "adapters", {"kind": "perp"})
        analysis = enqueue_job(s, "analysis", {"kind": "projection"})
    assert claim_next_job(db, 7, kinds=SHORT_JOB_KINDS).id == adapters
    assert claim_next_job(db, 7, kinds=SHORT_JOB_KINDS).id == analysis
    assert claim_next_job(db, 7, kinds=SHORT_JOB_KINDS) is None  # the run is not its to take
    assert claim_next_job(db, 8).id == run  # the main worker takes any kind
    assert claim_next_job(db, 8) is None


def test_the_worker_command_takes_kinds_and_refuses_unknown_ones(db, capsys):
    from engine.cli import main

    url = db.url.render_as_string(hide_password=False)
    with session_scope(db) as s:
        run = enqueue_job(s, "run", {"preset": "digits-tiny"})
        odd = enqueue_job(s, "analysis", {"kind": "nothing"})  # fails at once: the short worker ran it
    assert main(["worker", "--once", "--kinds", "analysis", "adapters", "--db", url]) == 0
    assert (_job(db, run).status, _job(db, odd).status) == ("queued", "failed")
    with pytest.raises(SystemExit) as exc:
        main(["worker", "--kinds", "paint", "--db", url])
    assert exc.value.code == 2 and "invalid choice: 'paint'" in capsys.readouterr().err


def test_run_app_starts_a_short_job_worker_beside_the_main_one(monkeypatch):
    monkeypatch.delenv("COMPATLAB_THREADS", raising=False)
    commands = run_app.child_commands(run_app.parse_args([]), "sqlite:////srv/lab/x.db")
    assert commands["worker"][1:] == ["-m", "engine", "worker", "--checkpoints", "/srv/lab/checkpoints/x.db", "--share-cores"]
    assert commands["short-job worker"] == [*commands["worker"], "--kinds", "analysis", "adapters", "checkpoints",
                                            "sources_check"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_each_worker_is_restarted_on_its_own_and_the_dashboard_stays(monkeypatch, tmp_path, capsys):
    dying, sleeping = "import sys; sys.exit(3)", "import time; time.sleep(120)"
    monkeypatch.setattr(run_app, "child_commands", lambda args, url: {
        "worker": [sys.executable, "-c", sleeping], "short-job worker": [sys.executable, "-c", dying],
        "dashboard": [sys.executable, "-c", sleeping]})
    monkeypatch.setattr(run_app, "BACKOFF_START_S", 0.05)
    started = []
    real_popen = run_app.subprocess.Popen
    monkeypatch.setattr(run_app.subprocess, "Popen", lambda *a, **k: started.append(real_popen(*a, **k)) or started[-1])
    previous = signal.getsignal(signal.SIGTERM)

    def stop_after_two_restarts() -> None:
        while sum(p.args[-1] == dying for p in started) < 3:
            time.sleep(0.05)
        signal.raise_signal(signal.SIGTERM)

    threading.Thread(target=stop_after_two_restarts, daemon=True).start()
    try:
        assert run_app.main(["--no-demo", "--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert sum(p.args[-1] == sleeping for p in started) == 2  # the main worker and the dashboard, never restarted
    assert all(p.poll() is not None for p in started)
    err = capsys.readouterr().err
    assert err.count("worker exited with code 3; restarting the short-job worker in") >= 2
    assert "restarting the worker in" not in err


# ------------------------------------------------------------------------------------------------ queue positions


def test_queue_positions_count_each_lane_in_claim_order(db):
    with session_scope(db) as s:
        ids = [enqueue_job(s, kind, {"n": i}) for i, kind in
               enumerate(["run", "analysis", "checkpoints", "adapters", "run", "analysis", "paint"])]
    claim_next_job(db, 1)  # the first run is running now: it has no place in the queue
    failed = claim_next_job(db, 2, kinds=["analysis"])
    with session_scope(db) as s:
        fail_job(s, failed.id, "boom", lease=failed.lease)  # finished: no place either
        places = queue_positions(s, JOB_LANES, "main")
        by_priority = queue_positions(s, JOB_LANES, "main", priority=JOB_PRIORITY)
    assert places == {ids[2]: QueuePlace("short", 1), ids[3]: QueuePlace("short", 2), ids[4]: QueuePlace("main", 1),
                      ids[5]: QueuePlace("short", 3), ids[6]: QueuePlace("main", 2)}
    # with the workers' priorities the analysis and the adapters go before the older comparison
    assert by_priority == {**places, ids[3]: QueuePlace("short", 1), ids[5]: QueuePlace("short", 2),
                           ids[2]: QueuePlace("short", 3)}


# ------------------------------------------------------------------------------------------------ ETA


def _hand_made(s, study_id: int, *, status: str, progress: float, started_s_ago: float | None, now,
               payload: dict, took_s: float | None = None) -> Job:
    job = Job(kind="run", payload=payload, status=status, progress=progress, message="", study_id=study_id,
              cancel_requested=False, started_at=None if started_s_ago is None else now - timedelta(seconds=started_s_ago))
    from storage.jobs import payload_hash

    job.payload_hash = payload_hash("run", payload)
    if took_s is not None:
        job.finished_at = job.started_at + timedelta(seconds=took_s)
    s.add(job)
    s.flush()
    return job


def test_study_eta_is_the_whole_study_from_stored_progress_and_elapsed_time(db):
    now = utcnow()
    with session_scope(db) as s:
        study = create_study(s, name="three methods", kind="compare", config={}).id
        idle = create_study(s, name="idle", kind="compare", config={}).id
        # a run of 3 methods, 25% through all of them after 300 s: 900 s left for the study (not one method's)
        _hand_made(s, study, status="running", progress=0.25, started_s_ago=300, now=now, payload={"a": 1})
        assert study_remaining_s(s, study, now=now) == pytest.approx(900.0)
        # a queued retry of a config that took 120 s last time adds its 120 s
        _hand_made(s, idle, status="done", progress=1.0, started_s_ago=1000, now=now, payload={"b": 2}, took_s=120)
        _hand_made(s, study, status="queued", progress=0.0, started_s_ago=None, now=now, payload={"b": 2})
        assert study_remaining_s(s, study, now=now) == pytest.approx(1020.0)
        assert study_remaining_s(s, idle, now=now) is None  # nothing queued or running
        # a queued job never run before has no estimate: the study's ETA is unknown rather than too short
        _hand_made(s, study, status="queued", progress=0.0, started_s_ago=None, now=now, payload={"c": 3})
        assert study_remaining_s(s, study, now=now) is None
        fresh = create_study(s, name="fresh", kind="compare", config={}).id
        _hand_made(s, fresh, status="running", progress=0.005, started_s_ago=10, now=now, payload={"d": 4})
        assert study_remaining_s(s, fresh, now=now) is None  # below 1%: no estimate yet


# ------------------------------------------------------------------------------------------------ identical launches


def test_an_identical_launch_is_refused_unless_forced(db):
    config = config_from_dict(TINY).to_dict()
    with session_scope(db) as s:
        first = enqueue_job(s, "run", {"config": config}, allow_identical=False)
    with session_scope(db) as s, pytest.raises(IdenticalJob, match=rf"identical run job \(#{first}\) is already queued"):
        enqueue_job(s, "run", {"config": dict(reversed(list(config.items())))}, allow_identical=False)  # key order
    with session_scope(db) as s:
        assert [j.id for j in s.query(Job)] == [first]  # nothing queued
        other = enqueue_job(s, "run", {"config": {**config, "name": "another"}}, allow_identical=False)
        assert enqueue_job(s, "analysis", {"config": config}, allow_identical=False)  # another kind is another job
    job = claim_next_job(db, 1)
    with session_scope(db) as s, pytest.raises(IdenticalJob, match="is running now") as exc:
        enqueue_job(s, "run", {"config": config}, allow_identical=False)
    assert (exc.value.job_id, exc.value.status) == (first, "running")
    with session_scope(db) as s:
        fail_job(s, first, "boom", lease=job.lease)
        again = enqueue_job(s, "run", {"config": config}, allow_identical=False)  # a failed one may be relaunched
        request_cancel(s, other)  # out of the way: the next run claimed is ``again``
    with session_scope(db) as s:
        finish_job(s, again, lease=claim_next_job(db, 1, kinds=["run"]).lease)
    with session_scope(db) as s, pytest.raises(IdenticalJob, match=rf"\(#{again}\) has already run"):
        enqueue_job(s, "run", {"config": config}, allow_identical=False)
    with session_scope(db) as s:
        forced = enqueue_job(s, "run", {"config": config})  # the user forced it
        assert find_identical_job(s, "run", {"config": config}).id == forced  # an active one before a done one
        assert {first, again, forced, other} < {j.id for j in s.query(Job)}
