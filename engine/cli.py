"""Command line: ``python -m engine <command>``.

Commands: ``evaluate`` (matrices for a folder of features). Every refused input prints one line
``error: ...`` on stderr and exits with code 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.report import FORMATS, render_matrix


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL", help="database URL (default: $COMPATLAB_DB_URL or sqlite:///data/compatlab.db)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="Compatibility Lab engine")
    sub = parser.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("evaluate", help="compatibility matrices for a folder of step_*.npz features")
    ev.add_argument("--features", required=True, type=Path, metavar="DIR", help="folder with step_1.npz ... step_T.npz")
    ev.add_argument("--metric", action="append", dest="metrics", metavar="NAME",
                    help="recall@K, map or map@K (repeatable; default recall@1 and map)")
    ev.add_argument("--protocol", choices=("instance", "template"), default="instance")
    ev.add_argument("--same-set", action="store_true", help="queries are the gallery images: exclude each query's own image")
    ev.add_argument("--ties", choices=("fail", "pass"), default="fail", help="ECC on a tie: strict > (fail) or >= (pass)")
    ev.add_argument("--json", type=Path, metavar="OUT", help="write the matrices and AC/AA/ACA as JSON")
    ev.add_argument("--export", choices=FORMATS[1:], help="also print the matrices as CSV, Markdown or LaTeX")
    ev.add_argument("--name", help="experiment name in the database (default: the folder name)")
    ev.add_argument("--no-store", action="store_true", help="do not write to the database")
    _add_db(ev)
    return parser


def cmd_evaluate(args: argparse.Namespace) -> int:
    from engine.evaluate_folder import evaluate_folder, load_feature_folder, result_json

    metrics = tuple(args.metrics or ("recall@1", "map"))
    folder = load_feature_folder(args.features)
    result = evaluate_folder(folder, metrics=metrics, protocol=args.protocol, same_set=args.same_set)
    for name, C in result.values.items():
        print(render_matrix(C, title=f"{name} ({args.protocol}{', same set' if args.same_set else ''})",
                            comparable=result.comparable, ties=args.ties))
        if args.export:
            print(render_matrix(C, fmt=args.export, title=name, comparable=result.comparable, ties=args.ties))
    payload = {"features": str(args.features), "protocol": args.protocol, "same_set": args.same_set,
               "metrics": result_json(result, ecc_ties=args.ties)}
    if not args.no_store:
        from engine.persist import store_feature_evaluation
        from storage import get_engine

        config = {"source": "features", "folder": str(args.features.resolve()), "metrics": list(metrics),
                  "protocol": args.protocol, "same_set": args.same_set}
        payload["experiment_id"] = store_feature_evaluation(get_engine(args.db), name=args.name or args.features.name,
                                                            config=config, sets=folder.sets, result=result, protocol=args.protocol)
        print(f"stored as experiment {payload['experiment_id']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


COMMANDS = {"evaluate": cmd_evaluate}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
