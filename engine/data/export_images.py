"""One split of a dataset as PNG class folders (the ``export-images`` command, :mod:`engine.cli.export_images`).

``OUT/<class name>/<position>.png``, one 8-bit grayscale or RGB PNG per image, ``position`` being
the image's place in the exported split (zero-padded, so sorted file names keep that order). Such a
tree is what the ``imagefolder`` dataset and ``compare-checkpoints --dataset imagefolder:OUT`` read,
so those paths run on real images (``--dataset fashion``). A class name is made a safe folder name
("T-shirt/top" becomes "T-shirt_top"). OUT must be absent or empty; the tree is written into a
temporary folder beside it and renamed into place, so an interrupted export leaves nothing at OUT.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path


def folder_name(class_name: str) -> str:
    """A class name as a folder name: path separators and other unsafe characters become '_'."""
    safe = re.sub(r"[^\w\-+ .,()]", "_", class_name).strip(" .")
    return safe or "_"


def export_images(dataset: str, out: Path, *, split: str = "test", max_per_class: int | None = None,
                  root: str | Path = "data") -> dict[str, int]:
    """Write ``split`` of ``dataset`` under ``out`` as PNG class folders; return images written per folder."""
    import numpy as np
    import torch
    from PIL import Image

    from engine.data.registry import load_dataset
    from engine.data.imageset import first_per_class
    from engine.data.registry import dataset_options

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} already exists and is not an empty folder; choose a new --out")
    if max_per_class is not None and max_per_class < 1:
        raise ValueError(f"--max-per-class must be at least 1, got {max_per_class}")
    cap = {"max_per_class": max_per_class} if max_per_class and "max_per_class" in dataset_options(dataset) else {}
    images = load_dataset(dataset, root=root, split=split, **cap)
    keep = first_per_class(images.labels.numpy(), max_per_class)
    folders = [folder_name(c) for c in images.class_names]
    if len(set(folders)) != len(folders):
        raise ValueError(f"classes of {dataset} map to the same folder name ({folders}); cannot export them apart")
    if images.images.shape[1] not in (1, 3):
        raise ValueError(f"{dataset} images have {images.images.shape[1]} channels; PNG export needs 1 or 3")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    counts: dict[str, int] = {}
    try:
        width = len(str(max(len(keep) - 1, 0)))
        for position, i in enumerate(keep):
            folder = folders[int(images.labels[i])]
            pixel = images.images[i]  # uint8 as stored, or float32 in [0, 1] (generated sets)
            pixels = (pixel if pixel.dtype == torch.uint8 else (pixel.clamp(0, 1) * 255).round().to(torch.uint8)).numpy()
            picture = Image.fromarray(pixels[0] if pixels.shape[0] == 1 else np.ascontiguousarray(pixels.transpose(1, 2, 0)))
            (tmp / folder).mkdir(exist_ok=True)
            picture.save(tmp / folder / f"{position:0{width}d}.png")
            counts[folder] = counts.get(folder, 0) + 1
        if out.exists():
            out.rmdir()  # empty (checked above); rename cannot replace it on every platform
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return counts
