"""engine.core.threads: cores // processes threads per process (at least 1), the user's override, the environment a child
gets from run_app.py, and a real worker reporting torch's thread count."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import run_app
from engine.core import threads

ROOT = Path(__file__).resolve().parents[1]
WORKER_LINE = re.compile(r"worker \d+: (\d+) compute thread\(s\) \(torch (\d+), numba (\d+)(?:, blas (\d+))?\)")


@pytest.mark.parametrize(("cores", "processes", "expected"), [
    (2, 2, 1),    # the shared 2-core machine, two workers
    (16, 2, 8),
    (16, 3, 5),   # 16 // 3 = 5 (a core left over)
    (7, 2, 3),
    (1, 2, 1),    # fewer cores than processes: still one thread each
    (2, 5, 1),
    (12, 1, 12),  # a worker on its own gets every core
])
def test_cores_divided_among_processes(cores, processes, expected):
    assert threads.per_process(processes=processes, cores=cores) == expected


def test_the_override_replaces_the_rule():
    assert threads.per_process(processes=2, cores=16, override=3) == 3
    assert threads.per_process(processes=2, cores=2, override=6) == 6  # more than the cores: the user's choice


def test_processes_below_one_are_refused():
    with pytest.raises(ValueError, match="processes must be 1 or more"):
        threads.per_process(processes=0, cores=4)


def test_the_flag_wins_over_the_variable_which_wins_over_the_rule():
    assert threads.requested(4, {threads.THREADS_ENV: "2"}) == 4
    assert threads.requested(None, {threads.THREADS_ENV: " 2 "}) == 2
    assert threads.requested(None, {threads.THREADS_ENV: ""}) is None
    assert threads.requested(None, {}) is None


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_bad_variable_is_one_line_naming_it(value):
    with pytest.raises(ValueError, match=r"\$COMPATLAB_THREADS must be a whole number of threads \(1 or more\)"):
        threads.requested(None, {threads.THREADS_ENV: value})


def test_a_bad_flag_is_one_line_naming_it():
    with pytest.raises(ValueError, match="--threads must be a whole number"):
        threads.requested(0, {})


def test_the_child_environment_sets_every_library():
    env = threads.thread_env(3)
    assert env == {"COMPATLAB_THREADS": "3", "OMP_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "3",
                   "MKL_NUM_THREADS": "3", "VECLIB_MAXIMUM_THREADS": "3", "NUMEXPR_NUM_THREADS": "3",
                   "NUMBA_NUM_THREADS": "3"}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_cores_are_the_ones_this_process_may_use():
    assert threads.available_cores() == len(os.sched_getaffinity(0))
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from engine.core.threads import available_cores; print(available_cores())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert out.strip() == "1", "pinned to one CPU, the process has one core whatever the machine has"


def _worker_env() -> dict[str, str]:
    """This environment without any thread setting (the test runner may set OMP_NUM_THREADS)."""
    drop = {threads.THREADS_ENV, *threads.LIBRARY_ENVS}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONPATH": str(ROOT)}


def _worker_threads(tmp_path: Path, env: dict[str, str], *flags: str) -> tuple[int, ...]:
    """Start ``python -m engine worker --once`` on an empty database; the counts it reports (requested, torch, numba,
    BLAS or -1)."""
    proc = subprocess.run([sys.executable, "-m", "engine", "worker", "--once", "--db",
                           f"sqlite:///{tmp_path / 'lab.db'}", *flags], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    match = WORKER_LINE.search(proc.stdout)
    assert match, proc.stdout
    return tuple(int(g) if g is not None else -1 for g in match.groups())


@pytest.mark.parametrize("count", [1, 3])
def test_a_worker_started_as_run_app_starts_it_uses_the_count(tmp_path, count):
    # run_app.py puts thread_env(n) into the worker's environment before it loads torch, numpy or numba
    requested, torch_threads, numba_threads, blas = _worker_threads(tmp_path, {**_worker_env(),
                                                                               **threads.thread_env(count)})
    assert requested == torch_threads == numba_threads == count
    assert blas in (count, -1)  # -1: no BLAS library loaded to ask


@pytest.mark.parametrize("count", sorted({1, max(1, threads.available_cores() // 2)}))
def test_the_environment_alone_sets_every_library(count):
    """The dashboard (the Learn pages compute there) gets only the environment: torch, numba and numpy's BLAS read it
    when they load (torch and OpenBLAS cap it at the cores, so only counts up to them are checked)."""
    code = ("import json, numpy, numba, torch; from threadpoolctl import threadpool_info; "
            "print(json.dumps([torch.get_num_threads(), numba.get_num_threads(), "
            "[p['num_threads'] for p in threadpool_info() if p['user_api'] == 'blas']]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={**_worker_env(), **threads.thread_env(count)}, timeout=600).stdout
    torch_threads, numba_threads, blas = json.loads(out.strip().splitlines()[-1])
    assert torch_threads == numba_threads == count
    assert blas and set(blas) == {count}, "numpy's BLAS"


def test_a_worker_given_threads_uses_them(tmp_path):
    requested, torch_threads, numba_threads, blas = _worker_threads(tmp_path, _worker_env(), "--threads", "3")
    assert requested == torch_threads == numba_threads == 3
    assert blas in (3, -1)


def test_a_worker_on_its_own_keeps_torchs_default(tmp_path):
    env = _worker_env()
    default = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             capture_output=True, text=True, cwd=ROOT, env=env, check=True).stdout.strip()
    db = tmp_path / "lab.db"
    proc = subprocess.run([sys.executable, "-m", "engine", "worker", "--once", "--db", f"sqlite:///{db}"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(rf"worker \d+: torch's default {default} compute thread\(s\)", proc.stdout), proc.stdout


def test_a_worker_with_a_bad_count_exits_2(tmp_path):
    db = tmp_path / "x.db"
    proc = subprocess.run([sys.executable, "-m", "engine", "worker", "--once", "--db", f"sqlite:///{db}"],
                          capture_output=True, text=True, cwd=ROOT, env={**_worker_env(), threads.THREADS_ENV: "many"},
                          timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: $COMPATLAB_THREADS must be a whole number of threads (1 or more), got 'many'"
    assert not db.exists(), "a refused start leaves nothing behind"


@pytest.mark.parametrize("counts", [(1, 2), (2, 1)])
def test_numba_compiles_after_the_count_changed(counts):
    """A sharing worker applies one count per job; numba, loaded by the first, sized its pool then and refuses a new
    $NUMBA_NUM_THREADS at its next compilation once its threads run (the first Feature geometry map's UMAP failed:
    "Cannot set NUMBA_NUM_THREADS to a different value once the threads have been launched"). The variable keeps the
    pool's size; numba uses the count, at most the pool."""
    code = ("import json, os, numpy as np\n"
            "from engine.models import thread_pools\n"
            f"used = [thread_pools.apply(n)['numba'] for n in {counts!r}]\n"
            "from engine.analysis.map import embed_2d\n"
            "fit = np.random.default_rng(0).normal(size=(30, 4))\n"
            "coords, _, method = embed_2d(fit, [], method='umap', seed=0)\n"
            "print(json.dumps([used, method, list(coords.shape), os.environ['NUMBA_NUM_THREADS']]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=_worker_env(),
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    used, method, shape, variable = json.loads(out.stdout.strip().splitlines()[-1])
    assert used == [min(n, counts[0]) for n in counts] and variable == str(counts[0])
    assert method == "umap" and shape == [30, 2]


# run_app.py: what its children receive (fake children write their environment and exit)
_WRITE_ENV = ("import json, os, sys; json.dump({k: os.environ.get(k) for k in sys.argv[2:]}, "
              "open(sys.argv[1] + '.tmp', 'w')); os.replace(sys.argv[1] + '.tmp', sys.argv[1])")  # whole, or not there


def _run_app_child_threads(monkeypatch, folder: Path, db_url, *argv: str) -> dict[str, dict[str, str]]:
    """Run run_app.main with two fake workers and a fake dashboard (writing into the new ``folder``); each child's
    thread variables."""
    folder.mkdir()
    keys = [threads.THREADS_ENV, *threads.LIBRARY_ENVS]
    files = {name: folder / f"{name}.json" for name in ("worker", "short", "dashboard")}
    workers_done = [str(files["worker"]), str(files["short"])]
    wait_then_write = (f"import os, time\nwhile not all(map(os.path.exists, {workers_done!r})): time.sleep(0.05)\n"
                       f"{_WRITE_ENV}")
    monkeypatch.setattr(run_app, "child_commands", lambda args, url: {
        "worker": [sys.executable, "-c", _WRITE_ENV, str(files["worker"]), *keys],
        "short-job worker": [sys.executable, "-c", _WRITE_ENV, str(files["short"]), *keys],
        "dashboard": [sys.executable, "-c", wait_then_write, str(files["dashboard"]), *keys]})
    monkeypatch.setattr(run_app, "POLL_S", 0.05)
    monkeypatch.setattr(run_app, "BACKOFF_START_S", 60.0)  # a fake worker that exited is not restarted meanwhile
    run_app.main(["--no-demo", "--no-browser", "--db", db_url, *argv])
    return {name: json.loads(path.read_text()) for name, path in files.items()}


def test_run_app_workers_share_the_cores_and_the_dashboard_gets_cores_over_workers(monkeypatch, tmp_path, db_url):
    monkeypatch.delenv(threads.THREADS_ENV, raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 7)  # 7 cores, 2 workers: the dashboard 3 threads
    child_commands = run_app.child_commands  # the real one (the fake children replace it below)
    envs = _run_app_child_threads(monkeypatch, tmp_path / "rule", db_url)
    pools = {threads.THREADS_ENV: None, **threads.library_env(7)}  # pools at every core, no fixed count
    assert envs["worker"] == envs["short"] == pools, envs
    assert envs["dashboard"] == threads.thread_env(3), envs
    commands = child_commands(run_app.parse_args(["--no-browser"]), db_url)
    assert "--share-cores" in commands["worker"] and "--share-cores" in commands["short-job worker"]
    fixed = child_commands(run_app.parse_args(["--no-browser", "--threads", "5"]), db_url)
    assert "--share-cores" not in fixed["worker"] + fixed["short-job worker"]


def test_a_sharing_worker_takes_cores_over_the_jobs_running_on_this_machine(monkeypatch, tmp_path):
    from engine.jobs import worker
    from engine.models import thread_pools
    from engine.jobs.job_handlers import JOB_HANDLERS
    from storage import claim_next_job, enqueue_job, get_engine, init_db, session_scope

    db = get_engine(f"sqlite:///{tmp_path / 'lab.db'}")
    init_db(db)
    with session_scope(db) as s:
        for n in range(3):
            enqueue_job(s, "analysis", {"n": n})
    applied: list[int] = []
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    monkeypatch.setattr(thread_pools, "apply", lambda count: applied.append(count) or {"torch": count})
    monkeypatch.setitem(JOB_HANDLERS, "analysis", lambda *a, **k: "done")
    assert claim_next_job(db, os.getpid() + 1) is not None  # another worker of this machine is running a job
    assert worker.run_one(db, share_cores=True) is not None  # 2 jobs running here: 8 // 2
    assert worker.run_one(db) is not None  # not sharing: the count stays
    assert applied == [4]
    with session_scope(db) as s:  # the other worker's job ends: this one alone takes every core
        from storage import finish_job
        from storage.models import Job
        from sqlalchemy import select

        other = s.scalars(select(Job).where(Job.status == "running")).one()
        finish_job(s, other.id, "done", lease=other.lease)
        enqueue_job(s, "analysis", {"n": 3})
    assert worker.run_one(db, share_cores=True) is not None
    assert applied == [4, 8]


def test_run_app_threads_flag_and_variable(monkeypatch, tmp_path, db_url):
    monkeypatch.setattr(threads, "available_cores", lambda: 7)
    monkeypatch.setenv(threads.THREADS_ENV, "2")
    by_variable = _run_app_child_threads(monkeypatch, tmp_path / "variable", db_url)
    by_flag = _run_app_child_threads(monkeypatch, tmp_path / "flag", db_url, "--threads", "5")
    assert all(env == threads.thread_env(2) for env in by_variable.values()), by_variable
    assert all(env == threads.thread_env(5) for env in by_flag.values()), by_flag


def test_run_app_refuses_a_bad_count_before_touching_the_database(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(threads.THREADS_ENV, "0")
    db = tmp_path / "never.db"
    with pytest.raises(SystemExit) as exc:
        run_app.main(["--no-demo", "--no-browser", "--db", f"sqlite:///{db}"])
    assert exc.value.code == 2
    assert "$COMPATLAB_THREADS must be a whole number of threads (1 or more), got '0'" in capsys.readouterr().err
    assert not db.exists()
