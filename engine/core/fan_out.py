"""How a run evaluates through tasks (torch-free: the CLI and the dashboard read it without the engine's weight)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FanOut:
    """Query rows and gallery rows per search task (:mod:`engine.evaluate.search_tasks`)."""

    block_rows: int = 10_000
    shard_rows: int = 100_000

    def __post_init__(self) -> None:
        if self.block_rows < 1 or self.shard_rows < 1:
            raise ValueError(f"task block and shard rows must be >= 1, got {self.block_rows} and {self.shard_rows}")


def check_task_gallery(gallery_kind: str) -> None:
    """Refuse what the task graph does not search: ``ValueError`` for a gallery kind other than ``instance``."""
    if gallery_kind != "instance":
        raise ValueError(f"evaluation through tasks needs the instance gallery (eval.gallery), got {gallery_kind!r}")
