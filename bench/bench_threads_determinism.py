"""Benchmark: what pinning the training and extraction arithmetic to one thread costs (``compute_threads``, the default
that makes a config and seed give the same numbers on every machine, ``engine.models.arithmetic``).

The same run twice per repeat, in fresh ``python -m engine run`` processes whose libraries all get every core of this
machine: once with ``compute_threads = 1`` (the default) and once with ``compute_threads = <cores>`` (what a process
at every core did before the pin). The order alternates between repeats so that a change in the machine's load hits
both; the medians and their ratio are printed with the load average. Each run is one seed of the quick-demo's
network and data (Fashion-MNIST 4 + 3 + 3 classes, 200 training images a class, 10 epochs) with one method.

    python bench/bench_threads_determinism.py                 # independent, 3 repeats
    python bench/bench_threads_determinism.py --methods psp bct --repeat 5
    python bench/bench_threads_determinism.py --preset digits-tiny   # a seconds-long check
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.core import threads
from engine.core.config import dump_toml
from engine.core.presets import preset_config

ROOT = Path(__file__).resolve().parents[1]


def _seconds(config: Path, workdir: Path, tag: str) -> float:
    """Wall time of ``python -m engine run CONFIG`` on a fresh database, every library at every core."""
    env = {k: v for k, v in os.environ.items() if k not in {threads.THREADS_ENV, *threads.LIBRARY_ENVS}}
    env.update(threads.library_env(threads.available_cores()), PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "engine", "run", str(config), "--quiet", "--db",
                    f"sqlite:///{workdir / f'{tag}.sqlite'}", "--checkpoints", str(workdir / f"ckpt-{tag}")],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="quick-demo")
    ap.add_argument("--methods", nargs="+", default=["independent"])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cores = threads.available_cores()
    base = preset_config(args.preset)
    cfg = dataclasses.replace(base, methods=tuple(args.methods), method_params={
        m: p for m, p in base.method_params.items() if m in args.methods}, seeds=())
    counts = (1, cores)
    times: dict[int, list[float]] = {c: [] for c in counts}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for c in counts:
            (workdir / f"threads{c}.toml").write_text(dump_toml(dataclasses.replace(cfg, compute_threads=c)))
        for r in range(args.repeat):
            for c in (counts if r % 2 == 0 else counts[::-1]):
                times[c].append(_seconds(workdir / f"threads{c}.toml", workdir, f"r{r}-t{c}"))
                print(f"repeat {r + 1}: compute_threads {c}: {times[c][-1]:.1f} s", flush=True)
    pinned, wide = statistics.median(times[1]), statistics.median(times[cores])
    print(f"{args.preset}, methods {', '.join(args.methods)}, seed {cfg.seed}, {cores} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the end, torch threads of every run's process: {cores}")
    print(f"median wall time: compute_threads 1 (pinned, the default) {pinned:.1f} s; compute_threads {cores} "
          f"{wide:.1f} s; ratio pinned / {cores} threads = {pinned / wide:.2f}")


if __name__ == "__main__":
    main()
