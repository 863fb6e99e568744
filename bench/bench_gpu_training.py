"""Benchmark: the engine's training loop against a plain DataLoader loop on the same device.

Baseline (measured in the same run): the textbook PyTorch loop: a shuffled ``DataLoader`` over the
CPU tensors (pinned memory), the same crop-and-flip augmentation per batch on the CPU, a
host-to-device copy per batch, AMP on CUDA, SGD. Against it:

* ``engine``: ``engine.methods.training.train_step`` as the pipeline runs it (on CUDA: images kept on the
  GPU when they fit, channels_last, AMP);
* ``engine, host data``: the same loop with the images left on the host (``resident=False``), the
  loop as it was before the GPU path was tuned;
* ``plain, GPU-resident``: the baseline loop with the data, the augmentation and the batches on the
  GPU and channels_last: the known levers, as a reference for what the engine should reach.

    python bench/bench_gpu_training.py                       # small CNN and ResNet-18, 10,000 32x32 images
    python bench/bench_gpu_training.py --backbones small_cnn --epochs 1 --per-class 100   # a quick CPU look

Prints images/s per variant and its ratio to the baseline. Without a GPU it runs on the CPU, where
the variants should all be close (nothing to copy).
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from engine.core.config import TrainingConfig
from engine.data.shapes import make_shapes
from engine.data.loaders import crop_flip
from engine.methods import build_method
from engine.methods.base import StepContext
from engine.models import build_model
from engine.methods.training import train_step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_loop(net, images, labels, device, *, epochs: int, batch: int, resident: bool) -> float:
    """The textbook loop; returns images/s. ``resident``: data, augmentation and batches on the device."""
    fmt = torch.channels_last if resident and device.type == "cuda" else torch.contiguous_format
    net = net.to(device, memory_format=fmt).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    amp = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    gen = torch.Generator().manual_seed(0)
    if resident:
        x_all, y_all = images.to(device), labels.to(device)
        n_batches = len(labels) // batch

        def batches():
            perm = torch.randperm(len(labels), generator=gen).to(device)
            for b in range(n_batches):
                idx = perm[b * batch:(b + 1) * batch]
                yield crop_flip(x_all[idx], gen).contiguous(memory_format=fmt), y_all[idx]
    else:
        loader = DataLoader(TensorDataset(images, labels), batch_size=batch, shuffle=True, drop_last=True,
                            pin_memory=device.type == "cuda", generator=gen)

        def batches():
            for x, y in loader:
                yield crop_flip(x, gen).to(device, non_blocking=True), y.to(device, non_blocking=True)

    seen = 0
    _sync(device)
    start = time.perf_counter()
    for _ in range(epochs):
        for x, y in batches():
            with torch.autocast(device.type, enabled=amp):
                loss = F.cross_entropy(net(x).logits, y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            seen += len(y)
    _sync(device)
    return seen / (time.perf_counter() - start)


def engine_loop(net, images, labels, device, *, epochs: int, batch: int, resident: bool | None) -> float:
    """``engine.methods.training.train_step`` with the plain cross-entropy method; returns images/s."""
    classes = tuple(range(int(labels.max()) + 1))
    ctx = StepContext(step=1, seen_classes=classes, new_classes=classes, old_model=None)
    cfg = TrainingConfig(epochs=epochs, batch_size=batch, lr=0.01)
    _sync(device)
    start = time.perf_counter()
    train_step(net, build_method("independent"), images, labels, ctx, cfg, device=device, seed=0,
               augment_images=True, resident=resident)
    _sync(device)
    return epochs * (len(labels) // batch) * batch / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbones", nargs="+", default=["small_cnn", "resnet18_cifar"])
    ap.add_argument("--per-class", type=int, default=500, help="shapes images per class (20 classes)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    data = make_shapes(num_classes=20, per_class=args.per_class)
    print(f"device: {name}; {len(data)} images {tuple(data.images.shape[1:])}, batch {args.batch}, "
          f"{args.epochs} epoch(s) per variant after a 1-epoch warm-up")
    variants = [
        ("plain DataLoader loop (baseline)", lambda net, e: plain_loop(net, data.images, data.labels, device, epochs=e, batch=args.batch, resident=False)),
        ("engine (as the pipeline runs it)", lambda net, e: engine_loop(net, data.images, data.labels, device, epochs=e, batch=args.batch, resident=None)),
        ("engine, host data (resident=False)", lambda net, e: engine_loop(net, data.images, data.labels, device, epochs=e, batch=args.batch, resident=False)),
        ("plain, GPU-resident + channels_last", lambda net, e: plain_loop(net, data.images, data.labels, device, epochs=e, batch=args.batch, resident=True)),
    ]
    for backbone in args.backbones:
        print(f"\n{backbone}\n| variant | images/s | ratio to baseline |\n|---|---|---|")
        base = None
        for label, run in variants:
            net = build_model(backbone=backbone, head="linear", num_classes=20, width=32 if backbone == "small_cnn" else None, seed=0)
            run(net, 1)  # warm-up: cuDNN autotuning, allocator, compiled kernels
            ips = run(net, args.epochs)
            base = base or ips
            print(f"| {label} | {ips:,.0f} | {ips / base:.2f} |")


if __name__ == "__main__":
    main()
