"""Dashboard pages on a large stored study: first visit (cold caches) vs the visits after it.

A temporary SQLite database gets a finished 10-step study with 10,000 gallery items per step
(``tests/test_app_synthetic.fill_study``: two methods, hand-made matrices, features of one method,
and its projection / backfilling / geometry analyses computed by engine.jobs.analysis). Each page runs
under ``streamlit.testing.v1.AppTest``; the first visit reads the database, later visits hit
``st.cache_data``. Goal: a page showing stored results renders in under 2 s after the first visit.

    python bench/bench_pages.py                  # 10 steps x 10,000 gallery items
    python bench/bench_pages.py --per-class 20   # a quick run (2,000 items)
"""
from __future__ import annotations

import argparse
import os
import runpy
import statistics
import sys
import tempfile
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]
fill_study = runpy.run_path(str(ROOT / "tests" / "test_app_synthetic.py"))["fill_study"]  # tests/ is no package
MAIN = ROOT / "app" / "main.py"
PAGES = {"Compatibility": "compatibility", "Feature geometry": "geometry", "Backfilling": "backfilling"}
GOAL_S = 2.0


def visit(page: str, state: dict) -> float:
    """Seconds for one AppTest run of ``page`` (router included), with widget values preset in ``state``."""
    at = AppTest.from_file(str(MAIN), default_timeout=600)
    for key, value in state.items():
        at.session_state[key] = value
    at.switch_page(f"app_pages/{page}.py")
    t0 = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - t0
    if at.exception:
        raise RuntimeError(f"{page}: {at.exception[0].message}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--per-class", type=int, default=100, help="gallery images per class (100 classes)")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="visits after the first one")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        # warm the imports (torch, numba kernels, altair) outside the timings: a first visit after a server
        # start pays them once, whatever the database holds
        import engine.methods
        import engine.metrics.retrieval
        import engine.results.report  # noqa: F401

        os.environ["COMPATLAB_DB_URL"] = f"sqlite:///{tmp}/empty.db"
        for page in PAGES.values():
            visit(page, {})
        url = f"sqlite:///{tmp}/bench.db"
        classes = 100
        increment = classes // args.steps
        t0 = time.perf_counter()
        out = fill_study(url, steps=args.steps, initial_classes=classes - increment * (args.steps - 1),
                         increment=increment, per_class=args.per_class, dim=args.dim,
                         methods=("independent", "bct"), versions_for=("independent",), views=("encoder", "logits"))
        size_mb = Path(tmp, "bench.db").stat().st_size / 2**20
        print(f"study: {args.steps} steps, {out['n']:,} gallery items, {args.dim}-d, 2 methods; database {size_mb:.0f} MiB, "
              f"filled (analyses included) in {time.perf_counter() - t0:.0f} s")
        os.environ["COMPATLAB_DB_URL"] = url
        state = {"geometry": {"geo_method": "pca"}}  # the stored map (PCA); UMAP would show the compute button

        rows, ok = [], True  # the study's URL is new to every cache: the first visit reads the database
        for title, page in PAGES.items():
            first = visit(page, state.get(page, {}))
            later = [visit(page, state.get(page, {})) for _ in range(args.repeats)]
            after = statistics.median(later)
            ok &= after < GOAL_S
            rows.append((title, first, after, first / after))
        print(f"\n| page | first visit | later visits (median of {args.repeats}) | first / later | goal < {GOAL_S:.0f} s |")
        print("|---|---|---|---|---|")
        for title, first, after, ratio in rows:
            print(f"| {title} | {first:.2f} s | {after:.2f} s | {ratio:.1f}x | {'yes' if after < GOAL_S else 'NO'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
