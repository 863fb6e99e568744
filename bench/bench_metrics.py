"""Benchmark: the full lower-triangle compatibility matrix (Recall@1 + full mAP) for T synthetic models.

Compared in the same run, on the same features:
  ours     engine.metrics.compatibility.compatibility_matrices (one neighbour pass per cell, compiled kernel)
  (a)      a plain numpy per-cell implementation that argsorts the full similarity matrix
  ours-R1  Recall@1 alone through engine.metrics (auto backend)
  (b)      faiss IndexFlatIP top-1 per cell (Recall@1 only)
Each variant runs in its own process so that its peak memory (max RSS) is its own.

    python bench/bench_metrics.py            # T=10, 10,000 x 10,000 x 128 (takes several minutes)
    python bench/bench_metrics.py --n 2000   # quick run
    python bench/bench_metrics.py --one-cell 50000   # memory check: one 50,000 x 50,000 cell only
    python bench/bench_metrics.py --cuda     # ours on the GPU (torch backend on CUDA) against ours on the CPU
    python bench/bench_metrics.py --torch-cpu   # ours on the CPU: the numpy backend (the default) against torch's
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import time
from pathlib import Path

import numpy as np


def make_models(T: int, n: int, d: int, classes: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """T models that drift a little from one another: class centres + noise, rotated a bit per step."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, d)).astype(np.float32)
    ql, gl = rng.integers(0, classes, n), rng.integers(0, classes, n)
    qn, gn = rng.normal(size=(n, d)).astype(np.float32), rng.normal(size=(n, d)).astype(np.float32)
    sets = []
    for t in range(T):
        rot = np.linalg.qr(np.eye(d) + 0.05 * t * rng.normal(size=(d, d)))[0].astype(np.float32)
        sets.append(dict(query_features=(centres[ql] + 1.5 * qn) @ rot, query_labels=ql,
                         gallery_features=(centres[gl] + 1.5 * gn) @ rot, gallery_labels=gl))
    return sets


def numpy_cell(q, ql, g, gl):
    """Baseline (a): sort the whole similarity matrix, read Recall@1 and AP from the sorted labels."""
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    g = g / np.linalg.norm(g, axis=1, keepdims=True)
    order = np.argsort(-(q @ g.T), axis=1)
    hits = gl[order] == ql[:, None]
    r1 = hits[:, 0].mean()
    prec = np.cumsum(hits, axis=1) / np.arange(1, hits.shape[1] + 1)
    npos = hits.sum(1)
    ap = (prec * hits).sum(1)[npos > 0] / npos[npos > 0]
    return r1, ap.mean()


def faiss_cell(q, ql, g, gl):
    """Baseline (b): faiss IndexFlatIP top-1."""
    import faiss

    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    g = g / np.linalg.norm(g, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(g.shape[1])
    index.add(g)
    _, idx = index.search(q, 1)
    return (gl[idx[:, 0]] == ql).mean(), None


def _run(variant: str, args: dict, out: mp.Queue) -> None:
    sets = make_models(args["T"], args["n"], args["d"], args["classes"])
    T = len(sets)
    backend = None
    if variant.startswith("ours"):  # load the compiled kernel (cached on disk) or start CUDA before timing
        from engine.metrics.retrieval import retrieval_metrics
        from engine.metrics.search import NumpyBackend, TorchBackend

        make = {"ours-cpu": NumpyBackend, "ours-torch-cpu": lambda: TorchBackend("cpu"),
                "ours-cuda": lambda: TorchBackend("cuda")}.get(variant)
        backend = make() if make else None  # only the torch variants load torch
        retrieval_metrics(sets[0]["query_features"][:50], sets[0]["query_labels"][:50], sets[0]["gallery_features"][:50],
                          sets[0]["gallery_labels"][:50], backend=backend)
    t0 = time.perf_counter()
    if variant.startswith("ours"):
        from engine.metrics.compatibility import compatibility_matrices

        metrics = ("recall@1",) if variant == "ours-R1" else ("recall@1", "map")
        res = compatibility_matrices(sets, metrics=metrics, backend=backend)
        r1, mp_ = res.values["recall@1"], res.values.get("map")
    else:
        cell = numpy_cell if variant == "numpy" else faiss_cell
        r1, mp_ = np.full((T, T), np.nan), np.full((T, T), np.nan)
        for t in range(T):
            for k in range(t + 1):
                r1[t, k], mp_[t, k] = cell(sets[t]["query_features"], sets[t]["query_labels"], sets[k]["gallery_features"], sets[k]["gallery_labels"])
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.put(dict(variant=variant, seconds=seconds, peak_mb=peak, r1=np.nan_to_num(r1, nan=-1).tolist(),
                 map=None if mp_ is None else np.nan_to_num(np.asarray(mp_, float), nan=-1).tolist()))


def _one_cell(n: int, args: dict, out: mp.Queue) -> None:
    """One n x n cell (Recall@1 + mAP): time and how much the peak RSS grows while it runs."""
    from engine.metrics.retrieval import retrieval_metrics

    s = make_models(1, n, args["d"], max(args["classes"], n // 50))[0]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    m = retrieval_metrics(s["query_features"], s["query_labels"], s["gallery_features"], s["gallery_labels"], ks=(1,))
    out.put(dict(seconds=time.perf_counter() - t0, before_mb=before, peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                 r1=m["recall@1"], map=m["map"]))


def run(variant: str, args: dict) -> dict:
    q: mp.Queue = mp.get_context("spawn").Queue()
    if variant == "one-cell":
        p = mp.get_context("spawn").Process(target=_one_cell, args=(args["one_cell"], args, q))
    else:
        p = mp.get_context("spawn").Process(target=_run, args=(variant, args, q))
    p.start()
    res = q.get()
    p.join()
    return res


def two_variants(args: dict, first: tuple[str, str], second: tuple[str, str], why: str) -> None:
    """Time two variants of ours (each in its own process) on Recall@1 + mAP and print their ratio and largest gap."""
    (v1, name1), (v2, name2) = first, second
    r1, r2 = run(v1, args), run(v2, args)
    diff_r1 = np.abs(np.subtract(r1["r1"], r2["r1"])).max()
    diff_map = np.abs(np.subtract(r1["map"], r2["map"])).max()
    print(f"T={args['T']} models, {args['n']} queries x {args['n']} gallery x {args['d']}-d, Recall@1 + mAP: {name1} "
          f"{r1['seconds']:.2f} s (peak RSS {r1['peak_mb']:.0f} MB), {name2} {r2['seconds']:.2f} s (peak RSS "
          f"{r2['peak_mb']:.0f} MB), {name1} / {name2} {r1['seconds'] / r2['seconds']:.2f}x; largest cell difference "
          f"Recall@1 {diff_r1:.2e}, mAP {diff_map:.2e} ({why})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, default=10)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one-cell", type=int, metavar="N", help="only time one N x N cell and report its memory")
    ap.add_argument("--cuda", action="store_true", help="compare the torch backend on CUDA with ours on the CPU")
    ap.add_argument("--torch-cpu", action="store_true", help="compare the numpy backend with the torch one on the CPU")
    a = ap.parse_args()
    args = dict(T=a.T, n=a.n, d=a.d, classes=a.classes, one_cell=a.one_cell)
    if a.one_cell:
        r = run("one-cell", args)
        full = a.one_cell**2 * 4 / 2**30
        print(f"one {a.one_cell} x {a.one_cell} x {a.d} cell, Recall@1 + mAP: {r['seconds']:.1f} s; peak RSS {r['peak_mb']:.0f} MB, "
              f"+{r['peak_mb'] - r['before_mb']:.0f} MB during the cell (the whole float32 similarity matrix would be {full:.1f} GiB)")
        return
    if a.torch_cpu:
        two_variants(args, ("ours-torch-cpu", "torch backend"), ("ours-cpu", "numpy backend"),
                     "the two BLAS libraries' summation orders")
        return
    if a.cuda:
        two_variants(args, ("ours-cpu", "CPU"), ("ours-cuda", "CUDA"), "float rounding of the two devices' matrix products")
        return
    results = {v: run(v, args) for v in ("ours", "numpy", "ours-R1", "faiss")}
    same_r1 = np.allclose(results["ours"]["r1"], results["numpy"]["r1"]) and np.allclose(results["ours-R1"]["r1"], results["faiss"]["r1"])
    same_map = np.allclose(results["ours"]["map"], results["numpy"]["map"], atol=1e-6)
    cells = a.T * (a.T + 1) // 2
    print(f"T={a.T} models, {a.n} queries x {a.n} gallery x {a.d}-d, {cells} cells, {a.classes} classes")
    for v, r in results.items():
        print(f"  {v:8s} {r['seconds']:8.2f} s   peak RSS {r['peak_mb']:7.0f} MB")
    ratio_a = results["numpy"]["seconds"] / results["ours"]["seconds"]
    ratio_b = results["faiss"]["seconds"] / results["ours-R1"]["seconds"]
    print(f"Recall@1 + mAP: {ratio_a:.1f}x faster than numpy full sort (target >= 10x); results identical: {same_r1 and same_map}")
    print(f"Recall@1 alone: {ratio_b:.2f}x the speed of faiss IndexFlatIP top-1 (target >= 1.0)")
    print(f"| {a.T} models, {a.n}x{a.n}x{a.d} | {results['ours']['seconds']:.1f} s | {results['numpy']['seconds']:.1f} s | {ratio_a:.1f}x | "
          f"{results['ours-R1']['seconds']:.1f} s | {results['faiss']['seconds']:.1f} s | {ratio_b:.2f}x | {results['ours']['peak_mb']:.0f} MB |")
    if a.json:
        a.json.write_text(json.dumps({k: {x: y for x, y in v.items() if x in ("seconds", "peak_mb")} for k, v in results.items()}, indent=2))


if __name__ == "__main__":
    main()
