"""Whether a run config's dataset files are on disk, checked without reading them (torch-free).

The CLI learns it by loading the data (``engine.run.pipeline.check_study``); the New-experiment page's Check
cannot load torch, so it asks here, with the same roots (``engine.data.roots.confine``), the same files
(``engine.data.cifar_files.FILES``, ``engine.data.fashion_files``) and a message of the same shape. Built-in
data (digits, shapes) is always there; a download the config asks for counts as present.
"""
from __future__ import annotations

from pathlib import Path

from engine.data.cifar_files import FILES as CIFAR_FILES
from engine.data.fashion_files import fashion_available, missing_message
from engine.data.roots import confine

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
CIFAR = {"cifar10": ("CIFAR-10", "cifar-10-python.tar.gz", "batches.meta"),
         "cifar100": ("CIFAR-100", "cifar-100-python.tar.gz", "meta")}  # title, archive, meta file (torchvision's)


def dataset_files_problem(name: str, root: str | Path, *, download: bool = False) -> str | None:
    """One line saying which files of dataset ``name`` are missing under ``root`` (or why ``root`` is not read);
    None when they are there, when the dataset needs no files, or when ``download`` fetches them."""
    try:
        if name in CIFAR and not download:
            title, archive, meta = CIFAR[name]
            folder_name, splits = CIFAR_FILES[name]
            base = confine(root, what=f"{title} root")
            files = [base / folder_name / f for split in ("train", "test") for f in splits[split]]
            missing = [str(p.relative_to(base)) for p in [*files, base / folder_name / meta] if not p.is_file()]
            if missing:
                return (f"{title} not found under {base} (missing {', '.join(missing)}): download {archive} from "
                        f"{CIFAR_URL} and extract it into {base}, or let the run download it (dataset.download)")
        elif name == "fashion" and not download and not fashion_available(confine(root, what="Fashion-MNIST root")):
            return missing_message(root)
        elif name == "imagefolder":
            folder = confine(root, what="image folder")
            if not folder.is_dir():
                return f"image folder {folder} not found: give a folder with one sub-folder per class (or train/ and test/)"
    except ValueError as exc:  # outside the data roots, or not a path
        return str(exc)
    return None


def config_files_problem(config: dict) -> str | None:
    """:func:`dataset_files_problem` of a RunConfig dict's training dataset, then of its open-set dataset."""
    data = config.get("dataset", {})
    root, download = data.get("root", "data"), bool(data.get("download", False))
    for name in (data.get("name"), (config.get("eval") or {}).get("open_set_dataset")):
        problem = dataset_files_problem(name, root, download=download) if name else None
        if problem:
            return problem
    return None
