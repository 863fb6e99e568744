"""Benchmark: peak memory of the offline pretrained EfficientNet-Lite0/1/2 comparison on built-in images.

The job the dashboard calls "a quick check with no data to prepare": ``pretrained:efficientnet_lite0``,
``_lite1`` and ``_lite2`` (input sizes 224, 240 and 260 px) compared on the ``shapes`` test split
(32 px images) with every view, run on the CPU in a child process so that its peak RSS (VmHWM) is
its own. Printed against, in the same run:
  one batch   the float32 input batch at the largest size (batch_size x 3 x 260 x 260 x 4 bytes)
  floor       the child's peak after the imports and loading the three models, before any image
  old         the whole-set tensors the previous code held (every image at every model size, plus
              the native set): computed, not allocated

    python bench/bench_memory.py              # 2 images per class: 200 images (about 3 minutes of CPU time)
    python bench/bench_memory.py --full       # all 10,000 test images (several minutes per model on a CPU)
    python bench/bench_memory.py --per-class 5 --batch-size 32
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

MODELS = ("efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2")
SIZES = (224, 240, 260)  # engine.checkpoints.arch_table.LITE_INPUT_SIZES of the three models
NATIVE = 32  # shapes images
SHAPES_CLASSES = 100  # the shapes test split the comparison loads: 100 classes


def peak_rss_bytes() -> int:
    """This process's peak resident set size (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(models: list[dict], per_class: int, batch_size: int, threads: int) -> dict:
    """Run the comparison of ``models`` (comparison-spec entries) here; return images, floor, peak (bytes), seconds."""
    import torch

    import engine.checkpoints.embedding as embedding
    from engine.checkpoints.compare import compare_checkpoints
    from engine.checkpoints.loading import load_model
    from engine.checkpoints.request import model_source

    torch.set_num_threads(threads)
    for i, entry in enumerate(models, start=1):  # the floor: imports and the models' weights (the job loads them again)
        s = model_source(entry, index=i)
        load_model(s.path, arch=s.arch, num_classes=s.num_classes)
    floor = peak_rss_bytes()
    # the same shapes test split, cut to the first per_class images of each class (the job's own loader)
    embedding.load_dataset = partial(embedding.load_dataset, per_class=per_class)
    start = time.perf_counter()
    cmp = compare_checkpoints({"models": models, "dataset": "shapes", "batch_size": batch_size, "device": "cpu"})
    seconds = time.perf_counter() - start
    return {"images": len(cmp.split_labels["query"]), "floor": floor, "peak": peak_rss_bytes(), "seconds": seconds,
            "r1": {v: [round(float(x), 4) for x in r.values["recall@1"].diagonal()] for v, r in cmp.results.items()}}


LITE = [{"path": f"pretrained:{m}"} for m in MODELS]


def run_child(per_class: int, batch_size: int, *, models: list[dict] = LITE, threads: int = 2) -> dict:
    """``child`` in a fresh interpreter; its result dict."""
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(models), "--per-class", str(per_class),
                          "--batch-size", str(batch_size), "--threads", str(threads)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def batch_bytes(batch_size: int) -> int:
    """One float32 RGB input batch at the largest model size."""
    return batch_size * 3 * max(SIZES) ** 2 * 4


def old_bytes(images: int) -> int:
    """What the previous code held: the native float32 set plus the whole set at every model size."""
    return images * 3 * 4 * (NATIVE ** 2 + sum(s * s for s in SIZES))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--per-class", type=int, default=2,
                   help="test images per class of 100 (100 = all; 2+ gives every query a positive)")
    p.add_argument("--full", action="store_true", help="all 10,000 test images (per class 100)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads of the job")
    p.add_argument("--child", metavar="MODELS_JSON", help=argparse.SUPPRESS)
    args = p.parse_args()
    per_class = 100 if args.full else args.per_class
    if args.child:
        print(json.dumps(child(json.loads(args.child), per_class, args.batch_size, args.threads)))
        return
    r = run_child(per_class, args.batch_size, threads=args.threads)
    mb = 2 ** 20
    one, old, growth = batch_bytes(args.batch_size), old_bytes(r["images"]), r["peak"] - r["floor"]
    full_old = old_bytes(SHAPES_CLASSES * 100)
    print(f"EfficientNet-Lite0/1/2 on {r['images']} shapes test images (32 px -> {'/'.join(map(str, SIZES))} px), "
          f"batch {args.batch_size}, CPU: {r['seconds']:.1f} s")
    print(f"  one input batch at {max(SIZES)} px         {one / mb:9.1f} MB")
    print(f"  floor (imports + 3 models)         {r['floor'] / mb:9.1f} MB")
    print(f"  peak RSS of the job                {r['peak'] / mb:9.1f} MB   (growth over the floor {growth / mb:.1f} MB)")
    print(f"  old whole-set tensors (computed)   {old / mb:9.1f} MB   (all 10,000 images: {full_old / 2**30:.1f} GiB)")
    print(f"  growth / one batch                 {growth / one:9.2f}")
    print(f"  old tensors / peak RSS             {old / r['peak']:9.2f}")
    print(f"  self-test Recall@1 per view        {r['r1']}")


if __name__ == "__main__":
    main()
