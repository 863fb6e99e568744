"""``python -m engine adapt``: fit paper 004's adapters between two stored models and print the query/gallery table."""
from __future__ import annotations

import argparse

from engine.cli.options import add_db
from engine.core.contract import same_set_of
from engine.core.kinds import ADAPTERS, PAPER_ADAPTERS


def add_arguments(ad: argparse.ArgumentParser) -> None:
    """The options of ``adapt``."""
    ad.add_argument("--experiment", type=int, required=True, help="experiment id (see the dashboard or 'run' output)")
    ad.add_argument("--old-step", type=int, default=1)
    ad.add_argument("--new-step", type=int, help="default: the last step")
    ad.add_argument("--kind", choices=PAPER_ADAPTERS, default=PAPER_ADAPTERS[0],
                    help=" · ".join(f"{k}: {ADAPTERS[k].help}" for k in PAPER_ADAPTERS))
    ad.add_argument("--view", default="encoder")
    ad.add_argument("--epochs", type=int, default=60)
    ad.add_argument("--batch-size", type=int, default=64)
    ad.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (the paper's 1e-3 suits large feature sets)")
    ad.add_argument("--lam", type=float, default=12.0, help="lambda of the lambda-orthogonality regulariser")
    add_db(ad)


def cmd_adapt(args: argparse.Namespace) -> int:
    """``adapt``: fit and store the adapters of two steps, print the query/gallery table and backfilling areas."""
    from engine.analysis.adapted import AdapterJob, run_adapters
    from storage import get_engine, get_experiment, list_model_versions, session_scope

    db = get_engine(args.db)
    with session_scope(db) as s:
        exp = get_experiment(s, args.experiment)
        if exp is None:
            raise ValueError(f"no experiment {args.experiment} in the database")
        versions = {v.step: v.id for v in list_model_versions(s, exp.id)}
        same_set = same_set_of(exp.config)
    new_step = args.new_step or max(versions)
    if args.old_step not in versions or new_step not in versions or args.old_step >= new_step:
        raise ValueError(f"experiment {args.experiment} has steps {sorted(versions)}; choose --old-step < --new-step among them")
    fit = {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr} | ({"lam": args.lam} if args.kind == "lambda" else {})
    result = run_adapters(db, AdapterJob(versions[args.old_step], versions[new_step], args.kind, args.view, same_set, fit))
    print(f"{'query/gallery':<16}{'Recall@1':>10}{'mAP':>10}")
    for row in result["table"]:
        print(f"{row['row']:<16}{100 * row['recall@1']:>10.2f}{100 * row['map']:>10.2f}")
    for name, c in result["backfill"].items():
        print(f"backfill {name:<16} M-tilde Recall@1 {100 * c['area']['recall@1']:.2f}  mAP {100 * c['area']['map']:.2f}")
    return 0
