"""Shared by several test modules; moved from tests/test_browser.py."""
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

CHROMIUM = "/usr/bin/chromium"


def missing_browser() -> str | None:
    """Why the browser tests cannot run here (Debian's chromium or the playwright package missing), or None."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} not found: install it with `apt-get install -y chromium`"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright==1.64.1; no browser download needed)"
    return None


if missing_browser():  # a test module importing these helpers is skipped, with the reason
    pytest.skip(missing_browser(), allow_module_level=True)

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402
from playwright.sync_api import TimeoutError as PlaywrightTimeout  # noqa: E402, F401 (the browser tests' own name)

from storage import get_engine, list_jobs, session_scope  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


START_TIMEOUT_S = 180


ANALYSIS_TIMEOUT_S = 300


UI_TIMEOUT_MS = 120_000  # generous: other processes may load the CPU while the page runs its script


POLL_S = 0.5  # interval between two looks at the database (not a wait for something to happen)


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


def _no_terminal_env(home: Path) -> dict[str, str]:
    """This environment as a service manager or an IDE's run button gives it: an empty HOME (no
    ~/.streamlit/credentials.toml), no display and no ``$BROWSER`` (so run_app.py opens none)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME")}
    return {**env, "HOME": str(home)}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The README's start command (``python run_app.py``; only the port, the database and --no-demo added) with no
    terminal: stdin closed, its own session, output to a log file, an empty HOME."""
    tmp = tmp_path_factory.mktemp("browser")
    home = tmp / "home"
    home.mkdir()
    port, url = _free_port(), f"sqlite:///{tmp / 'browser.db'}"
    log = tmp / "run_app.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "run_app.py", "--port", str(port), "--db", url, "--no-demo"],
                                cwd=ROOT, env=_no_terminal_env(home), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
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


def script_done(page: Page) -> None:
    """Wait until no script run (page or fragment) is in progress: the app's own run state, which the status widget
    shows only after a delay (a page screenshotted on that widget alone can be a title and nothing else)."""
    expect(page.locator('[data-testid="stApp"]')).to_have_attribute("data-test-script-state", "notRunning",
                                                                     timeout=UI_TIMEOUT_MS)


def settle(page: Page) -> None:
    """Wait until the page's script has run: a title is shown, the run is over, no 'running' widget, spinner or
    placeholder left."""
    expect(page.locator('[data-testid="stMain"] h1').first).to_be_visible(timeout=UI_TIMEOUT_MS)
    script_done(page)
    expect(page.locator('[data-testid="stStatusWidget"], [data-testid="stSpinner"], [data-testid="stSkeleton"]')
           ).to_have_count(0, timeout=UI_TIMEOUT_MS)


def charts_drawn(page: Page) -> None:
    """Wait until every Vega-Lite chart on the page has drawn something with a size (those in a closed expander are
    drawn when it opens)."""
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('[data-testid=stVegaLiteChart]')).every(e =>"
        " e.closest('details:not([open])') !== null ||"
        " (e.getBoundingClientRect().height > 0 && e.querySelector('canvas, svg') !== null))", timeout=UI_TIMEOUT_MS)


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

