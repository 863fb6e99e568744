"""Post-hoc adapters: fit and apply time of each kind against plain numpy measured in the same run.

Fit baseline: the bare closed form in numpy on the same unit rows (``U V^T`` of ``svd(N^T O)`` for Procrustes,
``lstsq`` with a column of ones for the affine map); the product's fit adds input checks, float64 conversion and
normalisation (and k-means or training for the cluster and MLP kinds, whose ratio is against Procrustes' bare
closed form: what the extra machinery costs). Apply baseline: one bare ``x @ W`` (float32) on the same queries;
the product applies normalisation in and out in blocks, and onnxruntime runs the exported graph.

    python bench/bench_adapters.py                      # 20,000 pairs, 384 -> 384 dims, 10,000 queries
    python bench/bench_adapters.py --pairs 2000 --queries 2000 --dim 64   # a quick run
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from engine.adapters.posthoc import fit_map, l2_rows


def timed(fn, repeat: int = 3):
    """Best wall seconds of ``repeat`` calls and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=20000)
    p.add_argument("--queries", type=int, default=10000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="BLAS, OpenMP and torch threads of both sides (default 1)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with threadpool_limits(args.threads):
        run(args)


def run(args: argparse.Namespace) -> None:
    """Time the baselines and every kind (see the module docstring)."""
    rng = np.random.default_rng(args.seed)
    d = args.dim
    old = rng.standard_normal((args.pairs, d)).astype(np.float32)
    rotation = np.linalg.qr(rng.standard_normal((d, d)))[0]
    new = (old @ rotation + 0.3 * rng.standard_normal((args.pairs, d))).astype(np.float32)
    queries = rng.standard_normal((args.queries, d)).astype(np.float32)
    n64, o64 = l2_rows(new).astype(np.float64), l2_rows(old).astype(np.float64)

    def bare_procrustes():
        u, _, vt = np.linalg.svd(n64.T @ o64, full_matrices=False)
        return u @ vt

    def bare_affine():
        return np.linalg.lstsq(np.hstack([n64, np.ones((len(n64), 1))]), o64, rcond=None)[0]

    base_fit = {"procrustes": timed(bare_procrustes)[0], "affine": timed(bare_affine)[0]}
    weight = bare_procrustes().astype(np.float32)
    base_apply, _ = timed(lambda: queries @ weight, repeat=5)
    try:
        import onnxruntime as ort

        from engine.adapters.onnx_graph import onnx_model
    except ImportError:
        ort = None
    print(f"{args.pairs} pairs, {d} -> {d} dims, {args.queries} queries; best of 3 fits (mlp: 1) and 5 applies, wall times, "
          f"{args.threads} thread(s)")
    print(f"baseline numpy: procrustes fit {base_fit['procrustes']:.3f} s, affine fit (lstsq) {base_fit['affine']:.3f} s, "
          f"apply x @ W {1e6 * base_apply / args.queries:.3f} us/query")
    kinds = [("procrustes", {}), ("affine", {"ridge": 0.0}), ("cluster", {"clusters": 8}),
             ("cluster", {"clusters": 8, "routing": "soft"}), ("mlp", {"rank": 64, "epochs": 10})]
    for kind, options in kinds:
        fit_s, m = timed(lambda: fit_map(kind, new, old, options=options), repeat=1 if kind == "mlp" else 3)
        apply_s, _ = timed(lambda: m.apply(queries), repeat=5)
        base = base_fit.get(kind, base_fit["procrustes"])
        line = (f"{kind:<10} {str(options):<40} fit {fit_s:8.3f} s ({fit_s / base:7.1f}x numpy {'own closed form' if kind in base_fit else 'procrustes'})"
                f"  apply {1e6 * apply_s / args.queries:7.3f} us/query ({apply_s / base_apply:5.1f}x x @ W)")
        if ort is not None:
            so = ort.SessionOptions()
            so.intra_op_num_threads = so.inter_op_num_threads = args.threads
            session = ort.InferenceSession(onnx_model(m).SerializeToString(), so, providers=["CPUExecutionProvider"])
            onnx_s, got = timed(lambda: session.run(None, {"new": queries})[0], repeat=5)
            err = float(np.abs(got - m.apply(queries)).max())
            line += f"  onnxruntime {1e6 * onnx_s / args.queries:7.3f} us/query ({onnx_s / base_apply:5.1f}x; max diff {err:.1e})"
        print(line)


if __name__ == "__main__":
    main()
