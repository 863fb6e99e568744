"""Data-parallel training of one step over N processes: ``python -m engine run CONFIG --nproc N``.

Each step's training runs in N fresh processes started with ``torch.multiprocessing.start_processes`` (spawn),
one rank each, joined in one ``torch.distributed`` group (gloo on CPU, NCCL on CUDA, one GPU per rank) that
meets through a file in a temporary folder. Every rank runs the explicit loop of
:mod:`engine.methods.training` with the model wrapped in ``DistributedDataParallel``: it sees every N-th sample of
each global batch (``DistributedSampler`` semantics, same seed on every rank) and the gradients are averaged
over the ranks. Batch normalisation uses the statistics of the whole global batch (``torch.nn.SyncBatchNorm`` on
GPUs, :class:`GroupBatchNorm` on CPU), so N ranks with ``batch_size`` B train like one process with N x B. A
method's old model (BCT, distillation, ...) travels to every rank and is only read there.

The ranks only train: rank 0 writes the trained weights to the temporary folder, and the calling process (the
pipeline) loads them, writes the checkpoint, extracts features on its own device and records the step through
:mod:`engine.results.record`, as with one process. That is why the launcher is a spawn per step rather than
``torchrun`` around the whole command: the database, resume, cancel and study logic stay in one process that
never joins a process group, a rank that fails takes its group down and its error reaches the pipeline as one
line (``ValueError`` and ``Cancelled`` keep their type), and the training images reach the ranks as a
memory-mapped ``.npy`` file shared through the page cache, not N copies.
"""
from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn
from torch.multiprocessing.spawn import ProcessException

from engine.core.config import TrainingConfig
from engine.methods.base import Method, StepContext
from engine.models.net import Net
from engine.core.signals import Cancelled
from engine.methods.training import Hooks, Shard, train_step

POLL_S = 0.5  # how often the calling process relays progress and asks ``should_stop`` while the ranks train


def available_processes(device: torch.device) -> int:
    """How many ranks ``device`` can hold: one per GPU on CUDA, one per usable CPU core otherwise."""
    if device.type == "cuda":
        return torch.cuda.device_count()
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_nproc(nproc: int, device: torch.device) -> None:
    """Refuse a process count this machine cannot run (ValueError with what it can)."""
    available = available_processes(device)
    if not 1 <= nproc <= available:
        what = "GPU(s)" if device.type == "cuda" else "CPU core(s)"
        raise ValueError(f"--nproc {nproc} is not possible here: give 1 to {available} ({available} {what} on device {device.type})")


class _SumOverRanks(torch.autograd.Function):
    """The sum of a tensor over the ranks; its gradient is the sum of the ranks' gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        total = x.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        total = grad.clone()
        dist.all_reduce(total)
        return total


class GroupBatchNorm(nn.modules.batchnorm._BatchNorm):
    """Batch normalisation over the whole global batch of a process group (every rank's samples), on any device.

    The CPU (gloo) counterpart of ``torch.nn.SyncBatchNorm``, which runs on GPUs only: per-channel sums are
    all-reduced with autograd (two passes: mean, then centred squares), running statistics follow
    ``momentum`` as ``BatchNorm`` does (unbiased variance), and the parameter and buffer names are BatchNorm's.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-d input (batch, channels, ...), got {input.dim()}-d")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_initialized()):
            return super().forward(x)
        dims, shape = [0, *range(2, x.dim())], (1, -1) + (1,) * (x.dim() - 2)
        summed = _SumOverRanks.apply(torch.cat([x.sum(dims), x.new_tensor([x.numel() / x.shape[1]])]))
        n = summed[-1]
        centred = x - (summed[:-1] / n).view(shape)
        var = _SumOverRanks.apply(centred.pow(2).sum(dims)) / n
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.lerp_(summed[:-1] / n, m)
                self.running_var.lerp_(var * n / (n - 1), m)
        y = centred * torch.rsqrt(var + self.eps).view(shape)
        return y * self.weight.view(shape) + self.bias.view(shape) if self.affine else y


def _group_batchnorm(module: nn.Module) -> nn.Module:
    """``module`` with every BatchNorm layer replaced by a :class:`GroupBatchNorm` holding the same state."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        new = GroupBatchNorm(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
        new.load_state_dict(module.state_dict())
        for mine, theirs in zip(new.parameters(), module.parameters()):
            mine.requires_grad_(theirs.requires_grad)
        return new.train(module.training)
    for name, child in module.named_children():
        setattr(module, name, _group_batchnorm(child))
    return module


def sync_batchnorm(net: Net, device: torch.device) -> Net:
    """``net`` with global-batch BatchNorm: ``torch.nn.SyncBatchNorm`` on CUDA, :class:`GroupBatchNorm` elsewhere."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(net)
    return _group_batchnorm(net)


@dataclass(frozen=True)
class _RankJob:
    """What every rank needs; the images and labels are read from ``folder`` (memory-mapped)."""

    net: Net
    method: Method
    ctx: StepContext
    cfg: TrainingConfig
    device_type: str
    seed: int
    augment_images: bool
    nproc: int
    folder: str
    states: str | None  # every rank writes its weights here (tests); else only rank 0, into ``folder``


def _rank_main(rank: int, job: _RankJob, messages, stop) -> None:
    """One rank: join the group, train the step on its shard, write its weights (rank 0, or all when asked)."""
    try:
        cuda = job.device_type == "cuda"
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        else:
            torch.set_num_threads(max(1, available_processes(device) // job.nproc))
        folder = Path(job.folder)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=(folder / "rendezvous").as_uri(),
                                rank=rank, world_size=job.nproc)
        images = torch.from_numpy(np.load(folder / "images.npy", mmap_mode="c"))
        labels = torch.from_numpy(np.load(folder / "labels.npy"))
        net = sync_batchnorm(copy.deepcopy(job.net), device)  # its own weights: the pickled ones are shared memory
        on_epoch = (lambda e, n, parts: messages.put(("epoch", e, n, parts))) if rank == 0 else None
        history = train_step(net, job.method, images, labels, job.ctx, job.cfg, device=device, seed=job.seed,
                             augment_images=job.augment_images, hooks=Hooks(on_epoch=on_epoch, should_stop=stop.is_set),
                             shard=Shard(rank, job.nproc))
        if rank == 0 or job.states:
            state = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
            save_file(state, str(Path(job.states or folder) / f"rank_{rank}.safetensors"))
        if rank == 0:
            messages.put(("done", history))
        dist.destroy_process_group()
    except BaseException as exc:
        messages.put(("error", rank, type(exc).__name__, str(exc)))
        raise


def _rank_error(errors: list[tuple], exc: Exception) -> Exception:
    """The first rank error as the pipeline's exception types, in one line."""
    if not errors:
        return RuntimeError(f"a training process failed: {str(exc).strip().splitlines()[0]}")
    rank, kind, message = errors[0]
    if kind == "Cancelled":
        return Cancelled(message)
    if kind == "ValueError":
        return ValueError(message)
    return RuntimeError(f"training rank {rank} failed: {kind}: {message}")


def train_step_parallel(
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
    nproc: int,
    rank_states: Path | None = None,
) -> list[dict[str, float]]:
    """:func:`engine.methods.training.train_step` over ``nproc`` data-parallel processes; ``net`` gets rank 0's weights.

    ``cfg.batch_size`` is per rank (the effective batch is ``nproc`` times it; the learning rate is not scaled).
    ``hooks.on_epoch`` gets the loss parts averaged over the ranks; ``hooks.should_stop`` is asked here every
    ``POLL_S`` seconds and stops every rank at the same batch. ``rank_states``: a folder where every rank also
    writes its trained weights as ``rank_R.safetensors``.
    """
    check_nproc(nproc, device)
    hooks = hooks or Hooks()
    spawn = torch.multiprocessing.get_context("spawn")
    messages, stop = spawn.SimpleQueue(), spawn.Event()
    history: list[dict[str, float]] | None = None
    errors: list[tuple] = []

    def relay() -> None:
        nonlocal history
        while not messages.empty():
            kind, *rest = messages.get()
            if kind == "epoch" and hooks.on_epoch:
                hooks.on_epoch(*rest)
            elif kind == "done":
                history = rest[0]
            elif kind == "error":
                errors.append(tuple(rest))

    with tempfile.TemporaryDirectory(prefix="compatlab-ddp-") as tmp:
        folder = Path(tmp)
        np.save(folder / "images.npy", images.numpy())
        np.save(folder / "labels.npy", labels.numpy())
        job = _RankJob(net, method, ctx, cfg, device.type, seed, augment_images, nproc, tmp,
                       str(rank_states) if rank_states else None)
        if hooks.should_stop and hooks.should_stop():
            stop.set()  # the ranks stop at their first batch
        procs = torch.multiprocessing.start_processes(_rank_main, args=(job, messages, stop), nprocs=nproc,
                                                      join=False, start_method="spawn")
        try:
            finished = False
            while not finished:
                finished = procs.join(timeout=POLL_S)
                relay()
                if not finished and hooks.should_stop and hooks.should_stop():
                    stop.set()
        except ProcessException as exc:
            relay()
            raise _rank_error(errors, exc) from None
        finally:
            for p in procs.processes:  # the caller stopped (LeaseLost, Ctrl-C): no rank outlives it
                if p.is_alive():
                    p.terminate()
        relay()
        net.load_state_dict(load_file(str(Path(rank_states or folder) / "rank_0.safetensors")))
        net.eval()  # as train_step leaves it
    if history is None:
        raise RuntimeError("the training processes ended without a result")
    return history
