"""Options several commands share: ``--db`` with the data roots, and the checkpoint models with their images.

``compare-checkpoints`` and ``check-upgrade --model`` read the same model specs (:func:`add_model_arguments`,
:func:`models_spec_from_args`); every command that opens the database takes :func:`add_db`.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from engine.data import roots


def add_db(p: argparse.ArgumentParser, *, torchscript: bool = False) -> None:
    """``--db URL`` and the data-root options (``--allow-torchscript`` too when ``torchscript``)."""
    p.add_argument("--db", metavar="URL", help="database URL (default: $COMPATLAB_DB_URL or sqlite:///data/compatlab.db)")
    roots.add_arguments(p, torchscript=torchscript)


def add_model_arguments(p: argparse.ArgumentParser, *, model_group: argparse._ActionsContainer | None = None) -> None:
    """The checkpoint and image options (``--model``, ``--classes``, datasets, preprocessing, loading), shared with
    ``check-upgrade --model``; ``--model`` goes into ``model_group`` when given (else it is required)."""
    (model_group or p).add_argument("--model", action="append", required=model_group is None, dest="models",
                                    metavar="SPEC", help="PATH, PATH::NUM_CLASSES, PATH:ARCH[:NUM_CLASSES] or "
                                                         "pretrained:NAME (repeat, oldest first)")
    p.add_argument("--classes", action="append", metavar="FILE|A,B,...|-",
                   help="class list of each model, once per --model in the same order ('-': output i is class i)")
    p.add_argument("--dataset", metavar="NAME[:ROOT]",
                   help="closed-set: the images are query and gallery (own image excluded), e.g. imagefolder:PATH")
    p.add_argument("--query-dataset", metavar="NAME[:ROOT]", help="open-set: query images (with --gallery-dataset)")
    p.add_argument("--gallery-dataset", metavar="NAME[:ROOT]", help="open-set: gallery images, labels matched by class name")
    p.add_argument("--input-size", type=int, metavar="PX",
                   help="image size for every model (default: each architecture's own, e.g. 224 for torchvision, "
                        "240 for efficientnet_lite1; TorchScript and project models: the dataset's, 32 px for an image folder)")
    p.add_argument("--mean", metavar="M,M,M",
                   help="normalisation mean for every model (default: the architecture's, e.g. ImageNet's; none for "
                        "TorchScript and project models, which get images in [0, 1])")
    p.add_argument("--std", metavar="S,S,S", help="normalisation std for every model (with --mean)")
    p.add_argument("--max-size", default="2GB", metavar="SIZE", help="largest checkpoint file accepted (default 2GB)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")


def parse_model_arg(text: str) -> dict:
    """``PATH[:ARCH[:NUM_CLASSES]]`` (or ``pretrained:NAME``) -> a model dict of the comparison spec.

    A path may itself contain ``:``: the longest prefix naming an existing file is the path;
    otherwise trailing fields without ``/``, ``\\`` or ``.`` are read as ARCH and NUM_CLASSES.
    """
    if text.startswith("pretrained:"):
        return {"path": text}
    parts = text.split(":")
    cut = next((n for n in range(min(2, len(parts) - 1) + 1) if Path(":".join(parts[:len(parts) - n])).is_file()), None)
    if cut is None:
        cut = 0
        while cut < 2 and len(parts) - cut > 1 and not any(c in parts[-1 - cut] for c in "/\\."):
            cut += 1
    path, extra = ":".join(parts[:len(parts) - cut]), parts[len(parts) - cut:]
    if len(extra) == 1 and extra[0].isdigit():
        extra = ["", extra[0]]
    arch = extra[0] if extra else ""
    num = extra[1] if len(extra) > 1 else ""
    if num and not (num.isdigit() and int(num) > 0):
        raise ValueError(f"--model {text!r}: NUM_CLASSES must be a positive integer, got {num!r}")
    return {"path": path, "arch": arch or None, "num_classes": int(num) if num else None}


def models_spec_from_args(args: argparse.Namespace) -> dict:
    """The models, images and loading part of a comparison spec (the options of :func:`add_model_arguments`)."""
    models = [parse_model_arg(m) for m in args.models]
    if args.classes is not None:
        if len(args.classes) != len(models):
            raise ValueError(f"--classes was given {len(args.classes)} time(s) for {len(models)} --model(s); give it once "
                             "per model in the same order ('-' for a model without a class list)")
        for model, classes in zip(models, args.classes):
            model["classes"] = None if classes == "-" else classes
    if (args.mean is None) != (args.std is None):
        raise ValueError("give --mean and --std together")
    for model in models:
        model["preprocessing"] = {"input_size": args.input_size, "mean": args.mean, "std": args.std}
    return {"models": models, "dataset": args.dataset, "query_dataset": args.query_dataset,
            "gallery_dataset": args.gallery_dataset, "max_file_bytes": args.max_size, "batch_size": args.batch_size,
            "device": args.device}


def trec_folder(text: str) -> Path:
    """``--export trec DIR``'s folder: inside the data roots, and a folder when it exists; one line otherwise, before
    any work."""
    folder = roots.confine(text, what="--export trec")
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--export trec {text}: not a folder")
    return folder
