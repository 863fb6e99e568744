"""Thumbnails of stored samples, rendered on demand from their references and cached on disk (torch-free).

A reference (``engine.data.samples``) names a dataset item or an image file; :func:`thumbnails` decodes only the
items asked for (a Fashion-MNIST read stops after the last one, a ``shapes`` class is generated up to the image
asked for, a file is opened alone), makes a ``size`` x ``size`` PNG (small images are enlarged with nearest
neighbour so their pixels stay visible, larger ones centre-cropped to a square and reduced), and keeps it in
``cache_dir`` under the SHA-256 of the reference: a later request reads the file and decodes nothing. Images
never enter the database. numpy and Pillow only, so the dashboard calls it in its own process.

CIFAR-10/100 batches are read whole by the restricted unpickler of ``engine.data.cifar_files`` (uint8, up to the
batch that holds the last item asked for: at most the split's files, 30-150 MB, each read bounded and its rows
checked before use), then cached per item. Image files are decoded within ``engine.data.image_decode``'s pixel
budget, JPEGs reduced while decoding.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from engine.data.cifar_files import FILES as CIFAR_FILES
from engine.data.cifar_files import batch_rows, read_batch
from engine.data.fashion_files import find_split, open_idx, read_idx_images
from engine.data.image_decode import decode_rgb
from engine.data.roots import confine, data_roots, sqlite_folder
from storage.safe_open import open_regular, read_regular
from engine.data.shapes import render_class

THUMB_SIZE = 64
MAX_THUMB_SIZE = 512  # JPEGs are decoded reduced (Image.draft) to no less than this; larger images are refused
MAX_PER_CALL = 20_000  # thumbnails one call may render (bounds the work of one request)
MAX_CACHED_BYTES = 4 * 2**20  # a cached PNG read at most (a 512 x 512 RGB PNG is under 1 MiB)
Decoder = Callable[[dict[str, Any], np.ndarray], list[np.ndarray | None]]


def thumbnail_dir(db_url: str) -> Path:
    """Where thumbnails are cached: ``thumbnails/`` beside a SQLite file (as checkpoints), else ``data/thumbnails``."""
    folder = sqlite_folder(db_url)
    return (folder if folder is not None else Path("data")) / "thumbnails"


def _digits(source: dict[str, Any], ids: np.ndarray) -> list[np.ndarray | None]:
    from sklearn.datasets import load_digits  # 1,797 8x8 images bundled with scikit-learn

    images = load_digits().images
    return [np.rint(images[i] / 16.0 * 255).astype(np.uint8) for i in ids]


def _fashion(source: dict[str, Any], ids: np.ndarray) -> list[np.ndarray | None]:
    found = find_split(confine(source["root"], what="Fashion-MNIST root"), source["split"])
    if found is None:
        return [None] * len(ids)
    with open_idx(found[0], ndim=3) as (_, dims):
        count = dims[0]
    keep = np.unique(ids)
    if len(keep) and not 0 <= keep[0] <= keep[-1] < count:
        raise ValueError(f"Fashion-MNIST {source['split']} has images 0..{count - 1}, not {int(keep[-1])}")
    pixels = read_idx_images(found[0], keep, count=count)
    return [pixels[np.searchsorted(keep, i), 0] for i in ids]


def _shapes(source: dict[str, Any], ids: np.ndarray) -> list[np.ndarray | None]:
    per_class, first = int(source["per_class"]), int(source["first_class"])
    out: list[np.ndarray | None] = [None] * len(ids)
    for c in np.unique(ids // per_class):  # one generator pass per class, up to the last image asked for
        rows = np.flatnonzero(ids // per_class == c)
        drawn = render_class(first + int(c), int(ids[rows].max() % per_class) + 1, source["split"], int(source["seed"]))
        for r in rows:
            out[r] = np.rint(drawn[ids[r] % per_class].transpose(1, 2, 0) * 255).astype(np.uint8)
    return out


def _cifar(source: dict[str, Any], ids: np.ndarray) -> list[np.ndarray | None]:
    folder_name, splits = CIFAR_FILES[source["dataset"]]
    folder = confine(source["root"], what="CIFAR root") / folder_name
    out: list[np.ndarray | None] = [None] * len(ids)
    start = 0
    for file in splits[source["split"]]:
        if start > ids.max():
            break
        path = folder / file
        if not path.is_file():
            return out
        rows = batch_rows(read_batch(path, source["dataset"]), path, source["dataset"], labels=False)[0]
        rows = rows.reshape(-1, 3, 32, 32)
        for r in np.flatnonzero((ids >= start) & (ids < start + len(rows))):
            out[r] = rows[ids[r] - start].transpose(1, 2, 0)
        start += len(rows)
    return out


def _files(source: dict[str, Any], ids: np.ndarray) -> list[np.ndarray | None]:
    out: list[np.ndarray | None] = []
    for i in ids:
        try:
            path = confine(Path(source["root"]) / source["files"][i], what="image")
            with open_regular(path, roots=data_roots(), what="image") as handle:
                out.append(np.asarray(decode_rgb(handle, min_side=MAX_THUMB_SIZE, always_draft=True)))
        except (OSError, ValueError, IndexError, Image.DecompressionBombError):
            out.append(None)  # moved, deleted, unreadable, over the pixel budget, or outside the data roots now
    return out


DECODERS: dict[str, Decoder] = {"digits": _digits, "fashion": _fashion, "shapes": _shapes, "cifar10": _cifar,
                                 "cifar100": _cifar, "files": _files}


def kind_of(source: dict[str, Any]) -> str:
    """The decoder name of a source: its dataset, or ``files``."""
    return "files" if "files" in source else str(source.get("dataset"))


def can_render(source: dict[str, Any] | None) -> bool:
    """Whether thumbnails of this source can be made here."""
    return source is not None and kind_of(source) in DECODERS


def square(pixels: np.ndarray, size: int = THUMB_SIZE) -> Image.Image:
    """``size`` x ``size`` image of uint8 pixels (H, W[, 3]): centre-cropped square; enlarged by nearest neighbour,
    reduced with Lanczos (large images first by box averaging: ``reducing_gap``)."""
    image = Image.fromarray(pixels)
    side = min(image.size)
    left, top = (image.width - side) // 2, (image.height - side) // 2
    method = Image.Resampling.NEAREST if side <= size else Image.Resampling.LANCZOS
    return image.crop((left, top, left + side, top + side)).resize((size, size), method, reducing_gap=3.0)


def _key(source: dict[str, Any], i: int, size: int) -> str:
    item = ({"root": source["root"], "file": source["files"][i]} if "files" in source
            else {"source": source, "index": int(i)})
    return hashlib.sha256(json.dumps({**item, "size": size}, sort_keys=True).encode()).hexdigest()


def _write(path: Path, data: bytes) -> None:
    """Cache ``data`` at ``path`` atomically (readers see the whole file or none); a read-only disk is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass  # the thumbnail is still returned; it is rendered again next time


def _cached(path: Path, cache_dir: Path) -> bytes | None:
    """A cached PNG: a regular file inside ``cache_dir`` (``storage.safe_open``), else None (rendered again)."""
    try:
        return read_regular(path, roots=[cache_dir], what="cached thumbnail", max_bytes=MAX_CACHED_BYTES)
    except (OSError, ValueError):
        return None


DIGITS = 1797  # scikit-learn's bundled digits
MAX_SHAPES_PER_CLASS = 100_000  # a shapes source's images per class (each class is rendered up to the last asked)
NEEDS = {"digits": (), "fashion": ("root", "split"), "shapes": ("per_class", "first_class", "split", "seed"),
         "cifar10": ("root", "split"), "cifar100": ("root", "split"), "files": ("root", "files")}


def check_reference(source: dict[str, Any], ids: np.ndarray) -> None:
    """A stored image reference and the items asked of it, checked before anything is decoded or rendered: the keys
    its kind needs, of the right types, and ids inside what it holds; a damaged or tampered one is one line (never an
    IndexError, a KeyError, or a render of billions of images)."""
    kind = kind_of(source)
    missing = [k for k in NEEDS.get(kind, ()) if k not in source]
    if missing:
        raise ValueError(f"the {kind} image reference lacks {', '.join(missing)}: it is damaged")
    if len(ids) and int(ids.min()) < 0:
        raise ValueError(f"image ids must be >= 0, got {int(ids.min())}")
    if kind == "digits" and len(ids) and int(ids.max()) >= DIGITS:
        raise ValueError(f"the digits hold images 0..{DIGITS - 1}, not {int(ids.max())}")
    if kind == "files":
        files = source["files"]
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise ValueError("the files image reference's file list is not a list of names: it is damaged")
        if len(ids) and int(ids.max()) >= len(files):
            raise ValueError(f"the image reference lists {len(files)} files, not an image {int(ids.max())}")
    if kind == "shapes":
        values = {k: source[k] for k in ("per_class", "first_class", "seed")}
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values.values()):
            raise ValueError(f"the shapes image reference's per_class, first_class and seed must be integers >= 0, "
                             f"got {values}")
        if not 1 <= values["per_class"] <= MAX_SHAPES_PER_CLASS:
            raise ValueError(f"the shapes image reference's per_class must be 1..{MAX_SHAPES_PER_CLASS:,}, got "
                             f"{values['per_class']:,}")


def thumbnails(source: dict[str, Any] | None, ids: Sequence[int] | np.ndarray, *, cache_dir: Path,
               size: int = THUMB_SIZE) -> list[bytes | None]:
    """PNG bytes of the items ``ids`` of ``source`` (None where no image can be had), from the cache or decoded."""
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) > MAX_PER_CALL:
        raise ValueError(f"{len(ids)} thumbnails asked for at once; at most {MAX_PER_CALL} per call")
    if not 8 <= size <= MAX_THUMB_SIZE:
        raise ValueError(f"thumbnail size must be 8..{MAX_THUMB_SIZE} px, got {size}")
    if not can_render(source):
        return [None] * len(ids)
    check_reference(source, ids)
    paths = [Path(cache_dir) / key[:2] / f"{key}.png" for key in (_key(source, int(i), size) for i in ids)]
    out: list[bytes | None] = [_cached(p, Path(cache_dir)) for p in paths]
    missing = [r for r, data in enumerate(out) if data is None]
    if missing:
        for r, pixels in zip(missing, DECODERS[kind_of(source)](source, ids[missing])):
            if pixels is not None:
                buffer = io.BytesIO()
                square(pixels, size).save(buffer, format="PNG")
                out[r] = buffer.getvalue()
                _write(paths[r], out[r])
    return out


def data_uri(png: bytes | None) -> str | None:
    """A ``data:image/png;base64,...`` URI (what a Vega tooltip's ``image`` field shows), or None."""
    return None if png is None else "data:image/png;base64," + base64.b64encode(png).decode("ascii")
