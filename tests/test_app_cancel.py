"""Cancel on the Overview asks first (a dialog): the first click cancels nothing; the dialog stops the whole job,
or only the experiment a study is training now, or keeps it running."""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from storage import create_experiment, create_study, enqueue_job, get_engine, list_jobs, session_scope
from storage.jobs import claim_next_job, link_job_study
from storage.models import Experiment

MAIN = Path(__file__).resolve().parents[1] / "app" / "main.py"


def overview() -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=120).run()
    assert not at.exception, at.exception
    return at


def job_row(url: str, job_id: int):
    with session_scope(get_engine(url)) as s:
        return {j.id: (j.status, j.cancel_requested) for j in list_jobs(s)}[job_id]


def test_cancel_asks_first_and_keep_cancels_nothing(app_db):
    with session_scope(get_engine(app_db)) as s:
        queued = enqueue_job(s, "run", {"config": {"name": "later", "methods": ["bct"]}})
    at = overview()
    at.button(key=f"cancel_{queued}").click().run()
    assert not at.exception
    assert job_row(app_db, queued) == ("queued", False), "the first click cancels nothing"
    assert at.button(key=f"cancel_all_{queued}").proto.label == "Cancel the job"
    at.button(key=f"cancel_keep_{queued}").click().run()
    assert job_row(app_db, queued) == ("queued", False)
    assert not [b for b in at.button if b.key == f"cancel_all_{queued}"], "Keep closes the dialog"
    at.button(key=f"cancel_{queued}").click().run()
    at.button(key=f"cancel_all_{queued}").click().run()
    assert not at.exception
    assert job_row(app_db, queued)[0] == "cancelled"


def running_study(url: str) -> tuple[int, int, int]:
    """A study run job claimed by a worker, training experiment 'bct seed 1' after a finished 'independent'."""
    db = get_engine(url)
    with session_scope(db) as s:
        job_id = enqueue_job(s, "run", {"config": {"name": "two", "methods": ["independent", "bct"], "seeds": [0, 1]}})
    job = claim_next_job(db, 1)
    with session_scope(db) as s:
        study = create_study(s, name="two", kind="compare", config={"methods": ["independent", "bct"], "seeds": [0, 1]})
        link_job_study(s, job_id, study.id, lease=job.lease)
        done = create_experiment(s, name="two/independent/seed 1", method="independent", config={"seed": 1},
                                 config_hash="a", study_id=study.id)
        done.status = "done"
        running = create_experiment(s, name="two/bct/seed 1", method="bct", config={"seed": 1}, config_hash="b",
                                    study_id=study.id)
        running.status = "running"
        s.flush()
        return job_id, done.id, running.id


def test_a_study_can_stop_one_method_or_all_of_it(app_db):
    job_id, done_id, running_id = running_study(app_db)
    at = overview()
    at.button(key=f"cancel_{job_id}").click().run()
    assert not at.exception
    assert at.button(key=f"cancel_all_{job_id}").proto.label == "Stop the whole study"
    assert not [b for b in at.button if b.key == f"cancel_experiment_{done_id}"], "a finished experiment is not offered"
    assert "Stop only bct (seed 1" in at.button(key=f"cancel_experiment_{running_id}").proto.label
    assert job_row(app_db, job_id) == ("running", False)
    at.button(key=f"cancel_experiment_{running_id}").click().run()
    assert not at.exception
    with session_scope(get_engine(app_db)) as s:
        assert s.get(Experiment, running_id).status == "cancelled"
        assert s.get(Experiment, done_id).status == "done"
    assert job_row(app_db, job_id) == ("running", False), "the study goes on"
    at.button(key=f"cancel_{job_id}").click().run()
    at.button(key=f"cancel_all_{job_id}").click().run()
    assert job_row(app_db, job_id) == ("running", True), "the whole study is asked to stop"
