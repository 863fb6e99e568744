"""End to end in a real browser: ``python run_app.py`` (worker + dashboard) driven with Playwright + Chromium.

Launches a tiny study from the New-experiment form (digits, 2 steps, 1 epoch, 1 method), waits for the
engine worker to finish it, then opens every page, computes a feature map and backfilling curves through
the worker, and checks that no page shows an exception and every chart has a size. Screenshots go to
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
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
START_TIMEOUT_S = 120
JOB_TIMEOUT_S = 420  # a 2-step digits run with 1 epoch takes well under a minute on a CPU
ANALYSIS_TIMEOUT_S = 240
PAGES = {"overview": "", "new_experiment": "new_experiment", "compatibility": "compatibility",
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

from playwright.sync_api import Page, sync_playwright  # noqa: E402

from storage import get_engine, list_jobs, session_scope  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


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
    while True:
        if proc.poll() is not None:
            pytest.fail(f"run_app.py exited with code {proc.returncode} before the dashboard was up:\n{_log_tail(log)}")
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the dashboard did not answer /_stcore/health within {START_TIMEOUT_S} s:\n{_log_tail(log)}")
        time.sleep(0.5)
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


def settle(page: Page, seconds: float = 1.5) -> None:
    """Wait for the script run to finish (no 'running' status widget), then a moment for charts to draw."""
    page.wait_for_selector('[data-testid="stMain"] h1', timeout=90_000)  # every page has a title
    time.sleep(0.5)
    deadline = time.monotonic() + 60
    busy = '[data-testid="stStatusWidget"], [data-testid="stSpinner"]'
    while page.locator(busy).count() and time.monotonic() < deadline:
        time.sleep(0.3)
    time.sleep(seconds)


def check_page(page: Page, name: str, shots: Path) -> None:
    page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    errors = page.locator('[data-testid="stException"]')
    assert errors.count() == 0, f"{name} shows an exception:\n{errors.first.inner_text()[:2000]}"
    heights = page.evaluate("Array.from(document.querySelectorAll('[data-testid=stVegaLiteChart]'))"
                            ".map(e => e.getBoundingClientRect().height)")
    assert all(h > 0 for h in heights), f"{name}: a chart failed to draw (heights {heights})"


def _appears(page, text: str, timeout_ms: int = 20_000) -> bool:
    try:
        page.get_by_text(text).wait_for(timeout=timeout_ms)
        return True
    except Exception:  # playwright's TimeoutError
        return False


def wait_for_job(db_url: str, kind: str, timeout: float, log: Path):
    """The newest job of ``kind`` once finished; fails with its message if it failed or never finished."""
    deadline = time.monotonic() + timeout
    while True:
        with session_scope(get_engine(db_url)) as s:
            job = next(iter(list_jobs(s, kind=kind, limit=1)), None)
        if job is not None and job.status == "done":
            return job
        if job is not None and job.status in ("failed", "cancelled"):
            pytest.fail(f"{kind} job #{job.id} {job.status}: {job.message}\n{job.error or ''}")
        if time.monotonic() > deadline:
            state = "never queued" if job is None else f"still {job.status} ({job.progress:.0%}, {job.message!r})"
            pytest.fail(f"the {kind} job did not finish within {timeout:.0f} s: {state}. Is the engine worker "
                        f"(`python -m engine worker`) implemented and running?\n{_log_tail(log)}")
        time.sleep(2)


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
    page.locator(".st-key-ne_preset_choice").click()
    page.get_by_role("option", name="digits-tiny").click()
    settle(page)
    field = lambda key: page.locator(f".st-key-ne_{key} input")  # noqa: E731  (Streamlit marks widgets by key)
    field("name").fill("browser-e2e")
    field("epochs").fill("1")
    methods = field("methods")
    methods.click()
    for _ in range(6):  # remove the preset's methods, then choose one
        methods.press("Backspace")
    methods.fill("independent")
    methods.press("Enter")
    page.keyboard.press("Escape")
    page.get_by_role("button", name="Launch").click()
    page.get_by_text("Queued job #").wait_for(timeout=30_000)
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
    settle(page, 3)
    check_page(page, "overview_done", shots)
    assert page.locator('[data-testid="stMetricValue"]').nth(2).inner_text().strip() == "1", \
        "Overview should count one finished experiment"

    page.goto(f"{base}/compatibility")
    settle(page, 3)
    check_page(page, "compatibility", shots)
    assert page.locator('[data-testid="stVegaLiteChart"]').count() >= 1, "the heatmap is drawn"

    # feature map (PCA: instant) and backfilling curves, computed by the worker
    page.goto(f"{base}/geometry")
    settle(page)
    page.get_by_text("PCA", exact=True).click()
    settle(page)
    page.get_by_role("button", name="Compute the feature map").click()
    time.sleep(3)
    wait_for_job(server["db"], "analysis", ANALYSIS_TIMEOUT_S, server["log"])
    if not _appears(page, "Neural collapse"):  # the page's poll missed the finish: a visit shows the stored map
        page.goto(f"{base}/geometry")
        settle(page)
        page.get_by_text("PCA", exact=True).click()
        settle(page)
    page.get_by_text("Neural collapse").wait_for(timeout=30_000)
    settle(page, 3)
    check_page(page, "geometry", shots)

    page.goto(f"{base}/backfilling")
    settle(page)
    page.get_by_role("button", name="Compute the backfilling curves").click()
    time.sleep(3)
    wait_for_job(server["db"], "analysis", ANALYSIS_TIMEOUT_S, server["log"])
    if not _appears(page, "M̃ and the backfilling needed"):
        page.goto(f"{base}/backfilling")
        settle(page)
    page.get_by_text("M̃ and the backfilling needed").wait_for(timeout=30_000)
    settle(page, 3)
    check_page(page, "backfilling", shots)
    page.close()
