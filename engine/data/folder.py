"""An ImageFolder tree (``root/<class>/<image>``) listed with bounds and decoded a batch at a time.

Listing walks the class folders the way torchvision's ``ImageFolder`` does (classes are the sorted
sub-folder names; files are taken folder by folder in sorted order, symlinked folders followed,
only image extensions), so labels and order are the same as before, but it stops at ``max_files``
images or ``max_folders`` folders and checks ``should_stop`` at every folder and file: a job that
points at a huge tree is refused or cancelled while walking, not after. Decoding (PIL: RGB, shorter
side resized to the size, centre crop, as ``transforms.Resize`` + ``CenterCrop`` + ``ToTensor``)
happens per batch of indices, so a folder is never held as floats.

Links stay inside the data roots (``engine.data.roots``; the tree's own root counts as one): the walk does not
enter a symlinked folder that leads out of them, and every image is opened by ``storage.safe_open`` (a
regular file whose opened path lies inside them, checked after opening), so a symlinked file leading out, a FIFO
or a device named like an image is refused with one line instead of read or waited on.

Errors name the root and what is wrong with it, never the folder's contents.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.transforms import functional as TF

from engine.core import signals
from engine.data.bounds import check_image_size
from engine.data.image_decode import ImageTooLargeError, decode_rgb
from engine.data.roots import data_roots
from storage.safe_open import inside_roots
from storage.safe_open import UnsafeFileError, open_regular
from engine.data.imageset import DatasetNotFoundError, ImageSet, IndexLike, as_float
from engine.data.samples import SampleRefs, file_refs

MAX_FOLDER_FILES = 500_000  # images listed at most (the file names alone stay well under 100 MB)
MAX_FOLDER_DIRS = 50_000  # folders walked at most (bounds symlink loops and trees without images)
DECODE_CHUNK = 256  # images decoded per step when a whole split is loaded as uint8 pixels
StopCheck = Callable[[], bool]


@dataclass(frozen=True, eq=False)
class FolderImages:
    """The listed image files of one tree with their labels; pixels are decoded on demand."""

    root: Path
    paths: tuple[str, ...]
    labels: torch.Tensor  # (N,) int64
    class_names: tuple[str, ...]
    should_stop: StopCheck | None = None

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def refs(self) -> SampleRefs:
        """A reference to each listed file (``engine.data.samples``)."""
        return file_refs(str(self.root), self.paths)

    def pixels(self, indices: IndexLike, size: int) -> torch.Tensor:
        """uint8 (n, 3, size, size) images of ``indices``: RGB, shorter side resized to ``size``, centre crop."""
        check_image_size(size)
        out = torch.empty((len(indices), 3, size, size), dtype=torch.uint8)
        roots = _roots(self.root)
        for row, i in enumerate(np.asarray(indices, dtype=np.int64)):
            check_stop(self.should_stop)
            out[row] = _decode(self.root, self.paths[int(i)], size, roots)
        return out

    def batch(self, indices: IndexLike | slice, *, size: int) -> torch.Tensor:
        """float32 [0, 1] images of ``indices`` decoded at ``size`` (the same values ``ToTensor`` gives)."""
        if isinstance(indices, slice):
            indices = range(len(self))[indices]
        return as_float(self.pixels(indices, size))

    def load(self, size: int, indices: IndexLike | None = None) -> ImageSet:
        """The images at ``indices`` (all when None) as a uint8 ``ImageSet``, decoded ``DECODE_CHUNK`` at a time."""
        chosen = np.arange(len(self)) if indices is None else np.asarray(indices, dtype=np.int64)
        out = torch.empty((len(chosen), 3, size, size), dtype=torch.uint8)
        for start in range(0, len(chosen), DECODE_CHUNK):
            out[start:start + DECODE_CHUNK] = self.pixels(chosen[start:start + DECODE_CHUNK], size)
        return ImageSet(out, self.labels[torch.from_numpy(chosen)], self.class_names, refs=self.refs.take(chosen))


def list_image_folder(root: str | Path, *, layout: str, max_files: int = MAX_FOLDER_FILES,
                      max_folders: int = MAX_FOLDER_DIRS, should_stop: StopCheck | None = None) -> FolderImages:
    """List the images of the tree at ``root`` (see the module docstring); ``layout`` ends every error."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetNotFoundError(f"image folder {root} not found: {layout}")
    try:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    except OSError as exc:
        raise DatasetNotFoundError(f"image folder {root} could not be read ({exc.strerror}): {layout}") from None
    if len(classes) > max_folders:
        raise ValueError(f"image folder {root} holds more than {max_folders} class folders; point at a smaller tree")
    paths: list[str] = []
    labels: list[int] = []
    budget = _Budget(root, max_files, max_folders, _roots(root))
    empty = 0
    for label, name in enumerate(classes):
        found = _walk_class(root, name, budget, should_stop)
        empty += not found
        paths.extend(found)
        labels.extend([label] * len(found))
    if not classes or empty:
        what = "no class sub-folders" if not classes else f"{empty} of its {len(classes)} class folder(s) without images"
        raise DatasetNotFoundError(f"image folder {root} has no usable images ({what}; image files end in "
                                   f"{', '.join(IMG_EXTENSIONS)}): {layout}")
    return FolderImages(root, tuple(paths), torch.tensor(labels, dtype=torch.int64), tuple(classes), should_stop)


class _Budget:
    """What is left of the caps on listed images and walked folders."""

    def __init__(self, root: Path, max_files: int, max_folders: int, roots: tuple[Path, ...]) -> None:
        self.root, self.max_files, self.max_folders, self.roots = root, max_files, max_folders, roots
        self.files, self.folders = max_files, max_folders

    def folder(self) -> None:
        self.folders -= 1
        if self.folders < 0:
            raise ValueError(f"image folder {self.root} holds more than {self.max_folders} folders (or a symlink loop); "
                             "point at a smaller tree")

    def file(self) -> None:
        self.files -= 1
        if self.files < 0:
            raise ValueError(f"image folder {self.root} holds more than {self.max_files} images; point at a smaller "
                             "tree or a train/ and test/ split of it")


def _walk_class(root: Path, name: str, budget: _Budget, should_stop: StopCheck | None) -> list[str]:
    """Image paths (relative to ``root``) under one class folder, in torchvision's order, within ``budget``."""
    folders: list[tuple[str, list[str]]] = []
    for dirpath, dirs, files in os.walk(root / name, followlinks=True):
        check_stop(should_stop)
        budget.folder()
        dirs[:] = [d for d in dirs if _inside(os.path.join(dirpath, d), budget.roots)]  # no walk out of the roots
        images = []
        for file in files:
            check_stop(should_stop)
            if file.lower().endswith(IMG_EXTENSIONS):
                budget.file()
                images.append(file)
        folders.append((dirpath, images))
    folders.sort()  # torchvision sorts the walk, i.e. by folder path, then each folder's files
    return [os.path.relpath(os.path.join(d, f), root) for d, files in folders for f in sorted(files)]


def _roots(root: Path) -> tuple[Path, ...]:
    """The folders a tree's files may lead into: the data roots and the tree's own (resolved) root."""
    return (Path(os.path.realpath(root)), *data_roots())


def _inside(path: str, roots: tuple[Path, ...]) -> bool:
    return inside_roots(Path(os.path.realpath(path)), roots)


def _decode(root: Path, relative: str, size: int, roots: tuple[Path, ...]) -> torch.Tensor:
    try:
        with open_regular(root / relative, roots=roots, what="image") as handle:
            image = decode_rgb(handle, min_side=size)  # its header's size checked before decoding
    except UnsafeFileError as exc:
        raise ValueError(f"{exc}; remove or replace it") from None
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        reason = exc if isinstance(exc, ImageTooLargeError) else type(exc).__name__
        raise ValueError(f"image {relative} in {root} could not be decoded ({reason}); remove or replace it") from None
    return TF.pil_to_tensor(TF.center_crop(TF.resize(image, size), size))


def check_stop(should_stop: StopCheck | None, message: str = "cancelled while reading the image folder") -> None:
    """Raise ``engine.core.signals.Cancelled`` (with ``message``) when ``should_stop`` says so."""
    signals.check_stop(should_stop, message)

