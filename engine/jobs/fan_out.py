"""How a run evaluates through tasks (torch-free: the CLI and the dashboard read it without the engine's weight)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.vocab import VERIFICATION, parse_metric


@dataclass(frozen=True)
class FanOut:
    """Query rows and gallery rows per search task (:mod:`engine.jobs.search_tasks`)."""

    block_rows: int = 10_000
    shard_rows: int = 100_000

    def __post_init__(self) -> None:
        if self.block_rows < 1 or self.shard_rows < 1:
            raise ValueError(f"task block and shard rows must be >= 1, got {self.block_rows} and {self.shard_rows}")


def check_task_metrics(metrics: Sequence[str], protocol: str) -> None:
    """Refuse what the task graph does not compute: ``ValueError`` naming the metric or gallery protocol."""
    if protocol != "instance":
        raise ValueError(f"evaluation through tasks needs the instance gallery (eval.gallery), got {protocol!r}")
    for metric in metrics:
        if parse_metric(metric)[0] == VERIFICATION:
            raise ValueError(f"evaluation through tasks computes Recall@k and mAP, not {metric!r}")
