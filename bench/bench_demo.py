"""Benchmark: the demo's wall time under three thread settings of run_app.py's workers, in one run: torch's default
in each worker (before), one fixed ``cores // workers`` count (static) and the cores shared among the jobs running
(``worker --share-cores``, ``engine.core.threads``: what run_app.py does now).

Each run is the demo as ``python run_app.py`` runs it on a first start: a fresh SQLite database in a temporary folder
with the preset queued as one ``run`` job, and run_app.py's workers (``run_app.child_commands``: one for every job
kind, one for the short lane) started with the environment run_app.py gives them; the time runs from starting the
workers to the job's end. "before" gives every library of each worker torch's own default (measured in a fresh
interpreter with no thread settings), "static" ``cores // workers`` each, "now" run_app.py's own commands and
environment (pools at every core, each job taking ``cores // the jobs running on this machine``). ``--load N``
keeps N CPU-burning processes running throughout, so "under load" can be reproduced; the load average is printed
with the figures.

    python bench/bench_demo.py                            # the full quick-demo, every setting
    python bench/bench_demo.py --preset digits-tiny       # a quick check
    python bench/bench_demo.py --load 2 --settings static now --repeat 2   # under load (medians compared)
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import run_app
from engine.core import threads

ROOT = Path(run_app.__file__).resolve().parent
BURN = "while True: pass"
SETTINGS = ("before", "static", "now")
POLL_S = 0.5


@dataclass(frozen=True)
class Result:
    setting: str
    count: int
    wall_s: float
    cpu_s: float  # user + system time of the workers
    torch_threads: list[int]  # what each worker reported


def torch_default_threads() -> int:
    """torch's own thread count in a fresh interpreter with no thread settings (each worker's count before)."""
    code = "import torch; print(torch.get_num_threads())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env=_without_thread_settings(os.environ)).stdout
    return int(out.strip().splitlines()[-1])


def _without_thread_settings(environ: os._Environ | dict[str, str]) -> dict[str, str]:
    drop = {threads.THREADS_ENV, *threads.LIBRARY_ENVS}
    return {k: v for k, v in environ.items() if k not in drop}


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_demo(preset: str, setting: str, count: int | None) -> Result:
    """The preset queued on a fresh database and run by run_app.py's workers, each with ``count`` threads (None: as
    run_app.py starts them, sharing the cores)."""
    from storage import Job, enqueue_job, get_engine, init_db, session_scope

    with tempfile.TemporaryDirectory(prefix="bench_demo_") as tmp:
        url = f"sqlite:///{tmp}/compatlab.db"
        db = get_engine(url)
        init_db(db)
        with session_scope(db) as s:
            job_id = enqueue_job(s, "run", {"preset": preset})
        fixed = [] if count is None else ["--threads", str(count)]
        args = run_app.parse_args(["--no-browser", "--no-demo", "--db", url, *fixed])
        commands = {name: cmd for name, cmd in run_app.child_commands(args, url).items() if name != "dashboard"}
        threads_env = threads.library_env(threads.available_cores()) if count is None else threads.thread_env(count)
        env = {**_without_thread_settings(os.environ), "COMPATLAB_DB_URL": url, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), **threads_env}
        logs = {name: Path(tmp) / f"{name.replace(' ', '_')}.log" for name in commands}
        handles = {name: path.open("wb") for name, path in logs.items()}
        cpu, start = _children_cpu_s(), time.monotonic()
        workers = {name: subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=handles[name],
                                          stderr=subprocess.STDOUT)
                   for name, cmd in commands.items()}
        try:
            while True:
                with session_scope(db) as s:
                    job = s.get(Job, job_id)
                    status, error = job.status, job.error
                if status in ("done", "failed", "cancelled"):
                    break
                dead = [name for name, p in workers.items() if p.poll() is not None]
                if dead:
                    raise SystemExit(f"error: the {dead[0]} exited with code {workers[dead[0]].returncode}:\n"
                                     f"{logs[dead[0]].read_text(errors='replace')[-2000:]}")
                time.sleep(POLL_S)
            wall = time.monotonic() - start
        finally:
            run_app.stop(workers)
            for handle in handles.values():
                handle.close()
        if status != "done":
            raise SystemExit(f"error: the {preset} job ended {status}: {(error or '')[-2000:]}")
        reported = [int(n) for log in logs.values()
                    for n in re.findall(r"compute thread\(s\) \(torch (\d+)", log.read_text(errors="replace"))]
        return Result(setting, count, wall, _children_cpu_s() - cpu, reported)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="quick-demo", help="the preset to run (default quick-demo; digits-tiny: quick)")
    ap.add_argument("--load", type=int, default=0, metavar="N", help="CPU-burning processes to run throughout")
    ap.add_argument("--repeat", type=int, default=1, metavar="N", help="run each setting N times, alternating")
    ap.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS),
                    help="which settings to run (default: all)")
    args = ap.parse_args(argv)
    if args.load < 0 or args.repeat < 1:
        ap.error("--load must be 0 or more and --repeat 1 or more")
    from engine.core.presets import RUN_PRESETS, preset_config

    if args.preset not in RUN_PRESETS:
        ap.error(f"unknown preset {args.preset!r}; known: {', '.join(sorted(RUN_PRESETS))}")
    commands = run_app.child_commands(run_app.parse_args(["--no-browser"]), "sqlite:////tmp/unused.db")
    workers = sum(name != "dashboard" for name in commands)
    cores = threads.available_cores()
    counts = {"before": torch_default_threads(), "static": threads.per_process(processes=workers, cores=cores),
              "now": None}
    names = {"before": "before: torch's default", "static": f"static: cores // workers ({cores} // {workers})",
             "now": "now: cores // jobs running (--share-cores)"}
    settings = {names[key]: counts[key] for key in args.settings}
    print(f"{preset_config(args.preset).name}: {workers} workers; {cores} cores; "
          f"{args.load} load process(es); {args.repeat} run(s) per setting")
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.load)]
    results: list[Result] = []
    try:
        print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
        for _ in range(args.repeat):
            for setting, count in settings.items():
                result = run_demo(args.preset, setting, count)
                results.append(result)
                print(f"  {setting}: {count or 'shared'} thread(s) per worker (workers reported torch "
                      f"{result.torch_threads}): "
                      f"wall {result.wall_s:.1f} s, workers' CPU {result.cpu_s:.1f} s; load average "
                      f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    print("\n| setting | threads per worker | wall (median) | workers' CPU (median) |\n|---|---|---|---|")
    medians = {}
    for setting, count in settings.items():
        mine = [r for r in results if r.setting == setting]
        medians[setting] = statistics.median(r.wall_s for r in mine)
        print(f"| {setting} | {count or 'shared'} | {medians[setting]:.1f} s | "
              f"{statistics.median(r.cpu_s for r in mine):.1f} s |")
    last = list(medians)[-1]
    for setting in list(medians)[:-1]:
        print(f"ratio {setting.split(':')[0]} / {last.split(':')[0]}: {medians[setting] / medians[last]:.2f}x "
              "(above 1: the latter is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
