"""The job-status helpers on the pages (AppTest): lane positions and the study ETA on Overview, an identical
launch told and not queued, the adapters job followed on the Backfilling page until it is done."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from app import queries
from storage import Job, create_study, enqueue_job, fail_job, get_engine, link_job_study, session_scope
from storage.jobs import claim_next_job, update_job_progress
from storage.types import utcnow
from support.app_pages import jobs, open_page, study, texts  # noqa: F401 (study: a fixture)


def test_overview_shows_lane_positions_and_the_whole_study_eta(app_db):
    db = get_engine(app_db)
    with session_scope(db) as s:
        enqueue_job(s, "run", {"preset": "quick-demo"})
        enqueue_job(s, "run", {"preset": "digits-tiny"})
        enqueue_job(s, "run", {"preset": "fashion-2x5"})
        enqueue_job(s, "analysis", {"experiment_id": 1, "kind": "projection", "params": {}})
        study = create_study(s, name="demo", kind="compare", config={}).id
    job = claim_next_job(db, 1)
    with session_scope(db) as s:  # 40% of the whole study after 200 s: 300 s = 5 min left
        link_job_study(s, job.id, study, lease=job.lease)
        update_job_progress(s, job.id, 0.4, "bct: step 2/3, epoch 1/2, ETA 10 s", lease=job.lease)
        s.execute(update(Job).where(Job.id == job.id).values(started_at=utcnow() - timedelta(seconds=200)))
    shown = texts(open_page("overview"))
    assert "Whole study: about 5 min left" in shown
    # #2 starts when the demo's 300 s are over; #3 waits behind #2, which has never run (no duration known)
    assert "Position 1 in the main lane (training): next to start; starts in about 5 min" in shown
    assert "Position 2 in the main lane (training): 1 job(s) ahead; start time unknown" in shown
    assert ("Position 1 in the short-job lane (analyses, upgrade checks, adapters, checkpoint comparisons): next to "
            "start; starts within seconds.") in shown  # nothing runs in the short lane


def test_an_identical_launch_is_told_and_not_queued(app_db):
    at = open_page("new_experiment")
    at.button[1].click().run()  # "Launch" the preset's defaults
    assert len(jobs(app_db)) == 1 and any("Queued job" in s.value for s in at.success)
    at.button[1].click().run()  # the same again
    assert not at.exception
    assert len(jobs(app_db)) == 1, "the identical launch was queued"
    assert "An identical run job (#1) is already queued" in texts(at)
    assert [b.label for b in at.button if b.label in ("Launch anyway", "Keep the existing one")] == [
        "Launch anyway", "Keep the existing one"]  # (a click reruns only the dialog: AppTest cannot follow it)


def test_the_adapters_table_follows_its_job(study):  # noqa: F811 (the fixture imported above)
    at = open_page("backfilling")
    at.button(key="bf_adapter_train").click().run()
    (job,) = [j for j in jobs(study["url"]) if j.kind == "adapters"]
    shown = texts(at)
    assert f"Queued as job #{job.id}" in shown and "Position 1 in the short-job lane" in shown
    assert "Not trained yet for these steps, view and adapter." in shown and not at.dataframe

    with session_scope(get_engine(study["url"])) as s:  # the worker finishes it (how is not this test's concern)
        claimed = claim_next_job(get_engine(study["url"]), 2, kinds=["adapters"])
        fail_job(s, claimed.id, "no train features", lease=claimed.lease)
    queries.jobs.clear()  # what the job list's 1 s time-to-live does
    at.run()  # what the poll's redraw does once the job is no longer active
    shown = texts(at)
    assert f"Queued as job #{job.id}" not in shown and "Position 1" not in shown
