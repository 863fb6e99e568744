"""``python -m engine evaluate``: compatibility matrices for a folder of ``step_*.npz`` features."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.core.kinds import STRICT, TIE_RULES, TIES_HELP, canonical_metric
from engine.cli.options import add_db
from engine.results.json_file import write_json_atomic
from engine.results.report import FORMATS


def add_arguments(ev: argparse.ArgumentParser) -> None:
    """The options of ``evaluate``."""
    ev.add_argument("--features", required=True, type=Path, metavar="DIR", help="folder with step_1.npz ... step_T.npz")
    ev.add_argument("--metric", action="append", dest="metrics", metavar="NAME", type=canonical_metric,
                    help="recall@K, map or map@K (repeatable; default recall@1 and map)")
    ev.add_argument("--gallery-kind", "--protocol", dest="gallery_kind", choices=("instance", "template"), default="instance")
    ev.add_argument("--same-set", action="store_true", help="queries are the gallery images: exclude each query's own image")
    ev.add_argument("--ties", choices=TIE_RULES, default=STRICT, help=TIES_HELP)
    ev.add_argument("--json", type=Path, metavar="OUT", help="write the matrices and AC/AA/ACA as JSON")
    ev.add_argument("--export", choices=FORMATS[1:], help="also print the matrices as CSV, Markdown or LaTeX")
    ev.add_argument("--name", help="experiment name in the database (default: the folder name)")
    ev.add_argument("--no-store", action="store_true", help="do not write to the database")
    add_db(ev)


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``evaluate``: print the folder's matrices, store them as an experiment (unless ``--no-store``)."""
    from engine.checkpoints.evaluate_folder import evaluate_folder, load_feature_folder, result_json

    metrics = tuple(args.metrics or ("recall@1", "map"))
    if not args.no_store and args.name is None:  # the folder's name is the experiment's: a column must hold it
        from storage import name_problem

        if problem := name_problem(args.features.name, what="the folder name (the default --name)"):
            raise ValueError(problem)
    folder = load_feature_folder(args.features)
    if not args.no_store:  # a database that cannot take the result is refused before computing it
        from storage import get_engine, init_db

        init_db(get_engine(args.db))
    from engine.metrics.paired import PairedOptions
    from engine.metrics.same_set import resolve_same_set
    from engine.results.matrix_text import matrix_text

    args.same_set, note = resolve_same_set(folder.sets, args.same_set)  # queries that are the gallery: own item out
    if note:
        print(f"note: {note}", file=sys.stderr)
    result = evaluate_folder(folder, metrics=metrics, gallery_kind=args.gallery_kind, same_set=args.same_set,
                             paired=PairedOptions(on_its_own=True))  # check-upgrade's two intervals per cross-test
    for name in result.values:
        print(matrix_text(result, name, title=f"{name} ({args.gallery_kind}{', same set' if args.same_set else ''})",
                          ties=args.ties))
        if args.export:
            print(matrix_text(result, name, fmt=args.export, title=name, ties=args.ties, metric=name, view="external",
                              gallery_kind=args.gallery_kind))
    payload = {"features": str(args.features), "gallery_kind": args.gallery_kind, "same_set": args.same_set,
               "metrics": result_json(result, ecc_ties=args.ties)}
    if not args.no_store:
        from engine.checkpoints.evaluate_folder import store_feature_evaluation
        from storage import get_engine

        config = {"source": "features", "folder": str(args.features.resolve()), "metrics": list(metrics),
                  "gallery_kind": args.gallery_kind, "same_set": args.same_set, "ties": args.ties}
        payload["experiment_id"] = store_feature_evaluation(get_engine(args.db), name=args.name or args.features.name,
                                                            config=config, sets=folder.sets, result=result,
                                                            gallery_kind=args.gallery_kind, ties=args.ties)
        print(f"stored as experiment {payload['experiment_id']}")
    if args.json:
        write_json_atomic(args.json, payload)
    return 0
