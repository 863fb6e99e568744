"""Size bounds of images and batches, checked before anything is allocated (numpy only, no torch)."""
from __future__ import annotations

import numpy as np

MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 8, 1024  # pixels per side: digits' 8 px up to 4x a 256-px ImageNet crop
MAX_BATCH_SIZE = 4096


def bounded_int(value: object, what: str, low: int, high: int) -> int:
    """``value`` if it is an int in ``low..high``; otherwise a one-line ``ValueError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise ValueError(f"{what} must be an integer from {low} to {high}, got {value!r}")
    return int(value)


def check_image_size(value: object, what: str = "image size") -> int:
    """An image side length in pixels, ``MIN_IMAGE_SIZE..MAX_IMAGE_SIZE``."""
    return bounded_int(value, what, MIN_IMAGE_SIZE, MAX_IMAGE_SIZE)


def check_batch_size(value: object, what: str = "batch_size") -> int:
    """Images per batch, ``1..MAX_BATCH_SIZE``."""
    return bounded_int(value, what, 1, MAX_BATCH_SIZE)
