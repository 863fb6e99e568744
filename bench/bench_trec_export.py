"""Peak memory of one compare-checkpoints cell's TREC export (a full ranking: queries x gallery run lines), written
whole (the texts built, then written: how the export worked before it streamed) against streamed (a query's lines a
chunk, :func:`engine.checkpoints.trec_export.cell_run`, through :func:`engine.results.trec.write_files`).

Each way runs in its own child process on the same seeded features (closed-set, ``--classes`` labels) and reports its
peak RSS above the process's RSS once the features are made (``ru_maxrss`` minus the RSS before the export), its wall
time and the file's size; prints the ratio whole / streamed (> 1: streaming holds less) and whether the two files are
byte-identical. Run: ``nice python bench/bench_trec_export.py --items 2000``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_kib() -> int:
    """This process's resident set now, in KiB (Linux /proc)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def child(way: str, n: int, dim: int, classes: int, out: Path) -> dict:
    import numpy as np

    from engine.checkpoints.trec_export import cell_qrels, cell_run, cell_texts
    from engine.results.trec import write_files

    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    labels = rng.integers(0, classes, n)
    before = rss_kib()
    started = time.perf_counter()
    if way == "whole":
        run, qrels = cell_texts(x, labels, x, labels, same_set=True, tag="t")
        write_files(out, {"cell.run": run, "cell.qrels": qrels})
    else:
        write_files(out, {"cell.run": cell_run(x, x, same_set=True, tag="t"),
                          "cell.qrels": cell_qrels(labels, labels, same_set=True)})
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"way": way, "peak_above_kib": peak - before, "seconds": seconds,
            "bytes": (out / "cell.run").stat().st_size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=2000, help="closed-set: each item is a query and a gallery item")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--child", choices=("whole", "streamed"), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.items, args.dim, args.classes, args.out)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        got = {}
        for way in ("whole", "streamed"):
            out = Path(tmp) / way
            text = subprocess.run([sys.executable, __file__, "--child", way, "--out", str(out), "--items",
                                   str(args.items), "--dim", str(args.dim), "--classes", str(args.classes)],
                                  check=True, capture_output=True, text=True, cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                      filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}).stdout
            got[way] = json.loads(text)
        same = (Path(tmp) / "whole" / "cell.run").read_bytes() == (Path(tmp) / "streamed" / "cell.run").read_bytes()
    lines = args.items * (args.items - 1)
    print(f"one cell, {args.items:,} queries x {args.items - 1:,} gallery items = {lines:,} run lines, "
          f"{got['whole']['bytes'] / 2**20:,.0f} MiB")
    for way in ("whole", "streamed"):
        g = got[way]
        print(f"  {way:9s} peak RSS above the features {g['peak_above_kib'] / 1024:8,.0f} MiB, {g['seconds']:6.1f} s")
    ratio = got["whole"]["peak_above_kib"] / max(got["streamed"]["peak_above_kib"], 1)
    print(f"ratio whole / streamed peak memory: {ratio:.1f}x; files byte-identical: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
