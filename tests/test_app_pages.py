"""Every dashboard page under streamlit.testing.v1.AppTest, against a temporary SQLite database.

The database is filled through the storage repository (``fill_study``: a finished study with hand-made
matrices and analyses computed by engine.jobs.analysis). Pages are checked for exceptions, for the values
they must show, and for the job rows their buttons write.
"""
from __future__ import annotations


import pytest
from streamlit.testing.v1 import AppTest

from engine.core.contract import analysis_key
from storage import enqueue_job, fail_job, get_engine, load_analysis, session_scope
from storage.jobs import claim_next_job
from support.app_pages import MAIN, TIMEOUT, jobs, open_page, study, texts, unplain  # noqa: F401 (fixtures among them)

PAGES = ("overview", "new_experiment", "compatibility", "geometry", "backfilling")












@pytest.mark.parametrize("page", PAGES)
def test_empty_database_is_friendly(app_db, page):
    at = open_page(page)
    if page != "new_experiment":
        assert "yet" in texts(at), f"{page} should say there is nothing yet"
    assert not at.error


def test_empty_database_mentions_the_queued_demo(app_db):
    with session_scope(get_engine(app_db)) as s:
        enqueue_job(s, "run", {"preset": "quick-demo"})
    at = open_page("compatibility")
    assert "quick-demo" in texts(at) and "queued" in texts(at)


# ------------------------------------------------------------------------------------------ overview


def test_overview_shows_ac_aa_aca(study):  # noqa: F811
    at = open_page("overview")
    frame = at.dataframe[0].value
    rows = {r["method"]: r for _, r in frame.iterrows()}
    for method in ("independent", "bct"):
        C = study["matrices"][method]
        from engine.metrics import average_accuracy, average_compatibility, average_compatibility_accuracy

        assert rows[method]["AC %"] == pytest.approx(100 * average_compatibility(C))
        assert rows[method]["AA %"] == pytest.approx(100 * average_accuracy(C))
        assert rows[method]["ACA %"] == pytest.approx(100 * average_compatibility_accuracy(C))
        assert rows[method]["steps"] == 3 and rows[method]["status"] == "done"
    assert rows["bct"]["AC %"] == 100.0 and rows["independent"]["AC %"] == 0.0


def test_overview_cancel_and_retry_change_job_rows(app_db):
    db = get_engine(app_db)
    with session_scope(db) as s:
        failed = enqueue_job(s, "run", {"preset": "quick-demo"})
    lease = claim_next_job(db, 1).lease
    with session_scope(db) as s:
        fail_job(s, failed, "Traceback: boom", message="step 2/3, epoch 1/2", lease=lease)
        queued = enqueue_job(s, "run", {"config": {"name": "later", "methods": ["bct"]}})
    at = open_page("overview")
    page = texts(at)
    assert "step 2/3, epoch 1/2" in page, "a failed job shows its last message"
    at.button(key=f"cancel_{queued}").click().run()
    at.button(key=f"cancel_all_{queued}").click().run()  # the confirmation (tests/test_app_cancel.py)
    assert not at.exception
    at.button(key=f"retry_{failed}").click().run()
    assert not at.exception
    rows = {j.id: j for j in jobs(app_db)}
    assert rows[queued].status == "cancelled"
    retried = [j for j in rows.values() if j.id not in (failed, queued)]
    assert len(retried) == 1 and retried[0].status == "queued" and retried[0].payload == {"preset": "quick-demo"}


def test_overview_shows_progress_and_eta(app_db):
    db = get_engine(app_db)
    with session_scope(db) as s:
        enqueue_job(s, "run", {"preset": "quick-demo"})
    job = claim_next_job(db, 1)
    from storage.jobs import update_job_progress

    with session_scope(db) as s:
        update_job_progress(s, job.id, 0.4, "bct: step 2/3, epoch 1/2, loss 1.2, ETA 75 s", lease=job.lease)
    at = open_page("overview")
    assert at.get("progress")[0].proto.value == 40
    assert "ETA 75 s" in at.get("progress")[0].proto.text


# ------------------------------------------------------------------------------------------ new experiment


def test_new_experiment_form_enqueues_a_run_job(app_db):
    at = open_page("new_experiment")
    at.text_input(key="ne_name").set_value("my-study")
    at.multiselect(key="ne_methods").set_value(["bct", "psp"])
    at.number_input(key="ne_epochs").set_value(1)
    at.button[1].click().run()  # "Launch"
    assert not at.exception and not at.error
    queued = jobs(app_db)
    assert len(queued) == 1 and queued[0].kind == "run"
    cfg = queued[0].payload["config"]
    assert cfg["name"] == "my-study" and cfg["methods"] == ["bct", "psp"] and cfg["training"]["epochs"] == 1
    # the quick-demo preset underneath: its data, and the settings the form does not show
    from engine.core.presets import preset_config
    from engine.data.fashion_files import fashion_available

    assert cfg["dataset"]["name"] == preset_config("quick-demo", fashion_present=fashion_available).dataset.name  # fashion when installed, else shapes
    assert cfg["model"]["width"] == 32 and cfg["eval"]["eval_classes"] == "seen"
    assert cfg["method_params"] == {}, "hyper-parameters of methods no longer chosen are dropped"
    from engine.core.config import config_from_dict

    assert config_from_dict(cfg).to_dict() == cfg
    assert 'name = "my-study"' in at.code[0].value
    assert any("Queued job" in s.value for s in at.success)


def test_new_experiment_errors_are_shown_and_nothing_is_queued(app_db):
    at = open_page("new_experiment")
    at.multiselect(key="ne_methods").set_value([])
    at.selectbox(key="ne_dataset").set_value("digits")
    at.number_input(key="ne_initial_classes").set_value(10)
    at.number_input(key="ne_increment").set_value(10)
    at.number_input(key="ne_num_steps").set_value(5)  # 10 + 4 x 10 = 50 classes, but digits has 10
    at.button[1].click().run()
    errors = " ".join(e.value for e in at.error)
    assert "at least one method" in errors and "50 classes" in errors  # the engine's scenario check
    assert jobs(app_db) == []


def test_new_experiment_says_where_the_workers_evaluate(app_db, monkeypatch):
    at = open_page("new_experiment")
    assert any("evaluated in the worker's process" in c.value for c in at.caption)
    monkeypatch.setenv("COMPATLAB_DASK_SCHEDULER", "tcp://10.0.0.5:8786")  # the workers' cluster setting
    at = open_page("new_experiment")
    assert any("on Dask (tcp://10.0.0.5:8786)" in c.value for c in at.caption)
    at.radio(key="ne_gallery").set_value("template")
    at.button[1].click().run()  # template galleries are searched in one process: refused, nothing queued
    assert "needs the instance gallery" in " ".join(e.value for e in at.error) and jobs(app_db) == []
    at.radio(key="ne_gallery").set_value("instance")
    at.button[1].click().run()
    assert not at.error, [e.value for e in at.error]
    (job,) = jobs(app_db)
    assert job.payload == {"config": job.payload["config"]}  # where is the worker's setting, not the job's


def test_preset_fills_the_form(app_db, tmp_path, monkeypatch):
    at = open_page("new_experiment")
    at.selectbox(key="ne_preset_choice").set_value("psp-cifar100-5steps").run()
    assert at.number_input(key="ne_epochs").value == 120
    assert at.selectbox(key="ne_dataset").value == "cifar100"
    assert at.multiselect(key="ne_methods").value == ["independent", "psp", "lsp", "bct", "cores", "etf"]
    # Check refuses what the CLI refuses: CIFAR-100 absent from the root (issue 23: it said "The config is valid")
    monkeypatch.setenv("COMPATLAB_DATA_ROOTS", str(tmp_path))
    at.text_input(key="ne_root").set_value(str(tmp_path))
    at.button[0].click().run()
    assert f"CIFAR-100 not found under {tmp_path}" in unplain(" ".join(e.value for e in at.error)) and jobs(app_db) == []
    for name in ("train", "test", "meta"):  # the files' presence is what Check looks at (the run reads them)
        (tmp_path / "cifar-100-python").mkdir(exist_ok=True)
        (tmp_path / "cifar-100-python" / name).write_bytes(b"")
    at.button[0].click().run()  # "Check": valid, not queued
    assert not at.error and jobs(app_db) == []
    assert "temperature = 12.0" in at.code[0].value  # the preset's method hyper-parameters


# ------------------------------------------------------------------------------------------ compatibility


def test_compatibility_shows_the_hand_made_matrices(study):  # noqa: F811
    at = open_page("compatibility")
    summary = at.dataframe[0].value
    rows = {r["method"]: r for _, r in summary.iterrows()}
    assert rows["bct"]["AC %"] == 100.0 and rows["independent"]["AC %"] == 0.0
    page = texts(at)
    assert "AC 100.0%" in page.replace("**", "") and "AC 0.0%" in page.replace("**", "")
    assert "3 failing cross-test(s)" in page and "0 failing cross-test(s)" in page  # 3 x 3: three cross-tests
    charts = at.get("vega_lite_chart")
    assert len(charts) >= 4  # AC_t, AA_t and one heatmap per method
    labels = {b.proto.label for b in at.get("download_button")}
    assert {"CSV", "Markdown", "Latex", "PNG", "SVG", "HTML", "Download this study (zip)"} <= labels
    # switching metric shows the mAP matrices (the same cells minus 0.1)
    at.selectbox(key="cm_metric").set_value("map").run()
    assert not at.exception
    assert at.dataframe[0].value.iloc[0]["AA %"] == pytest.approx(
        rows[at.dataframe[0].value.iloc[0]["method"]]["AA %"] - 10)


def test_compatibility_single_method(study):  # noqa: F811
    at = open_page("compatibility")
    at.multiselect(key=at.multiselect[0].key).set_value([m for m in at.multiselect[0].options if "bct" in m]).run()
    assert not at.exception
    assert list(at.dataframe[0].value["method"]) == ["bct"]


# ------------------------------------------------------------------------------------------ geometry


def test_geometry_shows_a_stored_projection(study):  # noqa: F811
    at = open_page("geometry")
    at.selectbox(key="geo_experiment").set_value(1).run()  # the experiment with stored analyses (independent)
    at.radio(key="geo_method").set_value("pca").run()
    assert not at.exception
    with session_scope(get_engine(study["url"])) as s:
        params = {"step_a": 2, "step_b": 3, "view": "encoder", "split": "gallery", "method": "pca", "max_points": 2000}
        payload = load_analysis(s, study["experiments"]["independent"], "projection",
                                analysis_key("projection", params)).payload
    nc = at.dataframe[0].value
    assert list(nc["NC1"]) == pytest.approx([m["nc1"] for m in payload["collapse"]])
    assert at.get("vega_lite_chart"), "the map, drift and angle charts are drawn"
    assert "stored before sample references existed" in texts(at)  # hand-made rows have no images
    assert sum(1 for e in at.text if e.value.startswith("#")) == 10  # 5 neighbours per gallery, by class name


def test_geometry_compute_button_enqueues_an_analysis_job(study):  # noqa: F811
    at = open_page("geometry")
    at.selectbox(key="geo_experiment").set_value(1).run()  # UMAP by default: not computed yet
    at.button(key="geo_compute").click().run()
    assert not at.exception
    (job,) = [j for j in jobs(study["url"]) if j.kind == "analysis" and j.payload["kind"] == "projection"]
    assert job.payload["experiment_id"] == study["experiments"]["independent"]
    assert job.payload["params"]["method"] == "umap" and job.payload["params"]["step_b"] == 3
    assert job.experiment_id == study["experiments"]["independent"]
    assert "Queued as job" in texts(at)


# ------------------------------------------------------------------------------------------ backfilling


def test_backfilling_shows_curves_and_m_tilde(study):  # noqa: F811
    at = open_page("backfilling")
    at.selectbox(key="bf_experiment").set_value(1).run()
    assert not at.exception
    with session_scope(get_engine(study["url"])) as s:
        params = {"step_a": 2, "step_b": 3, "view": "encoder", "orderings": ["random", "distance_mse", "distance_cosine"],
                  "metrics": ["recall@1", "map"]}
        payload = load_analysis(s, study["experiments"]["independent"], "backfill",
                                analysis_key("backfill", params)).payload
    table = at.dataframe[0].value
    assert list(table["ordering"]) == ["random", "distance_mse", "distance_cosine"]
    assert list(table["M̃ Recall@1 %"]) == pytest.approx([100 * payload["area"][o]["recall@1"] for o in table["ordering"]])
    assert len(at.get("vega_lite_chart")) == 2
    assert f"{payload['n_gallery']} gallery items" in texts(at)


def test_backfilling_rollout_curves(study):  # noqa: F811
    from engine.jobs.analysis import run_analysis

    params = {"step_a": 2, "step_b": 3, "view": "encoder", "orderings": ["random", "distance_mse", "distance_cosine"],
              "metrics": ["recall@1", "map"], "rollout": True}
    db = get_engine(study["url"])
    run_analysis(db, study["experiments"]["independent"], "backfill", params)
    with session_scope(db) as s:
        roll = load_analysis(s, study["experiments"]["independent"], "backfill", analysis_key("backfill", params)).payload["rollout"]
    at = open_page("backfilling")
    at.selectbox(key="bf_experiment").set_value(1).run()
    assert "Roll-out" not in texts(at)  # off by default: the stored analysis without roll-out curves
    at.checkbox(key="bf_rollout").check().run()
    assert not at.exception
    table = at.dataframe[-1].value
    assert list(table["curve"]) == [*(f"item replacement, {o}" for o in params["orderings"]),
                                    *(f"rank merge, {o}" for o in params["orderings"]), "candidate re-scoring"]
    assert table["M̃ mAP %"].iloc[-1] == pytest.approx(100 * roll["rescoring"]["summary"]["map"]["area"])
    assert len(at.get("vega_lite_chart")) == 4  # two metrics, item replacement and roll-out


def test_backfilling_compute_button(study):  # noqa: F811
    at = open_page("backfilling")  # newest experiment (bct) has no stored curves
    at.button(key="bf_compute").click().run()
    (job,) = [j for j in jobs(study["url"]) if j.kind == "analysis"]
    assert job.payload["kind"] == "backfill" and job.payload["experiment_id"] == study["experiments"]["bct"]
    assert sorted(job.payload["params"]["metrics"]) == ["map", "recall@1"]


def test_backfilling_train_adapters_button_queues_an_adapter_job(study):  # noqa: F811
    at = open_page("backfilling")
    at.selectbox(key="bf_adapter_kind").set_value("lambda").run()
    at.button(key="bf_adapter_train").click().run()
    assert not at.exception
    (job,) = [j for j in jobs(study["url"]) if j.kind == "adapters"]
    assert job.payload["kind"] == "lambda" and job.payload["old_version_id"] != job.payload["new_version_id"]
    assert job.payload["view"] and job.payload["same_set"] in (True, False)


# ------------------------------------------------------------------------------------------ shared secret


def test_the_page_script_leaves_the_secret_to_the_gate(app_db, monkeypatch):
    """The secret is asked by app/gate.py before Streamlit serves anything (tests/test_secret_gate.py), not here."""
    monkeypatch.setenv("COMPATLAB_SECRET", "s3cret-s3cret-s3cret")
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT).run()
    assert not at.exception and "Overview" in [t.value for t in at.title]


def test_the_sidebar_masks_the_database_password(app_db, monkeypatch):
    import app.queries as queries

    monkeypatch.setattr(queries, "db_url", lambda: app_db.replace("sqlite:///", "sqlite://lab:hunter2@/"))
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)
    at.run()
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "lab:***@" in captions and "hunter2" not in captions


def test_retry_of_a_job_that_crashed_its_worker_asks_first_and_says_why(app_db):
    from storage import fail_jobs_of_worker, worker_exit_reason

    db = get_engine(app_db)
    with session_scope(db) as s:
        crashed = enqueue_job(s, "run", {"preset": "quick-demo"})
    claim_next_job(db, 4242)
    with session_scope(db) as s:
        assert fail_jobs_of_worker(s, 4242, worker_exit_reason(-9)) == [crashed]
    at = open_page("overview")
    at.button(key=f"retry_{crashed}").click().run()
    assert not at.exception
    warning = " ".join(w.value for w in at.warning)
    assert f"Job #{crashed} did not fail by itself: its worker killed by signal 9 (SIGKILL), probably out of memory" \
        in warning
    assert [j.id for j in jobs(app_db)] == [crashed], "nothing is queued before the confirmation"
    at.button(key=f"retry_keep_{crashed}").click().run()
    assert not at.warning and [j.id for j in jobs(app_db)] == [crashed]
    at.button(key=f"retry_{crashed}").click().run()
    at.button(key=f"retry_anyway_{crashed}").click().run()
    assert not at.exception
    rows = jobs(app_db)
    assert len(rows) == 2 and rows[0].status == "queued" and rows[0].payload == {"preset": "quick-demo"}
