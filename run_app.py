"""Start Compatibility Lab: the engine worker and the Streamlit dashboard, as two child processes.

    python run_app.py                      # http://127.0.0.1:8501, opens a browser
    python run_app.py --no-browser --port 8600 --db sqlite:////srv/compatlab.db

Both children get the database URL in ``COMPATLAB_DB_URL``. On a first start with an empty database
the ``quick-demo`` study is queued (unless ``--no-demo``). Ctrl-C stops both; if one of them exits,
the other is stopped too and the exit code is passed on.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
STOP_GRACE_S = 10.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Start the Compatibility Lab engine worker and dashboard.")
    p.add_argument("--port", type=int, default=8501, help="dashboard port (default 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser (servers)")
    p.add_argument("--db", metavar="URL", help="database URL (default: $COMPATLAB_DB_URL or sqlite:///data/compatlab.db)")
    p.add_argument("--no-demo", action="store_true", help="do not queue the quick-demo study on an empty database")
    return p.parse_args(argv)


def queue_demo_if_empty(url: str) -> int | None:
    """Queue the quick-demo preset when the database has no experiment and no job; return the job id."""
    from storage import enqueue_job, get_engine, init_db, list_experiments, list_jobs, session_scope

    engine = get_engine(url)
    init_db(engine)
    with session_scope(engine) as s:
        if list_experiments(s) or list_jobs(s, limit=1):
            return None
        return enqueue_job(s, "run", {"preset": "quick-demo"})


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM (e.g. from a service manager) stops like Ctrl-C."""
    raise KeyboardInterrupt


def _sqlite_file(url: str) -> Path | None:
    from sqlalchemy import make_url

    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() == "sqlite" and database and database != ":memory:" and not database.startswith("file:"):
        return Path(database).expanduser()
    return None


def absolute_url(url: str) -> str:
    """A SQLite URL with a relative path made absolute from the current directory (the children run in the repo)."""
    path = _sqlite_file(url)
    if path is None or path.is_absolute():
        return url
    from sqlalchemy import make_url

    return make_url(url).set(database=str(Path.cwd() / path)).render_as_string(hide_password=False)


def checkpoint_dir(url: str) -> Path:
    """Where the worker keeps checkpoints: beside a SQLite file (``data/compatlab.db`` -> ``data/checkpoints``),
    so two databases never share (and overwrite) ``experiment_<id>`` folders; ``data/checkpoints`` otherwise."""
    path = _sqlite_file(url)
    return (path.parent if path is not None else ROOT / "data") / "checkpoints"


def child_commands(args: argparse.Namespace, url: str) -> dict[str, list[str]]:
    """The two children: the engine worker and the Streamlit server (the database URL goes in the environment)."""
    return {
        "worker": [sys.executable, "-m", "engine", "worker", "--checkpoints", str(checkpoint_dir(url))],
        "dashboard": [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "main.py"),
                      "--server.address", args.host, "--server.port", str(args.port),
                      "--server.headless", "true" if args.no_browser else "false",
                      "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"],
    }


def stop(processes: dict[str, subprocess.Popen]) -> None:
    """SIGTERM each running child, then SIGKILL what is still alive after the grace period."""
    for proc in processes.values():
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in processes.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from storage import DatabaseUnavailable, default_db_url, get_engine

    try:  # a bad URL, a missing driver, a read-only or corrupt file: one line, password masked
        get_engine(args.db or default_db_url())
        url = absolute_url(args.db or default_db_url())
        job = None if args.no_demo else queue_demo_if_empty(url)
    except DatabaseUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    env = {**os.environ, "COMPATLAB_DB_URL": url, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if job is not None:
        print(f"empty database: queued the quick-demo study (job #{job})", flush=True)

    commands = child_commands(args, url)
    processes: dict[str, subprocess.Popen] = {}
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        for name, cmd in commands.items():
            processes[name] = subprocess.Popen(cmd, cwd=ROOT, env=env)
        print(f"Compatibility Lab: http://{args.host}:{args.port}  (database {url}; Ctrl-C stops)", flush=True)
        while True:
            for name, proc in processes.items():
                code = proc.poll()
                if code is not None:
                    other = "dashboard" if name == "worker" else "worker"
                    print(f"the {name} exited with code {code}; stopping the {other}", file=sys.stderr, flush=True)
                    return code or 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("stopping the worker and the dashboard", flush=True)
        return 0
    finally:
        stop(processes)


if __name__ == "__main__":
    sys.exit(main())
