"""The study ETA after a Retry counts only what is left: the experiments the retried run reuses are not speed."""
from __future__ import annotations

from datetime import timedelta

import pytest

from storage import create_experiment, create_study, get_engine, init_db, job_remaining_s, session_scope, study_remaining_s
from storage.models import Experiment, Job
from storage.types import utcnow


def test_job_remaining_s_counts_only_the_progress_made_since_the_start():
    start = utcnow()
    now = start + timedelta(seconds=60)
    # a fresh run 25% through after 60 s: 180 s left
    assert job_remaining_s(0.25, start, now) == pytest.approx(60 * 0.75 / 0.25)
    # a retry that found 12 of 18 experiments done (base 2/3) and reached 70% after 60 s made 3.33 points in 60 s:
    # 30 points left take 540 s (without the base: 25.7 s, the "about 45 s left" of issue 23)
    assert job_remaining_s(0.7, start, now, base=12 / 18) == pytest.approx(540.0)
    assert job_remaining_s(0.7, start, now) == pytest.approx(60 * 0.3 / 0.7)
    # right after the reused part, before 1% of its own progress: no estimate rather than a wrong one
    assert job_remaining_s(12 / 18 + 0.005, start, now, base=12 / 18) is None


def test_study_eta_of_a_retried_run_ignores_the_reused_experiments(tmp_path):
    db = get_engine(f"sqlite:///{tmp_path / 'eta.db'}")
    init_db(db)
    now = utcnow()
    started = now - timedelta(seconds=60)
    methods = ["independent", "bct", "lce", "psp", "lsp", "cores"]
    with session_scope(db) as s:
        study = create_study(s, name="demo", kind="compare", config={"methods": methods, "seeds": [0, 1, 2]})
        for i in range(13):  # 12 finished before the retry started, one during it
            e = create_experiment(s, name=f"demo/{i}", method=methods[i % 6], config={"i": i}, config_hash=f"h{i}",
                                  study_id=study.id)
            e.status = "done"
            e.finished_at = started - timedelta(seconds=10) if i < 12 else now - timedelta(seconds=5)
        s.add(Job(kind="run", payload={"preset": "demo"}, status="running", progress=0.7, message="", study_id=study.id,
                  cancel_requested=False, started_at=started))
        s.flush()
        assert study_remaining_s(s, study.id, now=now) == pytest.approx(540.0)
        # the same run not retried (nothing finished before it started): the plain linear estimate
        for e in s.query(Experiment).all():
            e.finished_at = now - timedelta(seconds=5)
        s.flush()
        assert study_remaining_s(s, study.id, now=now) == pytest.approx(60 * 0.3 / 0.7)
