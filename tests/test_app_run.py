"""run_app.py: demo on an empty database, supervisor (worker restarts, dashboard exit), host binding, secret."""
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


def test_arguments(monkeypatch):
    monkeypatch.delenv("COMPATLAB_THREADS", raising=False)
    args = run_app.parse_args(["--port", "8600", "--no-browser", "--db", "sqlite:///x.db", "--no-demo"])
    assert (args.port, args.no_browser, args.db, args.no_demo, args.host) == (8600, True, "sqlite:///x.db", True,
                                                                               "127.0.0.1")
    commands = run_app.child_commands(args, "sqlite:////srv/lab/x.db")
    dashboard = commands["dashboard"]
    assert dashboard[dashboard.index("--server.address") + 1] == "127.0.0.1"
    assert dashboard[dashboard.index("--server.headless") + 1] == "true"
    assert commands["worker"][1:] == ["-m", "engine", "worker", "--checkpoints", "/srv/lab/checkpoints/x.db", "--share-cores"]


def test_checkpoints_live_beside_the_database(tmp_path):
    # one folder per database file (two files in one folder stay apart), a hashed one per server database
    assert run_app.checkpoint_dir(f"sqlite:///{tmp_path}/lab.db") == tmp_path.resolve() / "checkpoints" / "lab.db"
    server = run_app.checkpoint_dir("postgresql://u:secret@h/lab")
    assert server.parent == run_app.ROOT / "data" / "checkpoints" and server.name.startswith("postgresql-")
    assert "secret" not in str(server) and server == run_app.checkpoint_dir("postgresql://u:other@h/lab")


def test_relative_sqlite_paths_are_made_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert run_app.absolute_url("sqlite:///lab/x.db") == f"sqlite:///{tmp_path}/lab/x.db"
    assert run_app.absolute_url("sqlite:////srv/x.db") == "sqlite:////srv/x.db"
    assert run_app.absolute_url("postgresql://u@h/lab") == "postgresql://u@h/lab"


def _children(monkeypatch, worker: str, dashboard: str) -> None:
    monkeypatch.setattr(run_app, "child_commands", lambda args, url: {"worker": [sys.executable, "-c", worker],
                                                                 "dashboard": [sys.executable, "-c", dashboard]})


def _record_popen(monkeypatch) -> list[subprocess.Popen]:
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(run_app.subprocess, "Popen", lambda *a, **k: started.append(real_popen(*a, **k)) or started[-1])
    return started


def test_when_the_dashboard_exits_the_worker_is_stopped(monkeypatch, db_url):
    _children(monkeypatch, "import time; time.sleep(120)", "import sys; sys.exit(3)")
    started = _record_popen(monkeypatch)
    assert run_app.main(["--no-demo", "--db", db_url]) == 3
    assert len(started) == 2 and all(p.poll() is not None for p in started), "the worker was left running"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_dead_worker_is_restarted_and_the_dashboard_stays(monkeypatch, db_url, capsys):
    _children(monkeypatch, "import sys; sys.exit(3)", "import time; time.sleep(120)")
    monkeypatch.setattr(run_app, "BACKOFF_START_S", 0.05)
    started = _record_popen(monkeypatch)
    previous = signal.getsignal(signal.SIGTERM)

    def stop_after_three_restarts() -> None:  # three deaths recorded, each followed by a new worker
        while sum(p.args[-1] == "import sys; sys.exit(3)" for p in started) < 4:
            time.sleep(0.05)
        signal.raise_signal(signal.SIGTERM)

    watcher = threading.Thread(target=stop_after_three_restarts, daemon=True)
    watcher.start()
    try:
        assert run_app.main(["--no-demo", "--db", db_url]) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    dashboards = [p for p in started if p.args[-1] != "import sys; sys.exit(3)"]
    assert len(dashboards) == 1 and all(p.poll() is not None for p in started)
    assert capsys.readouterr().err.count("worker exited with code 3; restarting the worker in") >= 3


def test_backoff_doubles_up_to_a_minute():
    assert [run_app.backoff_s(n) for n in (1, 2, 3, 4, 6, 7, 20)] == [1, 2, 4, 8, 32, 60, 60]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts_need_no_secret(host):
    args = run_app.parse_args(["--host", host])
    assert run_app.is_loopback(host) and run_app.check_binding(args, None) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.4", "::", "example.org", "127.0.0.1.nip.io"])
def test_network_hosts_refuse_to_start_without_a_secret(host, db_url, capsys):
    assert run_app.main(["--host", host, "--no-demo", "--db", db_url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --host {host} would let anyone on the network use")


def test_a_secret_allows_a_network_host_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.delenv(run_app.SECRET_ENV, raising=False)
    secret = tmp_path / "secret"
    secret.write_text("  s3cret-s3cret-s3cret\n")
    args = run_app.parse_args(["--host", "0.0.0.0", "--port", "8600", "--secret-file", str(secret)])
    assert run_app.read_secret(args) == "s3cret-s3cret-s3cret"
    assert "reachable from the network" in run_app.check_binding(args, "s3cret-s3cret-s3cret")
    assert "s3cret" not in " ".join(run_app.child_commands(args, "sqlite:////x.db")["dashboard"])
    monkeypatch.setenv(run_app.SECRET_ENV, "from-env-from-env-from-env")
    assert run_app.read_secret(run_app.parse_args(["--host", "0.0.0.0"])) == "from-env-from-env-from-env"
    secret.write_text(" \n")
    with pytest.raises(ValueError, match="is empty"):
        run_app.read_secret(args)
    with pytest.raises(ValueError, match="cannot read the secret file"):
        run_app.read_secret(run_app.parse_args(["--secret-file", str(tmp_path / "missing")]))


def test_the_secret_reaches_only_the_dashboard_and_only_through_its_environment(monkeypatch, db_url, tmp_path):
    monkeypatch.delenv(run_app.SECRET_ENV, raising=False)
    secret = tmp_path / "secret"
    secret.write_text("s3cret-s3cret-s3cret")
    _children(monkeypatch, "import time; time.sleep(120)", "import sys; sys.exit(0)")
    seen = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(run_app.subprocess, "Popen",
                        lambda cmd, **k: seen.append((cmd, k["env"])) or real_popen(cmd, **k))
    run_app.main(["--no-demo", "--db", db_url, "--secret-file", str(secret)])
    (worker_cmd, worker_env), (dash_cmd, dash_env) = seen
    assert dash_env[run_app.SECRET_ENV] == "s3cret-s3cret-s3cret" and run_app.SECRET_ENV not in worker_env
    assert "s3cret" not in " ".join(worker_cmd + dash_cmd)


def test_the_console_masks_the_database_password(monkeypatch, capsys):
    _children(monkeypatch, "import time; time.sleep(120)", "import sys; sys.exit(0)")
    url = "postgresql://lab:hunter2@db.example/lab"
    monkeypatch.setattr("storage.get_engine", lambda url: None)  # no PostgreSQL here: only the printed line matters
    monkeypatch.setattr("storage.init_db", lambda engine, **kw: None)
    monkeypatch.setattr("storage.write_problem", lambda engine: None)
    run_app.main(["--no-demo", "--db", url])
    out = capsys.readouterr().out
    assert "database postgresql://lab:***@db.example/lab" in out and "hunter2" not in out


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
