"""Where Fashion-MNIST's four IDX files are looked for (torch-free, so presets and the app can ask).

The first folder holding a split's two files wins: ``root``, ``root/FashionMNIST/raw`` (torchvision's
download folder), then Debian's ``/usr/share/datasets/fashion-mnist`` (package ``dataset-fashion-mnist``).
"""
from __future__ import annotations

from pathlib import Path

DEBIAN_ROOT = Path("/usr/share/datasets/fashion-mnist")
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def search_folders(root: str | Path) -> list[Path]:
    """The folders searched for the files, in order (see the module docstring)."""
    root = Path(root)
    return list(dict.fromkeys([root, root / "FashionMNIST" / "raw", DEBIAN_ROOT]))


def find_split(root: str | Path, split: str) -> tuple[Path, Path] | None:
    """(images, labels) paths of ``split`` in the first search folder that has both, else None."""
    for folder in search_folders(root):
        paths = [_file(folder, name) for name in FILES[split]]
        if all(paths):
            return paths[0], paths[1]
    return None


def fashion_available(root: str | Path = "data") -> bool:
    """Whether both splits can be read without a download."""
    return all(find_split(root, split) for split in FILES)


def missing_message(root: str | Path) -> str:
    """One line saying where the files were looked for and how to get them."""
    names = ", ".join(f"{n}[.gz]" for pair in FILES.values() for n in pair)
    return (f"Fashion-MNIST not found in {', '.join(map(str, search_folders(root)))}: run `apt-get install "
            f"dataset-fashion-mnist`, or put {names} under {root}, or set dataset.download = true")


def _file(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None
