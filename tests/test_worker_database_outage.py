"""Issue 44: a database that goes away (a PostgreSQL restart) no longer kills a standalone worker with a trace, and
the job it was running is not left "running": the worker waits with capped exponential back-off, one line per wait,
and fails that job, with the reason, as soon as the database answers again. The outage is simulated by making the
worker's database calls raise what SQLAlchemy raises when the server is gone; the waits are recorded, not slept."""
from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from engine.jobs import worker
from engine.jobs.job_handlers import JOB_HANDLERS
from storage import enqueue_job, get_engine, init_db, session_scope
from storage.models import Job


def gone() -> OperationalError:
    return OperationalError("UPDATE jobs ...", {}, ConnectionRefusedError("connection refused"))


@pytest.fixture
def db(tmp_path):
    engine = get_engine(f"sqlite:///{tmp_path / 'lab.db'}")
    init_db(engine)
    return engine


def test_a_job_running_when_the_database_went_away_is_failed_once_it_answers(db, monkeypatch, capsys):
    with session_scope(db) as s:
        job_id = enqueue_job(s, "analysis", {"n": 1})
    down = {"now": False}
    waits: list[float] = []

    def handler(_db, _payload, ctx):
        down["now"] = True  # the server restarts in the middle of the job
        ctx.progress(0.5, "halfway")
        return "never reached"

    def while_up(real):
        def call(*args, **kwargs):
            if down["now"]:
                raise gone()
            return real(*args, **kwargs)
        return call

    def sleep(seconds):
        waits.append(seconds)
        if len(waits) == 2:  # the database is back after the second wait
            down["now"] = False

    monkeypatch.setitem(JOB_HANDLERS, "analysis", handler)
    for name in ("update_job_progress", "fail_job", "finish_job"):
        monkeypatch.setattr(worker, name, while_up(getattr(worker, name)))
    monkeypatch.setattr(worker.time, "sleep", sleep)
    worker.serve(db, once=True)
    with session_scope(db) as s:
        job = s.get(Job, job_id)
        assert job.status == "failed" and job.message == "the database went away while it ran; retry it"
        assert f"job {job_id}: the database went away while it ran (OperationalError)" in job.error
    assert waits == [worker.RETRY_FIRST_S, 2 * worker.RETRY_FIRST_S]
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("the database does not answer") == 2


def test_the_waits_double_up_to_their_cap_and_reset_once_it_answers(db, monkeypatch):
    calls, waits = {"n": 0}, []

    def run_one(*_args, **_kwargs):
        calls["n"] += 1
        if calls["n"] <= 9:
            raise gone()
        return None

    monkeypatch.setattr(worker, "run_one", run_one)
    monkeypatch.setattr(worker.time, "sleep", waits.append)
    worker.serve(db, once=True)
    want, w = [], worker.RETRY_FIRST_S
    for _ in range(9):  # 0.5, 1, 2, 4, 8, 16, then the 30 s cap
        want.append(w)
        w = min(2 * w, worker.RETRY_MAX_S)
    assert waits == want and max(waits) == worker.RETRY_MAX_S


def test_any_other_error_is_not_waited_out(db, monkeypatch):
    monkeypatch.setattr(worker, "run_one", lambda *a, **k: (_ for _ in ()).throw(ValueError("a bug, not an outage")))
    monkeypatch.setattr(worker.time, "sleep", lambda s: pytest.fail("must not wait"))
    with pytest.raises(ValueError, match="a bug"):
        worker.serve(db, once=True)
