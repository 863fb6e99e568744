"""The README's start command, as a service manager, an IDE or CI runs it: no terminal, stdin closed, output to
files, an empty HOME (no ~/.streamlit/credentials.toml).

The dashboard must come up (its health endpoint answers ``ok``) with no first-run e-mail prompt and no usage-statistics
notice, the workers must use ``cores // workers`` threads, the browser is opened by run_app.py once the dashboard
answers (a recording ``$BROWSER``) and its absence is no error; SIGTERM stops every process started. Streamlit's one
outside lookup (the external IP) is answered locally. Every wait is on a condition, with a deadline.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

import run_app
from engine.core import threads

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 300  # a loaded 2-core machine: importing torch and streamlit alone can take tens of seconds
T = TypeVar("T")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX sessions and signals")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(what: str, check: Callable[[], T], logs: list[Path]) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` and the logs' tails at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while not (value := check()):
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
            pytest.fail(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.2)
    return value


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _bare_env(home: Path, **extra: str) -> dict[str, str]:
    """A service manager's environment: PATH, an empty HOME, no display, no browser, no thread or project settings."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONPATH": str(ROOT),
           "LANG": "C.UTF-8", **extra}
    return env


def _start_readme_command(tmp_path: Path, port: int, env: dict[str, str]) -> tuple[subprocess.Popen, Path, Path]:
    """``python run_app.py`` (the README's command) with a port and a database of its own, no terminal."""
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([sys.executable, "run_app.py", "--port", str(port), "--db",
                                 f"sqlite:///{tmp_path / 'lab.db'}", "--no-demo"], cwd=ROOT, env=env,
                                stdin=subprocess.DEVNULL, stdout=o, stderr=e, start_new_session=True)
    return proc, out, err


def _stop_and_check_everything_ends(proc: subprocess.Popen, logs: list[Path]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=DEADLINE_S) == 0
    finally:
        _wait_for("every child of run_app.py to end", lambda: _group_gone(proc.pid), logs)


def _expected_worker_threads() -> int:
    """run_app.py's workers share the cores: idle, each reports every core (a job then takes cores // jobs running)."""
    assert "--share-cores" in run_app.child_commands(run_app.parse_args(["--no-browser"]), "sqlite:////srv/x.db")["worker"]
    return threads.available_cores()


def _check_a_quiet_headless_start(out: Path, err: Path, port: int) -> str:
    text = out.read_text(errors="replace") + err.read_text(errors="replace")
    assert "Email" not in text, "Streamlit's first-run e-mail prompt"
    assert not re.search(r"usage statistics|gatherUsageStats", text, re.IGNORECASE), "the telemetry notice"
    assert "streamlit skills" not in text and "External URL" not in text
    assert f"URL: http://127.0.0.1:{port}" in text
    return text


def test_the_readme_command_starts_headless_without_a_terminal_or_a_browser(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    port = _free_port()
    proc, out, err = _start_readme_command(tmp_path, port, _bare_env(home))
    logs = [out, err]
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_for("the dashboard's health endpoint", lambda: run_app.dashboard_ready(url) or proc.poll() is not None,
                  logs)
        assert proc.poll() is None, f"run_app.py exited with {proc.returncode}\n{err.read_text()[-3000:]}"
        # both workers report the thread count they use (torch.get_num_threads() in each)
        counts = _wait_for("both workers' thread lines", lambda: (found := re.findall(
            r"worker \d+: (\d+) compute thread\(s\) \(torch (\d+)", out.read_text())) and len(found) >= 2 and found,
            logs)
        expected = _expected_worker_threads()
        assert all(int(n) == int(t) == expected for n, t in counts), (counts, expected)
        text = _check_a_quiet_headless_start(out, err, port)
        assert "could not open a browser" not in text, "with no display there is nothing to try"
        assert proc.poll() is None, "the dashboard stays up with no browser"
        _stop_and_check_everything_ends(proc, logs)
    finally:
        if not _group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


def test_the_browser_opens_once_the_dashboard_answers(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    port = _free_port()
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"  # $BROWSER: records the address and whether the dashboard answered by then
    check = ("import sys, urllib.request; o = urllib.request.build_opener(urllib.request.ProxyHandler({})); "
             "h = o.open(sys.argv[1] + '/_stcore/health', timeout=30).read().decode(); "
             "open(sys.argv[2] + '.tmp', 'w').write(sys.argv[1] + ' ' + h); "
             "import os; os.replace(sys.argv[2] + '.tmp', sys.argv[2])")
    browser.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "{check}" "$1" "{opened}"\n')
    browser.chmod(0o755)
    proc, out, err = _start_readme_command(tmp_path, port, _bare_env(home, BROWSER=str(browser)))
    logs = [out, err]
    try:
        _wait_for("the browser to be opened", lambda: opened.exists() or proc.poll() is not None, logs)
        assert proc.poll() is None, f"run_app.py exited with {proc.returncode}\n{err.read_text()[-3000:]}"
        assert opened.read_text() == f"http://127.0.0.1:{port} ok"
        _check_a_quiet_headless_start(out, err, port)
        _stop_and_check_everything_ends(proc, logs)
    finally:
        if not _group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("failure", ["returns False", "raises"])
def test_a_browser_that_fails_to_open_is_no_error(monkeypatch, capsys, failure):
    def fail(url):
        if failure == "raises":
            raise run_app.webbrowser.Error("could not locate runnable browser")
        return False

    monkeypatch.setattr(run_app, "dashboard_ready", lambda url: True)
    monkeypatch.setattr(run_app.webbrowser, "open", fail)
    run_app.open_browser_when_ready("http://127.0.0.1:9", run_app.threading.Event())
    assert capsys.readouterr().out == "could not open a browser; open http://127.0.0.1:9\n"


def test_nothing_is_opened_once_stopped(monkeypatch):
    stop = run_app.threading.Event()
    stop.set()
    monkeypatch.setattr(run_app, "dashboard_ready", lambda url: False)
    monkeypatch.setattr(run_app.webbrowser, "open", lambda url: pytest.fail("opened a browser after the stop"))
    run_app.open_browser_when_ready("http://127.0.0.1:9", stop)  # returns: the dashboard is gone


def test_no_browser_is_tried_without_a_display(monkeypatch):
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"):
        monkeypatch.delenv(name, raising=False)
    assert run_app.can_open_browser() is (sys.platform in ("darwin", "win32"))
    monkeypatch.setenv("DISPLAY", ":0")
    assert run_app.can_open_browser()


def test_the_dashboard_command_is_headless_and_quiet_whatever_the_options():
    for argv in ([], ["--no-browser"], ["--host", "0.0.0.0"], ["--host", "::1"]):
        args = run_app.parse_args(argv)
        cmd = run_app.dashboard_command(args)
        option = {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i].startswith("--")}
        assert option["--server.headless"] == "true" and option["--server.showEmailPrompt"] == "false"
        assert option["--browser.gatherUsageStats"] == "false"
        assert option["--browser.serverAddress"] == {"0.0.0.0": "localhost", "::1": "[::1]"}.get(args.host, args.host)


def test_streamlit_looks_up_no_external_address(monkeypatch):
    """The origin check of a cross-origin WebSocket would fetch checkip.amazonaws.com; with the launcher's patch it
    refuses the origin without a request."""
    import requests
    from streamlit import net_util
    from streamlit.web.server import server_util

    calls: list[str] = []

    def no_network(url, *args, **kwargs):
        calls.append(url)
        raise requests.ConnectionError("no network in tests")

    monkeypatch.setattr(requests, "get", no_network)
    monkeypatch.setattr(net_util, "_external_ip", None)
    monkeypatch.setattr(net_util, "get_external_ip", net_util.get_external_ip)  # restored after the test
    assert server_util.is_url_from_allowed_origins("http://elsewhere.example") is False
    assert calls, "unpatched, Streamlit asks an outside server for this machine's address"
    calls.clear()
    exec(run_app.STREAMLIT_OFFLINE, {})
    assert server_util.is_url_from_allowed_origins("http://elsewhere.example") is False
    assert server_util.is_url_from_allowed_origins("http://127.0.0.1:8501") is True
    assert calls == []
