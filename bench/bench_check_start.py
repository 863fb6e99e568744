"""A check from vectors as a command-line tool: ``check-upgrade --features DIR`` in a fresh process vs ``import numpy``.

A temporary folder gets ``step_1.npz`` (old) and ``step_2.npz`` (new) in the format ``python -m engine evaluate`` reads
(:func:`engine.checkpoints.evaluate_folder.load_feature_folder`): 500 queries and 1,000 gallery items of 50 classes,
256-d, the new model a small rotation of the old one plus noise (Recall@1 old/old 0.84, new/old 0.72: not compatible,
so the backfill curves are part of the work). One untimed run first fills numba's on-disk cache (a fresh checkout compiles the kernels once); then
each repeat starts a new interpreter for the check, and one for ``python -c "import numpy"``, the floor any numpy
tool pays. Goal: the check under 1.5 s on an idle 2-core machine (it loads numpy and numba, never torch).

    python bench/bench_check_start.py                # 5 repeats
    python bench/bench_check_start.py --plan         # the same check writing its migration plan
    python bench/bench_check_start.py --repeats 10 --dim 384
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 1.5
EXIT_OK = (0, 1, 3)  # compatible, not compatible, too close to call


def write_folder(folder: Path, *, queries: int, gallery: int, dim: int, classes: int, seed: int = 0) -> None:
    """step_1.npz (old) and step_2.npz (new): class centres plus noise; new = old rotated part of the way, plus noise."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim))
    ql, gl = rng.integers(0, classes, queries), rng.integers(0, classes, gallery)
    q, g = centres[ql] + 2.5 * rng.normal(size=(queries, dim)), centres[gl] + 2.5 * rng.normal(size=(gallery, dim))
    near, r = np.linalg.qr(np.eye(dim) + 0.5 / np.sqrt(dim) * rng.normal(size=(dim, dim)))
    rotation = near * np.sign(np.diag(r))  # the rotation near the identity (QR may flip a column's sign)
    for step, (qf, gf) in ((1, (q, g)), (2, (q @ rotation + 0.3 * rng.normal(size=q.shape),
                                            g @ rotation + 0.3 * rng.normal(size=g.shape)))):
        np.savez(folder / f"step_{step}.npz", query_features=qf.astype(np.float32), query_labels=ql,
                 gallery_features=gf.astype(np.float32), gallery_labels=gl)


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU seconds (every thread, user + system) of one fresh interpreter running ``argv`` from the repository
    root; the CPU time moves less with other programs' load than the wall time."""
    cpu0, t0 = children_cpu(), time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - t0, children_cpu() - cpu0, done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--gallery", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--classes", type=int, default=50)
    ap.add_argument("--plan", action="store_true", help="also write the migration plan (--plan OUT, default adapters)")
    args = ap.parse_args(argv)

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_folder(folder, queries=args.queries, gallery=args.gallery, dim=args.dim, classes=args.classes)
        check = [sys.executable, "-m", "engine", "check-upgrade", "--features", str(folder), "--data-root", tmp]

        def run_check(i: int) -> tuple[float, float]:
            seconds, cpu, done = timed(check + (["--plan", str(folder / f"plan{i}")] if args.plan else []), env)
            if done.returncode not in EXIT_OK:
                raise SystemExit(f"check-upgrade failed (exit {done.returncode}): {done.stderr.strip()}")
            return seconds, cpu

        load_before = os.getloadavg()
        first = run_check(0)[0]  # numba's cache filled here when the checkout has none
        checks, numpy_only = [], []
        for i in range(1, args.repeats + 1):
            checks.append(run_check(i))
            numpy_only.append(timed([sys.executable, "-c", "import numpy"], env)[:2])
        load_after = os.getloadavg()

    check_s, numpy_s = (statistics.median(s for s, _ in runs) for runs in (checks, numpy_only))
    what = f"check-upgrade --features{' --plan' if args.plan else ''}"
    print(f"{args.queries:,} queries x {args.gallery:,} gallery items x {args.dim}-d, {args.classes} classes; "
          f"{args.repeats} fresh processes each (first, untimed check {first:.2f} s)")
    print(f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} CPUs)")
    print("| command | wall, median | min | max | CPU (user + system), median |\n|---|---|---|---|---|")
    for name, runs in ((what, checks), ("python -c 'import numpy'", numpy_only)):
        walls = [s for s, _ in runs]
        print(f"| {name} | {statistics.median(walls):.2f} s | {min(walls):.2f} s | {max(walls):.2f} s | "
              f"{statistics.median(c for _, c in runs):.2f} s |")
    ok = check_s < GOAL_S
    print(f"check / import numpy: {check_s / numpy_s:.1f}x; the check takes {check_s:.2f} s "
          f"(goal < {GOAL_S} s on an idle 2-core machine: {'yes' if ok else 'NO'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
