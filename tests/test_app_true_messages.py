"""Messages that say what is true (issue 23, item 7), each checked on the page that shows it."""
from __future__ import annotations

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

from engine.jobs.analysis import run_analysis
from storage import enqueue_job, finish_job, get_engine, session_scope
from storage.jobs import claim_next_job
from support.app_pages import texts
from support.app_synthetic import fill_study

MAIN = Path(__file__).resolve().parents[1] / "app" / "main.py"


def open_page(page: str) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=120).run()
    at.switch_page(f"app_pages/{page}.py").run()
    assert not at.exception, at.exception
    return at


def test_a_verdict_stored_while_the_page_reads_is_shown_not_called_missing(app_db, monkeypatch):
    """The worker stores the verdict and finishes its job between the page's reads: the page shows the verdict."""
    from app import queries

    fill_study(app_db, steps=3, analyses=False)
    at = open_page("upgrade")
    page = texts(at)
    assert "Not computed yet" in page and "Press *Compute*" in page
    assert "in the background" not in page, "nothing was asked: nothing computes in the background"

    db = get_engine(app_db)
    real = queries.analysis_job

    def finishing(url, experiment_id, kind, key):
        """The job list is read: at that moment the worker has just stored the verdict and finished its job."""
        if not finishing.done:
            params = json.loads(key)
            with session_scope(db) as s:
                job_id = enqueue_job(s, "analysis", {"experiment_id": experiment_id, "kind": kind, "params": params},
                                     experiment_id=experiment_id)
            job = claim_next_job(db, 1)
            run_analysis(db, experiment_id, kind, params)
            with session_scope(db) as s:
                finish_job(s, job_id, "done", lease=job.lease)
            queries.jobs.clear()
            finishing.done = True
        return real(url, experiment_id, kind, key)

    finishing.done = False
    monkeypatch.setattr(queries, "analysis_job", finishing)
    at.run()
    assert not at.exception
    page = texts(at)
    assert "no longer stored" not in page and "Not computed yet" not in page
    assert at.success or at.error or at.warning, "the verdict box is shown"
    assert "ECC gain" in " ".join(m.label for m in at.metric)


def test_dataset_files_problem_names_the_missing_files(tmp_path, monkeypatch):
    from engine.data.files_present import config_files_problem, dataset_files_problem

    monkeypatch.setenv("COMPATLAB_DATA_ROOTS", str(tmp_path))
    problem = dataset_files_problem("cifar10", tmp_path)
    assert problem.startswith(f"CIFAR-10 not found under {tmp_path} (missing cifar-10-batches-py/data_batch_1,")
    assert "cifar-10-batches-py/batches.meta" in problem and "\n" not in problem
    assert dataset_files_problem("cifar10", tmp_path, download=True) is None  # the run downloads them
    assert dataset_files_problem("digits", tmp_path) is None
    assert "outside the data roots" in dataset_files_problem("cifar100", "/etc")
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (folder / name).write_bytes(b"")
    assert dataset_files_problem("cifar10", tmp_path) is None
    # the open-set dataset is checked too
    config = {"dataset": {"name": "cifar10", "root": str(tmp_path)}, "eval": {"open_set_dataset": "cifar100"}}
    assert config_files_problem(config).startswith("CIFAR-100 not found")


def test_the_on_its_own_badge_points_the_way_of_its_difference(app_db):
    """A word as a metric's delta ("not better") used to get an up arrow whatever the sign of the difference."""
    from streamlit.proto.Metric_pb2 import Metric

    out = fill_study(app_db, steps=3, analyses=False)
    db = get_engine(app_db)
    for experiment_id in out["experiments"].values():  # mAP: the metric the page opens on (the decision's)
        run_analysis(db, experiment_id, "upgrade", {"step_a": 2, "step_b": 3, "view": "encoder", "metric": "map"})
    at = open_page("upgrade")
    pick = at.selectbox(key="up_experiment")
    seen = set()
    for index in range(len(pick.options)):
        at.selectbox(key="up_experiment").set_value(index).run()
        assert not at.exception
        alone = next(m for m in at.metric if "on its own vs" in m.label)
        diff = float(alone.value.split()[0])
        expected = Metric.UP if diff > 0 else Metric.DOWN if diff < 0 else Metric.NONE
        assert alone.proto.direction == expected, (alone.value, alone.proto.direction)
        seen.add(expected)
    assert seen, "the metric was shown"


def test_axis_titles_are_words_not_field_names():
    import pandas as pd

    from app import charts

    frame = pd.DataFrame({"step": [1, 2, 3], "prototype_cosine": [0.9, 0.8, 0.7], "mean_drift_seen": [0.1, 0.2, 0.3]})
    for field in ("prototype_cosine", "mean_drift_seen"):
        title = charts.steps_chart(frame, field, "t").to_dict()["encoding"]["y"]["title"]
        assert title == charts.AXIS_TITLES[field] and "_" not in title
    assert charts.axis_title("some_new_field") == "some new field"
