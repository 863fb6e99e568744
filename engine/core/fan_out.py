"""How a fan-out is cut (torch-free: the CLI and the dashboard read it without the engine's weight)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FanOut:
    """Query rows per block and gallery rows per partition of a search on a Dask cluster
    (:mod:`engine.evaluate.matrix`, :mod:`engine.evaluate.dask_search`)."""

    block_rows: int = 10_000
    shard_rows: int = 100_000

    def __post_init__(self) -> None:
        if self.block_rows < 1 or self.shard_rows < 1:
            raise ValueError(f"query block and gallery partition rows must be >= 1, got {self.block_rows} and "
                             f"{self.shard_rows}")


def check_fan_out_gallery(gallery_kind: str) -> None:
    """Refuse what the fanned-out search does not compute: ``ValueError`` for a gallery kind other than ``instance``."""
    if gallery_kind != "instance":
        raise ValueError(f"evaluation on a Dask cluster needs the instance gallery (eval.gallery), got {gallery_kind!r}")
