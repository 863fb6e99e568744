"""Benchmark: training throughput (images/s) per method and device, and the quick-demo end-to-end time.

Throughput: one step-2 epoch of each method on 20 `shapes` classes (small CNN, batch 64), with the
old model attached where the method needs one. The baseline in the same run is the plain
cross-entropy step (`independent`); each method prints its ratio to it.

    python bench/bench_training.py              # throughput + full quick-demo (wall and CPU time)
    python bench/bench_training.py --no-demo
"""
from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import torch

from engine.core.config import TrainingConfig
from engine.data.shapes import make_shapes
from engine.methods import METHODS, build_method
from engine.methods.base import StepContext
from engine.models import build_model
from engine.methods.training import train_step


def throughput(method_name: str, device: torch.device, images: torch.Tensor, labels: torch.Tensor) -> float:
    method = build_method(method_name)
    k = 20 if method.head == "linear" else 30
    old = build_model(backbone="small_cnn", head=method.head, num_classes=10 if method.head == "linear" else k, width=32, seed=1)
    net = build_model(backbone="small_cnn", head=method.head, num_classes=k, width=32, seed=2)
    ctx = StepContext(step=2, seen_classes=tuple(range(20)), new_classes=tuple(range(10, 20)),
                      old_model=old.frozen_copy() if method.needs_old_model else None)
    cfg = TrainingConfig(epochs=1, batch_size=64, lr=0.01)
    train_step(net, method, images[:128], labels[:128], ctx, cfg, device=device, seed=0, augment_images=True)  # warm-up
    start = time.perf_counter()
    train_step(net, method, images, labels, ctx, cfg, device=device, seed=0, augment_images=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (len(labels) // 64) * 64 / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-demo", action="store_true")
    args = ap.parse_args()
    data = make_shapes(num_classes=20, per_class=100)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    for device in devices:
        base = throughput("independent", device, data.images, data.labels)
        print(f"device {device}: independent {base:.0f} images/s (baseline)")
        print("| method | device | images/s | ratio to independent |\n|---|---|---|---|")
        for name in sorted(METHODS):
            ips = throughput(name, device, data.images, data.labels)
            print(f"| {name} | {device.type} | {ips:.0f} | {ips / base:.2f} |")
    if not args.no_demo:
        from engine.run.pipeline import RunContext, run_study
        from engine.core.presets import preset_config
        from engine.data.fashion_files import fashion_available
        from storage import get_engine

        cfg = preset_config("quick-demo", fashion_present=fashion_available)
        with tempfile.TemporaryDirectory() as tmp:
            start, cpu = time.perf_counter(), _cpu_seconds()
            run_study(cfg, RunContext(get_engine(f"sqlite:///{tmp}/db.sqlite"), Path(tmp) / "ckpt"))
            print(f"quick-demo end to end ({len(cfg.methods)} methods x {len(cfg.seeds) or 1} seeds, train, extract, evaluate, "
                  f"store): wall {time.perf_counter() - start:.0f} s, CPU (user + sys) {_cpu_seconds() - cpu:.0f} s "
                  f"(target: wall < 300 s on an idle 2-core machine; wall is meaningless under load, CPU is not)")


def _cpu_seconds() -> float:
    """User + system CPU time of this process so far (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


if __name__ == "__main__":
    main()
