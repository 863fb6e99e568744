"""Decoding one image file within a pixel budget (Pillow only, torch-free, so the dashboard's thumbnails use it too).

``Image.open`` reads the header only; its width x height is checked before any pixel is decoded. A JPEG is first
reduced while it is decoded (``Image.draft``: 1/2, 1/4 or 1/8 scale), always for a thumbnail and, for the engine's
image loaders, only when it is over the budget (so an image under it decodes exactly as before). What is still over
``MAX_DECODE_PIXELS`` (a PNG cannot be reduced while decoding) is refused: a 445 kB PNG can declare 144 megapixels,
2 GB of RGB once decoded. Pillow's own ``Image.MAX_IMAGE_PIXELS`` guard is left as it is: it only warns below twice
its 89 megapixels, and the budget here is lower.
"""
from __future__ import annotations

import warnings
from typing import IO

from PIL import Image

MAX_DECODE_PIXELS = 50_000_000  # 150 MB as RGB; a 45-megapixel camera's photo fits


class ImageTooLargeError(ValueError):
    """An image whose decoded size is over the pixel budget; one line naming its size."""


def open_lazily(fp: str | IO[bytes]) -> Image.Image:
    """The image with its header read and no pixel decoded (Pillow's decompression-bomb warning silenced: the budget
    here is checked instead)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(fp)


def within_budget(image: Image.Image, *, min_side: int, always_draft: bool = False,
                  max_pixels: int = MAX_DECODE_PIXELS) -> Image.Image:
    """``image`` (opened lazily) set to decode at most ``max_pixels``: JPEG drafted to no less than ``min_side`` on
    either side (always, or only when over the budget); ``ImageTooLargeError`` when it is still over."""
    if always_draft or image.width * image.height > max_pixels:
        image.draft("RGB", (min_side, min_side))  # a no-op for formats that cannot decode reduced
    if image.width * image.height > max_pixels:
        raise ImageTooLargeError(f"{image.width}x{image.height} pixels, over the {max_pixels:,}-pixel budget for one "
                                 "image")
    return image


def decode_rgb(fp: str | IO[bytes], *, min_side: int, always_draft: bool = False,
               max_pixels: int = MAX_DECODE_PIXELS) -> Image.Image:
    """The first frame of an image file as RGB, decoded within ``max_pixels`` (see :func:`within_budget`)."""
    image = open_lazily(fp)
    try:
        return within_budget(image, min_side=min_side, always_draft=always_draft, max_pixels=max_pixels).convert("RGB")
    finally:
        image.close()
