"""How the Learn demos run torch: tiny models, so one intra-op thread."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread, then restore the previous count.

    The demos' networks and 2x2 maps are so small that more threads only add synchronisation:
    measured here, a training batch of the 2-D digits network takes 2 ms on one thread and about
    30 ms on two threads of a busy 2-core machine. Restoring the count also undoes numba's OpenMP
    layer, which resets torch's thread count when ``retrieval_metrics`` runs its parallel kernel.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
