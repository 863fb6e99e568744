"""run_app.py: the demo is queued on an empty database only, and the two children live and die together."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

import run_app
from storage import create_experiment, get_engine, init_db, list_jobs, session_scope


def _jobs(url: str) -> list:
    with session_scope(get_engine(url)) as s:
        return list_jobs(s)


def test_demo_is_queued_on_an_empty_database_only(db_url):
    assert run_app.queue_demo_if_empty(db_url) is not None
    (job,) = _jobs(db_url)
    assert job.kind == "run" and job.payload == {"preset": "quick-demo"}
    assert run_app.queue_demo_if_empty(db_url) is None, "a second start queues nothing"


def test_no_demo_when_there_are_experiments(db_url):
    init_db(get_engine(db_url))
    with session_scope(get_engine(db_url)) as s:
        create_experiment(s, name="old", method="bct", config={}, config_hash="h")
    assert run_app.queue_demo_if_empty(db_url) is None and _jobs(db_url) == []


def test_arguments():
    args = run_app.parse_args(["--port", "8600", "--no-browser", "--db", "sqlite:///x.db", "--no-demo"])
    assert (args.port, args.no_browser, args.db, args.no_demo, args.host) == (8600, True, "sqlite:///x.db", True,
                                                                               "127.0.0.1")
    commands = run_app.child_commands(args, "sqlite:////srv/lab/x.db")
    dashboard = commands["dashboard"]
    assert dashboard[dashboard.index("--server.address") + 1] == "127.0.0.1"
    assert dashboard[dashboard.index("--server.headless") + 1] == "true"
    assert commands["worker"][1:] == ["-m", "engine", "worker", "--checkpoints", "/srv/lab/checkpoints"]


def test_checkpoints_live_beside_the_database():
    assert run_app.checkpoint_dir("sqlite:////tmp/a/lab.db") == run_app.Path("/tmp/a/checkpoints")
    assert run_app.checkpoint_dir("postgresql://u@h/lab") == run_app.ROOT / "data" / "checkpoints"


def test_relative_sqlite_paths_are_made_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert run_app.absolute_url("sqlite:///lab/x.db") == f"sqlite:///{tmp_path}/lab/x.db"
    assert run_app.absolute_url("sqlite:////srv/x.db") == "sqlite:////srv/x.db"
    assert run_app.absolute_url("postgresql://u@h/lab") == "postgresql://u@h/lab"


def _children(monkeypatch, worker: str, dashboard: str) -> None:
    monkeypatch.setattr(run_app, "child_commands", lambda args, url: {"worker": [sys.executable, "-c", worker],
                                                                 "dashboard": [sys.executable, "-c", dashboard]})


def test_when_one_child_exits_the_other_is_stopped(monkeypatch, db_url):
    _children(monkeypatch, "import sys; sys.exit(3)", "import time; time.sleep(120)")
    started = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(run_app.subprocess, "Popen", lambda *a, **k: started.append(real_popen(*a, **k)) or started[-1])
    t0 = time.monotonic()
    assert run_app.main(["--no-demo", "--db", db_url]) == 3
    assert time.monotonic() - t0 < 20
    assert all(p.poll() is not None for p in started), "the dashboard was left running"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_stops_both_children(monkeypatch, db_url):
    _children(monkeypatch, "import time; time.sleep(120)", "import time; time.sleep(120)")
    started = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(run_app.subprocess, "Popen", lambda *a, **k: started.append(real_popen(*a, **k)) or started[-1])
    previous = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(2.0, lambda: signal.raise_signal(signal.SIGTERM))
    timer.start()
    try:
        assert run_app.main(["--no-demo", "--db", db_url]) == 0
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)
    assert len(started) == 2 and all(p.poll() is not None for p in started)
