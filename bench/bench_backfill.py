"""Partial backfilling curves: incremental evaluation vs recomputing every fraction from scratch.

Synthetic but structured data: class centres plus noise; the old and the new model see the same latent
point, the new one with less noise and through a small rotation (so the cross-test is below the new
self-test). Paper B's protocol: the query set is the gallery set, each query's own image excluded.

The baseline, measured in the same run, rebuilds the mixed gallery at every fraction and calls
``retrieval_metrics`` (one full similarity pass per fraction). The curves must be identical. Three requests
are timed, each against its own baseline: Recall@1 alone, mAP alone, and both together.

    python bench/bench_backfill.py            # 10,000 x 10,000, 128-d, 100 classes, 21 fractions
    python bench/bench_backfill.py --n 2000   # a quick run
    python bench/bench_backfill.py --n 3000 --rollout   # also rank merge by rank and candidate re-scoring:
                                                         # compiled walk vs torch keys + ranking kernel per point
"""
from __future__ import annotations

import argparse
import time

import numba
import numpy as np
import torch

from engine.metrics.backfill import DEFAULT_FRACTIONS, backfill_counts, backfill_curves, curve_area, fraction_to_reach
from engine.metrics.backfill_orders import backfill_order
from engine.metrics.backfill_rollout import rank_merge_curves, rescoring_curves, rescoring_ks
from engine.metrics.retrieval import retrieval_metrics


def synthetic_pair(n: int, dim: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Old and new embeddings of the same n images (float32) and their labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim))
    labels = rng.integers(0, classes, n)
    latent = centres[labels] + 1.8 * rng.normal(size=(n, dim))
    skew = rng.normal(size=(dim, dim)) * 0.06
    rotation = torch.linalg.matrix_exp(torch.as_tensor(skew - skew.T)).numpy()  # orthogonal, near the identity
    old = latent + 1.5 * rng.normal(size=(n, dim))
    new = (latent + 0.6 * rng.normal(size=(n, dim))) @ rotation.T
    return old.astype(np.float32), new.astype(np.float32), labels


def naive_curves(query, labels, old, new, order, fractions, *, metrics: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The baseline: build the mixed gallery at every fraction and evaluate it from scratch."""
    rows = []
    for k in backfill_counts(fractions, len(old)):
        mixed = old.copy()
        mixed[order[:k]] = new[order[:k]]
        rows.append(retrieval_metrics(query, labels, mixed, labels, ks=(1,), same_set=True, compute_map="map" in metrics))
    return {m: np.array([r[m] for r in rows]) for m in metrics}


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000, help="gallery items (= queries)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--points", type=int, default=len(DEFAULT_FRACTIONS), help="grid points from 0 to 1")
    ap.add_argument("--order", default="distance_mse", help="backfilling order (engine.metrics.backfill_orders.ORDERINGS)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rollout", action="store_true", help="also time the roll-out curves (merge by rank, re-scoring)")
    args = ap.parse_args(argv)

    old, new, labels = synthetic_pair(args.n, args.dim, args.classes, args.seed)
    query = new  # the new model's embeddings of the gallery images; own image excluded (same_set)
    fractions = np.linspace(0.0, 1.0, args.points)
    order = backfill_order(args.order, old_gallery=old, gallery_labels=labels, seed=args.seed)
    print(f"{args.n} queries x {args.n} gallery items, {args.dim}-d, {args.classes} classes, {args.points} fractions, "
          f"order {args.order}; torch threads {torch.get_num_threads()}, numba threads {numba.get_num_threads()}")

    # compile / warm up both paths outside the timings
    small = slice(0, min(args.n, 200))
    backfill_curves(query[small], labels[small], old[small], new[small], labels[small], order=np.arange(small.stop),
                    fractions=fractions, same_set=True)
    backfill_curves(query[small], labels[small], old[small], new[small], labels[small], order=np.arange(small.stop),
                    fractions=fractions, metrics=("map",), same_set=True)
    naive_curves(query[small], labels[small], old[small], new[small], np.arange(small.stop), fractions[:2], metrics=("recall@1",))

    lines, ok = [], True
    for metrics in (("recall@1",), ("map",), ("recall@1", "map")):
        fast, t_fast = timed(lambda: backfill_curves(query, labels, old, new, labels, order=order, fractions=fractions,
                                                     metrics=metrics, same_set=True))
        slow, t_slow = timed(lambda: naive_curves(query, labels, old, new, order, fractions, metrics=metrics))
        same = all(np.array_equal(fast[m], slow[m]) for m in metrics)
        ok &= same
        what = " + ".join("Recall@1" if m == "recall@1" else "mAP" for m in metrics)
        print(f"\n[{what}] naive {t_slow:.2f} s, incremental {t_fast:.2f} s, ratio {t_slow / t_fast:.1f}x, "
              f"curves identical: {same}")
        for m in metrics:
            v = fast[m]
            reach = fraction_to_reach(fractions, v, v[-1])
            print(f"  {m}: cross-test {v[0]:.4f}, self-test {v[-1]:.4f}, M-tilde {curve_area(fractions, v):.4f}, "
                  f"reaches the self-test at beta = {reach:.3f}")
        lines.append(f"| {args.points}-point backfilling curve, {what}, {args.n:,} x {args.n:,}, {args.dim}-d | "
                     f"{t_slow:.1f} s | {t_fast:.1f} s | {t_slow / t_fast:.1f}x | {'identical' if same else 'DIFFERENT'} |")

    if args.rollout:  # old model's queries on the old index, new model's on the new one
        runs = {"rank merge by rank": lambda e, x: rank_merge_curves(
                    x[0], x[1], x[2], x[0], x[1], x[2], order=order[order < len(x[2])],  # the warm-up's order: its rows
                    fractions=fractions, merge="rank", same_set=True, engine=e),
                "candidate re-scoring": lambda e, x: rescoring_curves(
                    x[0], x[1], x[2], x[0], x[1], x[2], ks=rescoring_ks(len(x[2]), fractions), same_set=True, engine=e)}
        for what, run in runs.items():
            run("auto", (old[small], new[small], labels[small]))  # compile outside the timings
            fast, t_fast = timed(lambda: run("auto", (old, new, labels)))
            slow, t_slow = timed(lambda: run("torch", (old, new, labels)))
            same = all(np.array_equal(fast[m], slow[m]) for m in ("recall@1", "map"))
            ok &= same
            print(f"\n[{what}, Recall@1 + mAP] torch keys + ranking per point {t_slow:.2f} s, compiled walk {t_fast:.2f} s, "
                  f"ratio {t_slow / t_fast:.1f}x, curves identical: {same}")
            lines.append(f"| {args.points}-point {what}, Recall@1 + mAP, {args.n:,} x {args.n:,}, {args.dim}-d | "
                         f"{t_slow:.1f} s (torch keys) | {t_fast:.1f} s | {t_slow / t_fast:.1f}x | {'identical' if same else 'DIFFERENT'} |")

    print("\n| what | naive (recompute per beta) | incremental | speed-up | curves |")
    print("|---|---|---|---|---|")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
