"""The explicit training loop of one step, with a few typed hooks.

The loop owns data order, augmentation, optimiser, schedule, mixed precision (CUDA only) and
cancellation; the method (``engine.methods``) owns the loss and says what it needs.

On CUDA the step's training images are copied to the GPU once when they take at most
``RESIDENT_FRACTION`` of its free memory (``bench/bench_gpu_training.py``: the per-batch gather,
augmentation and host-to-device copy otherwise bound the loop), and conv networks run in
channels_last. Batch order and augmentation come from the same CPU generator either way, so a run
sees the same batches on any device.

Data-parallel training (:mod:`engine.run.ddp`) calls the same loop once per rank with a :class:`Shard`: the
model is wrapped in ``DistributedDataParallel``, every rank draws the same global batches (``batch_size`` per
rank times the world size) and keeps every ``world``-th sample of each, as ``DistributedSampler`` does.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from engine.core.signals import Cancelled
from engine.core.config import TrainingConfig
from engine.data.loaders import crop_flip
from engine.methods.base import Method, StepContext
from engine.models.net import Net


RESIDENT_FRACTION = 0.25  # at most this share of the GPU's free memory holds a step's training images


def fits_on_device(images: torch.Tensor, device: torch.device) -> bool:
    """Whether ``images`` can be kept on a CUDA ``device`` for the whole step (never on CPU: it already is)."""
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return images.numel() * images.element_size() <= RESIDENT_FRACTION * free


@dataclass
class Hooks:
    """Callbacks the loop calls; all optional."""

    on_epoch: Callable[[int, int, dict[str, float]], None] | None = None  # (epoch, epochs, mean loss parts)
    on_batch: Callable[[int, int], None] | None = None  # (batch index, batches per epoch)
    should_stop: Callable[[], bool] | None = None


@dataclass(frozen=True)
class Shard:
    """This process's place in a data-parallel group (an initialised ``torch.distributed`` process group)."""

    rank: int = 0
    world: int = 1


STOP_EVERY = 10  # batches between two stop checks of a data-parallel group (each one is a collective)


def _all_ranks(values: torch.Tensor, shard: Shard, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
    """``values`` reduced over the ranks (itself on one process)."""
    if shard.world > 1:
        dist.all_reduce(values, op=op)
    return values


def _stop_asked(hooks: Hooks, shard: Shard, batch_index: int, device: torch.device) -> bool:
    """Whether to stop before this batch: ``hooks.should_stop``, agreed by every rank of a group."""
    if shard.world > 1 and batch_index % STOP_EVERY:
        return False
    asked = bool(hooks.should_stop and hooks.should_stop())
    if shard.world == 1:
        return asked
    return bool(_all_ranks(torch.tensor([float(asked)], device=device), shard, dist.ReduceOp.MAX).item())


def make_optimizer(net: Net, cfg: TrainingConfig) -> torch.optim.Optimizer:
    """SGD (momentum, weight decay) or Adam over the trainable parameters."""
    params = [p for p in net.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}; use 'sgd' or 'adam'")


def lr_factor(epoch: int, cfg: TrainingConfig) -> float:
    """Learning-rate multiplier at ``epoch`` (0-based) for the configured schedule."""
    if cfg.lr_schedule == "constant":
        return 1.0
    if cfg.lr_schedule == "step":
        return cfg.lr_gamma ** sum(epoch >= m for m in cfg.lr_milestones)
    if cfg.lr_schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * epoch / max(cfg.epochs, 1)))
    raise ValueError(f"unknown lr_schedule {cfg.lr_schedule!r}; use 'constant', 'step' or 'cosine'")


def epoch_batches(n: int, batch: int, gen: torch.Generator, memory: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The index batches of one epoch over ``n`` samples, drawn with ``gen``.

    ``memory`` None: a permutation of 0..n-1 cut into full batches (the last incomplete one dropped).
    ``memory`` a boolean ``(n,)`` mask of replay-memory samples: balanced batches as in the CL2R/iamcl2r
    code, each with ``batch // 2`` memory samples followed by ``batch - batch // 2`` other samples. The
    other samples are each used once per epoch in a seeded order (the last incomplete batch dropped);
    the memory ones come from successive seeded permutations of the memory, so a memory smaller than
    its share of the epoch is cycled.
    """
    if memory is None:
        perm = torch.randperm(n, generator=gen)
        return [perm[b * batch:(b + 1) * batch] for b in range(n // batch)]
    if memory.shape != (n,):
        raise ValueError(f"the replay mask has shape {tuple(memory.shape)} but there are {n} samples")
    mem, rest = torch.nonzero(memory).flatten(), torch.nonzero(~memory).flatten()
    half, other = batch // 2, batch - batch // 2
    if half < 1 or len(mem) == 0 or len(rest) < other:
        raise ValueError(f"balanced replay batches of {batch} need at least 1 replay image and {other} new images, "
                         f"got {len(mem)} and {len(rest)}; use a batch size of at least 2 or balanced_replay = false")
    rest = rest[torch.randperm(len(rest), generator=gen)]
    n_batches = len(rest) // other
    cycles = math.ceil(n_batches * half / len(mem))
    mem = torch.cat([mem[torch.randperm(len(mem), generator=gen)] for _ in range(cycles)])
    return [torch.cat([mem[b * half:(b + 1) * half], rest[b * other:(b + 1) * other]]) for b in range(n_batches)]


def train_step(
    net: Net,
    method: Method,
    images: torch.Tensor,
    labels: torch.Tensor,
    ctx: StepContext,
    cfg: TrainingConfig,
    *,
    device: torch.device,
    seed: int,
    augment_images: bool,
    hooks: Hooks | None = None,
    resident: bool | None = None,
    shard: Shard = Shard(),
) -> list[dict[str, float]]:
    """Train ``net`` in place on (images, labels) for ``cfg.epochs`` epochs; return per-epoch mean loss parts.

    ``labels`` are class ids; they are mapped to head outputs by the head. Batches are shuffled by a
    generator seeded with ``seed`` and the last incomplete batch is dropped (contrastive losses need
    at least two samples); :func:`epoch_batches` balances them when ``method.balances_replay(ctx)``.
    The learning rate starts from ``method.step_lr(cfg.lr, ctx)`` and follows ``cfg.lr_schedule``. ``resident`` keeps the images on ``device`` for the whole step (None:
    when :func:`fits_on_device`). ``shard``: this rank of a data-parallel group; ``cfg.batch_size`` is then per
    rank, the loss parts are averaged over the ranks, and a stop asked on any rank stops them all at the same batch.
    """
    hooks = hooks or Hooks()
    if len(labels) < 2 * shard.world:
        raise ValueError(f"step {ctx.step} has {len(labels)} training image(s); at least {2 * shard.world} are needed")
    fmt = torch.channels_last if device.type == "cuda" and images.dim() == 4 else torch.contiguous_format
    net.to(device, memory_format=fmt).train()
    model = net if shard.world == 1 else DistributedDataParallel(net, device_ids=[device] if device.type == "cuda" else None)
    old = ctx.old_model.to(device, memory_format=fmt).eval() if ctx.old_model is not None else None
    targets = net.head.class_to_output(labels)
    keep_on_device = fits_on_device(images, device) if resident is None else resident
    if keep_on_device:
        images, targets = images.to(device), targets.to(device)
    opt = make_optimizer(net, cfg)
    use_amp = cfg.amp and device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    gen = torch.Generator().manual_seed(seed)  # batch order: the same on every rank
    aug_gen = gen if shard.world == 1 else torch.Generator().manual_seed(seed + 100_003 * (shard.rank + 1))
    batch = min(cfg.batch_size, len(labels) // shard.world)
    memory = torch.isin(labels, torch.tensor(ctx.replay_classes, dtype=labels.dtype)) if method.balances_replay(ctx) else None
    base_lr = method.step_lr(cfg.lr, ctx)
    history = []
    for epoch in range(cfg.epochs):
        for group in opt.param_groups:
            group["lr"] = base_lr * lr_factor(epoch, cfg)
        batches = [b[shard.rank::shard.world] for b in epoch_batches(len(labels), batch * shard.world, gen, memory)]
        n_batches = len(batches)
        sums: dict[str, float] = {}
        for b, idx in enumerate(batches):
            if _stop_asked(hooks, shard, b, device):
                raise Cancelled(f"cancelled during step {ctx.step}, epoch {epoch + 1}")
            idx = idx.to(images.device)
            x = images[idx]
            if augment_images:
                x = crop_flip(x, aug_gen)  # random crop (padding size/8) + horizontal flip, on the images' device
            x = x.to(device, non_blocking=True).contiguous(memory_format=fmt)
            y = targets[idx].to(device, non_blocking=True)
            with torch.autocast(device.type, enabled=use_amp):
                out = model(x)
                old_out = None
                if old is not None:
                    with torch.no_grad():
                        old_out = old(x)
                loss, parts = method.loss(out, y, ctx, old_out)
            if not torch.isfinite(loss):
                raise ValueError(f"loss became {loss.item()} at step {ctx.step}, epoch {epoch + 1}; lower the learning rate")
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + float(v)
            if hooks.on_batch:
                hooks.on_batch(b, n_batches)
        names = list(sums)  # the same order on every rank: the same method fills it
        totals = [sums[k] for k in names]
        if shard.world > 1:
            totals = _all_ranks(torch.tensor(totals, dtype=torch.float64, device=device), shard).tolist()
        means = {k: v / max(n_batches * shard.world, 1) for k, v in zip(names, totals)}
        history.append(means)
        if hooks.on_epoch:
            hooks.on_epoch(epoch + 1, cfg.epochs, means)
    net.to(memory_format=torch.contiguous_format).eval()  # checkpoints (safetensors) need contiguous weights
    return history


def throughput(net: Net, method: Method, images: torch.Tensor, labels: torch.Tensor, ctx: StepContext, cfg: TrainingConfig,
               *, device: torch.device) -> float:
    """Training images per second over one epoch (used by the benchmark)."""
    start = time.perf_counter()
    train_step(net, method, images, labels, ctx, cfg, device=device, seed=0, augment_images=images.shape[-1] >= 32)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return cfg.epochs * (len(labels) // min(cfg.batch_size, len(labels))) * min(cfg.batch_size, len(labels)) / (time.perf_counter() - start)
