"""Start Compatibility Lab: two engine workers and the Streamlit dashboard, as child processes.

    python run_app.py                      # http://127.0.0.1:8501, opens a browser when one can be opened
    python run_app.py --no-browser --port 8600 --db sqlite:////srv/compatlab.db

The children get the database URL in ``COMPATLAB_DB_URL``. One worker takes every job kind; the
other only the short lane (``--kinds analysis adapters checkpoints sources_check``), so a map, an upgrade verdict or a
checkpoint comparison is computed while a training run holds the first. On a first start with an empty database
the ``quick-demo`` study is queued (unless ``--no-demo``). This process supervises them: a worker
that dies (killed for memory, crashed) has its running jobs and experiments failed with the reason
and is restarted after a back-off (1, 2, 4 ... 60 s, reset once a worker has run ``HEALTHY_S``);
Ctrl-C / SIGTERM, or the dashboard exiting, stops everything. On a read-only database only the dashboard
starts: it shows the stored results with Launch disabled (no worker could store anything).

The dashboard always runs headless (no first-run e-mail prompt, no notices, whether or not there is a terminal);
this process opens the browser itself once the dashboard answers its health check. No usage statistics are sent
and Streamlit looks up no outside address. The workers share the cores: each job runs with ``cores // the jobs
running on this machine`` torch / BLAS / numba threads, the dashboard with ``cores // workers`` (``engine.core.threads``;
``--threads N`` or ``$COMPATLAB_THREADS`` gives every child one count).

Binding beyond loopback needs a shared secret (``--secret-file`` or ``$COMPATLAB_SECRET``, at least 16
characters); the dashboard's gate (``app/gate.py``) asks for it before Streamlit serves anything. The secret
reaches the dashboard in its environment, never on a command line.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import webbrowser
from pathlib import Path

from app.gate import SECRET_ENV, check_secret, is_loopback  # stdlib only
from engine.core import threads  # torch-free
from engine.checkpoints.files import add_ceiling_argument, export_ceiling  # torch-free
from engine.core.contract import SHORT_JOB_KINDS, run_preset_payload  # torch-free
from engine.data import roots  # torch-free
from storage.settings import DB_URL, SECRET, check_all, read_setting

ROOT = Path(__file__).resolve().parent
STOP_GRACE_S = 10.0
BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 60.0
HEALTHY_S = 120.0  # a worker that ran this long before dying restarts after the shortest back-off again
POLL_S = 0.5
MAX_UPLOAD_MB = 500  # Streamlit's server.maxUploadSize; the Checkpoints page shows the value Streamlit enforces
# Streamlit's one outside lookup, answered locally: get_external_ip (checkip.amazonaws.com) serves the "External
# URL" line for a wildcard address (browser.serverAddress skips it) and the origin check of a cross-origin
# WebSocket, which no option skips; None there refuses that origin, as Streamlit does offline.
STREAMLIT_OFFLINE = "import streamlit.net_util as net; net.get_external_ip = lambda: None"
STREAMLIT_MAIN = (f"{STREAMLIT_OFFLINE}; import sys; from streamlit.web.cli import main; "
                  "sys.exit(main(prog_name='streamlit'))")  # = python -m streamlit


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Start the Compatibility Lab engine worker and dashboard.")
    p.add_argument("--port", type=int, default=8501, help="dashboard port (default 8501)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only); any other needs a shared secret")
    p.add_argument("--secret-file", metavar="PATH",
                   help=f"file holding the shared secret visitors must enter (or set ${SECRET_ENV})")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser (servers)")
    p.add_argument("--threads", type=int, metavar="N",
                   help=f"torch / BLAS / numba threads of each worker and the dashboard (default: "
                        f"${threads.THREADS_ENV}, else the cores this machine gives us // the number of workers)")
    p.add_argument("--db", metavar="URL", help="database URL (default: $COMPATLAB_DB_URL or sqlite:///data/compatlab.db)")
    p.add_argument("--no-demo", action="store_true", help="do not queue the quick-demo study on an empty database")
    p.add_argument("--max-upload-mb", type=int, default=MAX_UPLOAD_MB, metavar="MB",
                   help=f"largest file the dashboard accepts as an upload, in MB (default {MAX_UPLOAD_MB})")
    roots.add_arguments(p, torchscript=True)
    add_ceiling_argument(p)
    args = p.parse_args(argv)
    if args.max_upload_mb < 1:
        p.error("--max-upload-mb must be at least 1")
    try:
        check_all()  # every COMPATLAB_* variable, so that a bad one stops the start rather than a job
        args.threads = threads.requested(args.threads)  # --threads, else $COMPATLAB_THREADS, else None (the rule)
    except ValueError as exc:
        p.error(str(exc))
    export_ceiling(args)
    roots.export(args)  # --data-root / --allow-torchscript reach both children through the environment
    return args


def queue_demo_if_empty(url: str) -> int | None:
    """Queue the quick-demo preset when the database has no experiment and no job; return the job id."""
    from storage import enqueue_job, get_engine, init_db, list_experiments, list_jobs, session_scope

    engine = get_engine(url)
    init_db(engine)
    with session_scope(engine) as s:
        if list_experiments(s) or list_jobs(s, limit=1):
            return None
        return enqueue_job(s, "run", run_preset_payload("quick-demo"))


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
    """Where the worker keeps checkpoints: the database's own folder (``storage.checkpoint_folders.checkpoint_root``:
    ``data/compatlab.db`` -> ``data/checkpoints/compatlab.db``; a server database: ``data/checkpoints/<backend>-<hash>``
    under this checkout), so two databases never share (and overwrite) ``experiment_<id>`` folders."""
    from storage.checkpoint_folders import checkpoint_root

    return ROOT / checkpoint_root(url)


def browser_host(host: str) -> str:
    """The host part of the dashboard's address in a browser: ``localhost`` for a wildcard address, IPv6 in brackets."""
    if host in ("", "0.0.0.0", "::"):
        return "localhost"
    return f"[{host}]" if ":" in host else host


def dashboard_url(args: argparse.Namespace) -> str:
    """The address to open the dashboard at (and to ask for its health) from this machine."""
    return f"http://{browser_host(args.host)}:{args.port}"


def dashboard_command(args: argparse.Namespace) -> list[str]:
    """Streamlit, headless whatever the terminal (no e-mail prompt, notice or advert: this process opens the browser),
    no usage statistics, the address to show set (so no external IP is looked up for it)."""
    return [sys.executable, "-c", STREAMLIT_MAIN, "run", str(ROOT / "app" / "main.py"),
            "--server.address", args.host, "--server.port", str(args.port),
            "--server.headless", "true", "--server.showEmailPrompt", "false",
            "--browser.gatherUsageStats", "false", "--browser.serverAddress", browser_host(args.host),
            "--server.maxUploadSize", str(args.max_upload_mb), "--client.toolbarMode", "minimal"]


def dashboard_ready(url: str) -> bool:
    """Whether the dashboard at ``url`` answers its health check (directly: never through a proxy)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url}/_stcore/health", timeout=5) as response:
            return response.status == 200 and response.read().strip() == b"ok"
    except OSError:
        return False


def can_open_browser() -> bool:
    """Whether a browser window can be opened here: on macOS and Windows, or with a display or ``$BROWSER`` set
    (never a text browser taking over the terminal)."""
    if sys.platform in ("darwin", "win32"):
        return True
    return any(os.environ.get(name) for name in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"))


def open_browser_when_ready(url: str, stop: threading.Event) -> None:
    """Open ``url`` in the user's browser once the dashboard answers (unless ``stop`` is set first); a browser that
    fails to open is said in one line, not an error."""
    while not dashboard_ready(url):
        if stop.wait(POLL_S):
            return
    try:
        opened = webbrowser.open(url)
    except (webbrowser.Error, OSError):
        opened = False
    if not opened and not stop.is_set():
        print(f"could not open a browser; open {url}", flush=True)


def child_commands(args: argparse.Namespace, url: str) -> dict[str, list[str]]:
    """The children: the engine worker (every job kind), the short-lane worker (analysis, adapters and checkpoints
    jobs only, so they never wait behind training) and the Streamlit server (the database URL goes in the environment)."""
    worker = [sys.executable, "-m", "engine", "worker", "--checkpoints", str(checkpoint_dir(url)),
              *(["--share-cores"] if args.threads is None else [])]
    return {
        "worker": worker,
        "short-job worker": [*worker, "--kinds", *SHORT_JOB_KINDS],
        "dashboard": dashboard_command(args),
    }


def read_secret(args: argparse.Namespace) -> str | None:
    """The shared secret from ``--secret-file`` (surrounding whitespace stripped) or ``$COMPATLAB_SECRET``;
    ValueError when it is shorter than ``app.gate.MIN_SECRET_CHARS``."""
    if args.secret_file:
        try:
            secret = Path(args.secret_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the secret file {args.secret_file}: {exc}") from None
        if not secret:
            raise ValueError(f"the secret file {args.secret_file} is empty")
        return check_secret(secret)
    secret = read_setting(SECRET)
    return check_secret(secret) if secret else None


def check_binding(args: argparse.Namespace, secret: str | None) -> str | None:
    """Refuse a non-loopback ``--host`` without a secret (ValueError); return a warning to print, if any."""
    if is_loopback(args.host):
        return None
    if secret is None:
        raise ValueError(f"--host {args.host} would let anyone on the network use the dashboard; give a shared secret "
                         f"with --secret-file PATH or ${SECRET_ENV}, or bind to 127.0.0.1")
    return (f"warning: the dashboard listens on {args.host}:{args.port} and is reachable from the network; "
            "visitors must enter the shared secret")


def backoff_s(failures: int) -> float:
    """Seconds to wait before restarting a worker after its ``failures``-th death in a row: 1, 2, 4 ... 60."""
    return min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** max(0, failures - 1))


def record_worker_death(url: str, pid: int, returncode: int) -> str:
    """Fail the jobs the dead worker ``pid`` was running (and their experiments) with the reason; return a line.

    Only jobs claimed by this machine's ``pid`` in this boot (host, boot id, pid): on a database shared with other
    machines, their workers' jobs under the same pid are left alone (their own leases and heartbeats tell).
    """
    from storage import fail_jobs_of_worker, get_engine, session_scope, worker_exit_reason
    from storage.identity import identity

    reason = worker_exit_reason(returncode)
    try:
        with session_scope(get_engine(url)) as s:
            jobs = fail_jobs_of_worker(s, identity(pid), reason)
    except Exception as exc:  # noqa: BLE001 - the database is unreachable: say so, keep supervising
        return f"{reason}; could not mark its jobs failed: {type(exc).__name__}: {exc}"
    return f"{reason}; failed job(s): {', '.join(f'#{j}' for j in jobs)}" if jobs else reason


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



def supervise(commands: dict[str, list[str]], envs: dict[str, dict[str, str]], url: str,
              processes: dict[str, subprocess.Popen]) -> int:
    """Run the children until the dashboard exits (return its code); restart a dead worker after a back-off.

    Every child but ``dashboard`` is a worker, supervised on its own (its own back-off). ``processes`` holds the
    live children (the caller stops them). Returns only when the dashboard exits.
    """
    def start(name: str) -> float:
        processes[name] = subprocess.Popen(commands[name], cwd=ROOT, env=envs[name])
        return time.monotonic()

    workers = [name for name in commands if name != "dashboard"]
    started = {name: start(name) for name in workers}
    start("dashboard")
    failures = dict.fromkeys(workers, 0)
    restart_at: dict[str, float | None] = dict.fromkeys(workers)
    while True:
        code = processes["dashboard"].poll()
        if code is not None:
            print(f"the dashboard exited with code {code}; stopping the workers", file=sys.stderr, flush=True)
            return code or 1
        now = time.monotonic()
        for name in workers:
            if restart_at[name] is None and (code := processes[name].poll()) is not None:
                failures[name] = 1 if now - started[name] >= HEALTHY_S else failures[name] + 1
                restart_at[name] = now + backoff_s(failures[name])
                line = record_worker_death(url, processes[name].pid, code)
                print(f"{line}; restarting the {name} in {backoff_s(failures[name]):g} s", file=sys.stderr, flush=True)
            elif restart_at[name] is not None and now >= restart_at[name]:
                started[name], restart_at[name] = start(name), None
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from storage import DatabaseUnavailable, default_db_url, get_engine, init_db, mask_url, write_problem
    from storage.db import READ_ONLY

    try:
        secret = read_secret(args)
        warning = check_binding(args, secret)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # a bad URL, a missing driver, a read-only or corrupt file: one line, password masked
        get_engine(args.db or default_db_url())
        url = absolute_url(args.db or default_db_url())
        init_db(get_engine(url), writable=False)  # before the children start: an older database gains its new columns once
        read_only = write_problem(get_engine(url))
        if read_only is not None and READ_ONLY not in read_only:  # locked, unreachable...: refused as before
            raise DatabaseUnavailable(read_only)
        job = None if args.no_demo or read_only else queue_demo_if_empty(url)
    except DatabaseUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    # the children import the checkout this file is in, whichever copy of the package is installed
    env = {**os.environ, DB_URL.name: url, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop(SECRET_ENV, None)
    if job is not None:
        print(f"empty database: queued the quick-demo study (job #{job})", flush=True)

    commands = child_commands(args, url)
    # threads (set before a child loads torch or numpy): the user's count for every child; else the workers share
    # the cores (pools sized at every core; each job takes cores // the jobs running here) and the dashboard, which
    # computes only for the Learn pages in short bursts, takes cores // workers
    workers = sum(name != "dashboard" for name in commands)
    if args.threads is not None:
        env.update(threads.thread_env(args.threads))
        dashboard_env = env
    else:
        env.update(threads.library_env(threads.available_cores()))
        dashboard_env = {**env, **threads.thread_env(threads.per_process(processes=workers))}
    if read_only:  # the dashboard alone: it shows the stored results and disables Launch; a worker could write nothing
        commands = {"dashboard": commands["dashboard"]}
        print(f"{read_only}; showing the stored results with Launch disabled (no workers started)", flush=True)
    processes: dict[str, subprocess.Popen] = {}
    signal.signal(signal.SIGTERM, _interrupt)
    # the secret goes to the dashboard alone, in its environment: never on a command line
    envs = {**dict.fromkeys(commands, env),
            "dashboard": dashboard_env if secret is None else {**dashboard_env, SECRET_ENV: secret}}
    browser_stop = threading.Event()
    try:
        if warning:
            print(warning, file=sys.stderr, flush=True)
        print(f"Compatibility Lab: {dashboard_url(args)}  (database {mask_url(url)}; Ctrl-C stops)", flush=True)
        if not args.no_browser and can_open_browser():
            threading.Thread(target=open_browser_when_ready, args=(dashboard_url(args), browser_stop), daemon=True,
                             name="open-browser").start()
        return supervise(commands, envs, url, processes)
    except KeyboardInterrupt:
        print("stopping the workers and the dashboard", flush=True)
        return 0
    finally:
        browser_stop.set()
        stop(processes)


if __name__ == "__main__":
    sys.exit(main())
