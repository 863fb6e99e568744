"""A million-item cross-test on a laptop: labels and label-free, search + per-query outcomes + paired bootstrap.

Generates (seeded, in blocks) an old and a new gallery of ``--items`` x ``--dim`` vectors, written as float16 ``.npy``
files under a temporary folder (never one array in memory), and ``--queries`` queries embedded by both models: items of
``--classes`` classes (class centre + noise) under the old model; the new model is a random rotation of the old space
plus noise; the adapter is a least-squares map new -> old fitted on a sample of 20,000 gallery items. Then:

1. search (:func:`engine.metrics.topk.stream_topk`, the gallery read back from disk in blocks): old, new and adapted
   queries against the old gallery in one pass, new queries against the new gallery (the label-free reference);
2. per-query outcomes: Recall@1 with class labels (:func:`label_outcomes`), neighbour recall@k against the new/new
   top-k (:func:`neighbour_recall`);
3. the paired bootstrap the verdict uses (:func:`engine.metrics.cell_interval.paired_intervals`, over queries) of
   new->old and adapted->old against old->old.

Prints wall time split into read / search / outcomes / bootstrap, the peak RSS of the process through the check (and
after the baseline, which holds a float32 block of similarities and its argpartition), and a ratio of the
engine's search against a plain numpy baseline (blocked float32 matmul + argpartition + merge) measured in the same
run on ``--baseline-queries`` queries against the same gallery. Run: ``python bench/bench_million.py --items 100000``.

``--backfill-depth D`` also times the backfill curves from sources (:mod:`engine.upgrade.backfill_sources`): the new
queries' top-D lists on both galleries (two more streamed passes), the adapter-residual order (one lock-step pass),
and the merges of the 21-point curves for the random and residual orders (Recall@1 with labels), with the share of
queries the lists decide; its time is printed as a ratio against the check's own search measured in the same run.
"""
from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from engine.core.conventions import relevance_phrase
from engine.metrics.cell_interval import paired_intervals
from engine.metrics.backfill import curve_area
from engine.metrics.backfill_orders import backfill_order
from engine.metrics.list_merge import list_curves
from engine.metrics.relevance import label_outcomes, neighbour_recall
from engine.metrics.topk import stream_topk
from engine.upgrade.backfill_sources import MAX_PENDING_BLOCKS, residual_order

GEN_BLOCK = 16384


class Clock:
    """Seconds spent per phase."""

    def __init__(self):
        self.spent: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.spent[phase] = self.spent.get(phase, 0.0) + seconds


def model_pair(dim: int, classes: int, seed: int):
    """Class centres, the new model's rotation, and the noise scales."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)).astype(np.float32)
    rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    # a partial rotation: new = old @ (0.3 I + 0.7 R), so old and new spaces are related but not the same
    return centres, (0.3 * np.eye(dim) + 0.7 * rotation).astype(np.float32)


def embed(rng, centres, mix, labels, item_noise=2.5, model_noise=0.9):
    """Old and new embeddings of items of the given labels (the same items under both models)."""
    base = centres[labels] + item_noise * rng.standard_normal((len(labels), centres.shape[1]), dtype=np.float32)
    new = base @ mix + model_noise * rng.standard_normal(base.shape, dtype=np.float32)
    return base, new


def write_npy(path: Path, shape: tuple[int, int], dtype) -> "open":
    """An open ``.npy`` file with its header written; the caller appends the rows."""
    f = open(path, "wb")
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                             "fortran_order": False, "shape": shape})
    return f


def generate(folder: Path, items: int, dim: int, classes: int, seed: int, dtype) -> tuple[np.ndarray, tuple]:
    """Write old.npy and new.npy (items x dim) block by block; return the gallery labels and the model pair."""
    centres, mix = model_pair(dim, classes, seed)
    rng = np.random.default_rng(seed + 1)
    labels = rng.integers(0, classes, items)
    with write_npy(folder / "old.npy", (items, dim), dtype) as fo, write_npy(folder / "new.npy", (items, dim), dtype) as fn:
        for lo in range(0, items, GEN_BLOCK):
            old, new = embed(rng, centres, mix, labels[lo: lo + GEN_BLOCK])
            fo.write(old.astype(dtype).tobytes())
            fn.write(new.astype(dtype).tobytes())
    return labels, (centres, mix)


def read_blocks(path: Path, block: int, clock: Clock):
    """``(ids, vectors)`` blocks of a ``.npy`` file read with plain file reads (no memory map: pages do not stay mapped)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape, _, dtype = np.lib.format.read_array_header_1_0(f) if version == (1, 0) else np.lib.format.read_array_header_2_0(f)
        for lo in range(0, shape[0], block):
            t = time.perf_counter()
            n = min(block, shape[0] - lo)
            vectors = np.fromfile(f, dtype=dtype, count=n * shape[1]).reshape(n, shape[1])
            clock.add("read", time.perf_counter() - t)
            yield np.arange(lo, lo + n), vectors


def first_rows(path: Path, n: int) -> np.ndarray:
    """The first ``n`` rows of a ``.npy`` file, as float32."""
    blocks = read_blocks(path, n, Clock())
    rows = next(blocks)[1].astype(np.float32)
    blocks.close()
    return rows


def numpy_baseline(q: np.ndarray, path: Path, block: int, k: int) -> np.ndarray:
    """Plain numpy: float32 blocks, matmul, argpartition, merge with the running top-k (the ids, unordered)."""
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    best_s = np.full((len(q), 0), -np.inf, np.float32)
    best_i = np.zeros((len(q), 0), np.int64)
    for ids, vectors in read_blocks(path, block, Clock()):
        g = vectors.astype(np.float32)
        g /= np.linalg.norm(g, axis=1, keepdims=True)
        s = qn @ g.T
        part = np.argpartition(-s, k - 1, axis=1)[:, :k]
        all_s = np.concatenate([best_s, np.take_along_axis(s, part, 1)], 1)
        all_i = np.concatenate([best_i, ids[part]], 1)
        keep = np.argpartition(-all_s, k - 1, axis=1)[:, :k]
        best_s, best_i = np.take_along_axis(all_s, keep, 1), np.take_along_axis(all_i, keep, 1)
    return best_i


def peak_mb() -> float:
    """Peak resident memory of this process so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10, help="depth of the top-k lists (neighbour recall@k)")
    ap.add_argument("--block", type=int, default=65536, help="gallery rows per block read")
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--baseline-queries", type=int, default=500)
    ap.add_argument("--dtype", choices=("float16", "float32"), default="float16")
    ap.add_argument("--backend", choices=("numpy", "torch", "faiss"), default="numpy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--folder", type=Path, default=None, help="where the .npy files go (default: a temporary folder)")
    ap.add_argument("--backfill-depth", type=int, default=0, metavar="D",
                    help="also time the backfill curves from top-D lists (0: not timed)")
    args = ap.parse_args()
    dtype = np.dtype(args.dtype)
    clock = Clock()
    after_imports = peak_mb()
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        g_labels, (centres, mix) = generate(folder, args.items, args.dim, args.classes, args.seed, dtype)
        gen_s = time.perf_counter() - t0
        rng = np.random.default_rng(args.seed + 2)
        q_labels = rng.integers(0, args.classes, args.queries)
        q_old, q_new = embed(rng, centres, mix, q_labels)
        # adapter new -> old: least squares on 20,000 gallery items (the first block(s) of both files)
        t = time.perf_counter()
        fit_old, fit_new = (first_rows(folder / name, 20_000) for name in ("old.npy", "new.npy"))
        adapter, *_ = np.linalg.lstsq(fit_new, fit_old, rcond=None)
        q_adapted = (q_new @ adapter).astype(np.float32)
        fit_s = time.perf_counter() - t
        gallery_mb = args.items * args.dim * dtype.itemsize / 1e6
        print(f"gallery {args.items:,} x {args.dim} {args.dtype} ({gallery_mb:,.0f} MB per model on disk), "
              f"{args.queries:,} queries, k={args.k}, block {args.block:,}, backend {args.backend}, "
              f"torch threads {torch.get_num_threads()}; generated in {gen_s:.1f} s, adapter fitted in {fit_s:.1f} s")

        start = time.perf_counter()
        t = time.perf_counter()
        stacked = np.concatenate([q_old, q_new, q_adapted])
        on_old = stream_topk(stacked, read_blocks(folder / "old.npy", args.block, clock), k=args.k, backend=args.backend)
        reference = stream_topk(q_new, read_blocks(folder / "new.npy", args.block, clock), k=args.k, backend=args.backend)
        clock.add("search", time.perf_counter() - t - clock.spent["read"])
        n = args.queries
        cells = {name: type(on_old)(on_old.ids[i * n:(i + 1) * n], on_old.scores[i * n:(i + 1) * n],
                                    on_old.tied_beyond[i * n:(i + 1) * n], on_old.n_gallery)
                 for i, name in enumerate(("old->old", "new->old", "adapted->old"))}

        t = time.perf_counter()
        ids = np.arange(args.items)
        labels = {c: label_outcomes(top, q_labels, ids, g_labels, ks=(1,)) for c, top in cells.items()}
        free = {c: neighbour_recall(top, reference, ks=(args.k,)) for c, top in cells.items()}
        clock.add("outcomes", time.perf_counter() - t)

        t = time.perf_counter()
        rows = []
        for kind, out, metric in (("labels", labels, "recall@1"), ("none", free, f"neighbour_recall@{args.k}")):
            base = out["old->old"].values[metric]
            ivs = paired_intervals(base, [out["new->old"].values[metric], out["adapted->old"].values[metric]],
                                   seed=(args.seed, 1, 0), resamples=args.resamples, confidence=0.95)
            rows.append((kind, metric, out, ivs))
        clock.add("bootstrap", time.perf_counter() - t)
        total = time.perf_counter() - start
        check_peak = peak_mb()

        for kind, metric, out, ivs in rows:
            print(f"\n[{relevance_phrase(kind, k=args.k, n_no_relevant=out['old->old'].n_no_relevant)}]")
            print("  " + "  ".join(f"{c} {o.means()[metric]:.4f}" for c, o in out.items()))
            for name, iv in zip(("new->old", "adapted->old"), ivs):
                print(f"  {name} - old->old: {iv.diff:+.4f} [{iv.lo:+.4f}, {iv.hi:+.4f}] over {iv.n:,} {iv.interval}")

        nb = min(args.baseline_queries, n)
        t = time.perf_counter()
        base_ids = numpy_baseline(q_new[:nb], folder / "old.npy", args.block, args.k)
        numpy_s = time.perf_counter() - t
        t = time.perf_counter()
        mine = stream_topk(q_new[:nb], read_blocks(folder / "old.npy", args.block, Clock()), k=args.k, backend=args.backend)
        engine_s = time.perf_counter() - t
        agree = np.mean([len(set(a) & set(b)) / args.k for a, b in zip(base_ids, mine.ids)])
        if args.backfill_depth > 0:
            backfill = time_backfill(folder, q_new, q_labels, g_labels, args)

    split = ", ".join(f"{p} {s:.1f} s" for p, s in clock.spent.items())
    print(f"\nend to end (search + outcomes + bootstrap, both relevance kinds): {total:.1f} s = {split}")
    print(f"peak RSS of the process through the check: {check_peak:,.0f} MB (after the imports of torch and the engine: "
          f"{after_imports:,.0f} MB; with the numpy baseline run after it: {peak_mb():,.0f} MB)")
    print(f"search of {nb} queries x {args.items:,} items: engine {engine_s:.2f} s, numpy baseline {numpy_s:.2f} s, "
          f"ratio numpy/engine {numpy_s / engine_s:.2f}x; same neighbours {agree:.4f}")
    if args.backfill_depth > 0:
        spent, decided, areas, peak = backfill
        total_b = sum(spent.values())
        print(f"backfill curves (top-{args.backfill_depth} lists, 2 orders x 21 points, Recall@1): {total_b:.1f} s = "
              + ", ".join(f"{p} {s:.1f} s" for p, s in spent.items())
              + f"; ratio backfill / the check's search {total_b / clock.spent['search']:.2f}x; queries decided at the "
              f"worst point {100 * decided:.1f}%; areas " + ", ".join(f"{o} {a:.4f}" for o, a in areas.items())
              + f"; peak RSS after it {peak:,.0f} MB")


def time_backfill(folder: Path, q_new: np.ndarray, q_labels: np.ndarray, g_labels: np.ndarray, args):
    """Seconds per phase of the backfill from sources, the worst share of decided queries, the areas, the peak RSS."""
    spent: dict[str, float] = {}
    t = time.perf_counter()
    on_old = stream_topk(q_new, read_blocks(folder / "old.npy", args.block, Clock()), k=args.backfill_depth,
                         backend=args.backend)
    on_new = stream_topk(q_new, read_blocks(folder / "new.npy", args.block, Clock()), k=args.backfill_depth,
                         backend=args.backend)
    spent["top-D lists (read + search)"] = time.perf_counter() - t
    t = time.perf_counter()
    orders = {"random": backfill_order("random", gallery_labels=g_labels, seed=args.seed),
              "adapter_residual": residual_order(read_blocks(folder / "old.npy", args.block, Clock()),
                                                 read_blocks(folder / "new.npy", args.block, Clock()), args.items,
                                                 max_pending=MAX_PENDING_BLOCKS * args.block)}
    spent["orders"] = time.perf_counter() - t
    t = time.perf_counter()
    ids = np.arange(args.items)
    curves = list_curves(on_old, on_new, orders, lambda top, rows: label_outcomes(
        top, q_labels[rows], ids, g_labels, ks=(1,)).values["recall@1"], k=1)
    spent["merges"] = time.perf_counter() - t
    areas = {name: curve_area(c.fractions, c.values) for name, c in curves.items()}
    return spent, min(float(c.decided.min()) for c in curves.values()), areas, peak_mb()


if __name__ == "__main__":
    main()
