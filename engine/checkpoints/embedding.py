"""Feeding the images to loaded checkpoints: the evaluation image sets, each model's input batches, a probe
on one image and the extraction of every raw output (one batch in memory at a time).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from engine.checkpoints.files import CheckpointError
from engine.checkpoints.loading import LoadedModel
from engine.checkpoints.request import ModelSource, parse_dataset
from engine.data.folder import FolderImages, list_image_folder
from engine.data.imageset import ImageSet
from engine.data.registry import load_dataset
from engine.data.roots import confine
from engine.core.cell import RAW_VIEWS
from engine.models.extract import extract_outputs

IMAGEFOLDER_SIZE = 32  # image-folder size for models that do not name one (the project's own models)
MAX_BATCH_BYTES = 2**30  # one float32 input batch at most (64 images at 260 px take 52 MB)


class ImageSource:
    """One evaluation image set, read once and handed out one batch at a time at each model's size.

    An image folder is listed (bounded, cancellable) and every batch is decoded from its files with
    the shorter side resized to the size and centre-cropped; a built-in dataset's test split is kept
    as loaded and each batch is resized (bilinear, antialiased) when a model needs another size.
    """

    def __init__(self, text: str, should_stop: Callable[[], bool] | None = None) -> None:
        self.text = text
        self.name, self.root = parse_dataset(text)
        self.should_stop = should_stop
        self._images: ImageSet | FolderImages | None = None

    @property
    def images(self) -> ImageSet | FolderImages:
        """The labels, class names and (built-in) pixels, loaded on first use."""
        if self._images is None:
            if self.name == "imagefolder":
                self._images = list_image_folder(confine(self.root, what="image folder"),
                                                 layout="put one sub-folder of images per class there",
                                                 should_stop=self.should_stop)
            else:
                self._images = load_dataset(self.name, split="test", **({"root": self.root} if self.root else {}))
        return self._images

    def batch(self, indices: slice, size: int | None) -> torch.Tensor:
        """float32 [0, 1] images of ``indices`` at ``size`` (None: the set's own size; 32 px for a folder)."""
        if self.name == "imagefolder":
            return self.images.batch(indices, size=size or IMAGEFOLDER_SIZE)
        return self.images.batch(indices, size=size)


def model_batch(x: torch.Tensor, model: LoadedModel, source: ModelSource) -> torch.Tensor:
    """One batch as the model takes it: channels adapted, then normalised with the declared or the model's mean/std."""
    channels = x.shape[1]
    if model.in_channels and channels != model.in_channels:
        if channels == 1:
            x = x.expand(-1, model.in_channels, -1, -1)
        elif model.in_channels == 1:
            x = x.mean(dim=1, keepdim=True)
        else:
            raise CheckpointError(model.path, f"takes {model.in_channels}-channel images but the dataset has {channels}")
    mean, std = (source.mean, source.std) if source.mean is not None else (model.mean, model.std)
    if mean is not None:
        if len(mean) != x.shape[1]:
            raise CheckpointError(model.path, f"mean/std have {len(mean)} values but the images have {x.shape[1]} channels")
        x = (x - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
    return x.contiguous()


def check_batch_bytes(batch_size: int, sizes: Sequence[int | None]) -> None:
    """A float32 RGB input batch at the largest size must fit in ``MAX_BATCH_BYTES``."""
    largest = max((s for s in sizes if s), default=IMAGEFOLDER_SIZE)
    per_image = 3 * largest * largest * 4
    if batch_size * per_image > MAX_BATCH_BYTES:
        raise ValueError(f"a batch of {batch_size} images at {largest} px takes {batch_size * per_image / 2**30:.1f} GiB "
                         f"as float32; use batch_size <= {max(1, MAX_BATCH_BYTES // per_image)}")



def common_labels(query: ImageSet | FolderImages, gallery: ImageSet | FolderImages) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Open-set labels matched by class name: the gallery's classes first, then query-only classes."""
    names = list(gallery.class_names) + [n for n in query.class_names if n not in set(gallery.class_names)]
    position = {n: i for i, n in enumerate(names)}
    remap = np.array([position[n] for n in query.class_names], dtype=np.int64)
    return remap[query.labels.numpy()], gallery.labels.numpy().astype(np.int64), tuple(names)



# --- running the models ----------------------------------------------------------------------


def _last_line(exc: BaseException) -> str:
    """The most specific line of an error from a user's model (torch puts it last)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return re.sub(r"^\w+(Error|Exception): ", "", lines[-1]) if lines else type(exc).__name__


def probe(model: LoadedModel, source: ModelSource, x: torch.Tensor) -> None:
    """Run the model on one image: it must work on these inputs and give 2-D logits of the declared size."""
    try:
        with torch.inference_mode():
            out = model.net.eval()(x[:1])
    except Exception as exc:  # noqa: BLE001 - a user's model can fail in any way; say which file and on what input
        raise CheckpointError(model.path, f"fails on {tuple(x.shape[1:])} input images: {_last_line(exc)}") from None
    if out.logits.ndim != 2 or out.logits.shape[1] < 1:
        raise CheckpointError(model.path, f"gives logits of shape {tuple(out.logits.shape)}; expected (batch, classes)")
    outputs = int(out.logits.shape[1])
    if model.kind == "torchscript":
        if source.num_classes is not None and outputs != source.num_classes:
            raise CheckpointError(model.path, f"its forward gives {outputs} outputs but {source.num_classes} classes "
                                              "were declared")
        model.net.head.num_outputs = outputs
        model.num_outputs = outputs
    if source.classes is not None and len(source.classes) != outputs:
        raise CheckpointError(model.path, f"its class list has {len(source.classes)} names but the model has {outputs} outputs")


def extract(model: LoadedModel, batches: Iterator[torch.Tensor], device: torch.device) -> dict[str, np.ndarray]:
    """Embed the batches; errors of the images (a bad file, a cancel) pass through, the model's name the file."""
    data_errors: list[BaseException] = []

    def guarded() -> Iterator[torch.Tensor]:
        while True:
            try:
                x = next(batches)
            except StopIteration:
                return
            except BaseException as exc:
                data_errors.append(exc)
                raise
            yield x

    try:
        raw = extract_outputs(model.net, guarded(), device=device)
    except Exception as exc:  # as in probe: name the file
        if data_errors:
            raise
        raise CheckpointError(model.path, f"failed while embedding the images ({_last_line(exc)})") from None
    for view in RAW_VIEWS:
        bad = ~np.isfinite(raw[view]).all(axis=1)
        if bad.any():
            raise CheckpointError(model.path, f"gives NaN/inf {view} outputs for {int(bad.sum())} of {len(bad)} images")
    return raw
