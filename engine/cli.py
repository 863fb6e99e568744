"""Command line: ``python -m engine <command>``.

Commands: ``run`` (train/evaluate a config or preset; several methods = a study), ``compare``
(the same, printing the paper-style methods table), ``evaluate`` (matrices for a folder of
features), ``compare-checkpoints`` (your own models on an image folder), ``adapt`` (paper 004's
adapters between two stored models), ``export-images`` (a dataset split as PNG class folders),
``worker`` (the background job runner), ``extract-tasks`` (one checkpoint's embedding of an image set, queued as
tasks for many workers; prints the job id), ``presets``, ``check-upgrade`` (the upgrade verdict of two
models' features; exit 0/1/3). Every refused input prints one
line ``error: ...`` on stderr and exits with code 2.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from engine.checkpoints.cli import add_arguments as add_checkpoint_arguments
from engine.checkpoints.cli import cmd_compare_checkpoints
from engine.checkpoints.files import add_ceiling_argument, export_ceiling
from engine.core.contract import JOB_KINDS, SHORT_JOB_KINDS, same_set_of
from engine.data import roots
from engine.data.export_images import add_arguments as add_export_arguments
from engine.data.export_images import cmd_export_images
from engine.core.fan_out import FanOut, check_task_gallery
from engine.results.json_file import json_target, write_json_atomic
from engine.results.report import FORMATS, render_matrix
from engine.upgrade.cli import add_arguments as add_upgrade_arguments
from engine.upgrade.cli import cmd_check_upgrade
from engine.reproduce.cli import add_arguments as add_reproduce_arguments


def _add_db(p: argparse.ArgumentParser, *, torchscript: bool = False) -> None:
    p.add_argument("--db", metavar="URL", help="database URL (default: $COMPATLAB_DB_URL or sqlite:///data/compatlab.db)")
    roots.add_arguments(p, torchscript=torchscript)


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
    for name, helptext in (("run", "train and evaluate a config (several methods = a study)"),
                           ("compare", "run several methods on one scenario and print the methods x AC/AA/ACA table")):
        r = sub.add_parser(name, help=helptext)
        r.add_argument("config", nargs="?", type=Path, help="TOML config file")
        r.add_argument("--preset", help="a named preset instead of a file (see 'presets')")
        r.add_argument("--methods", nargs="+", help="override the config's methods")
        r.add_argument("--device", help="override the device (auto, cpu, cuda)")
        r.add_argument("--epochs", type=int, help="override training.epochs")
        r.add_argument("--json", type=Path, metavar="OUT", help="write the study summary as JSON")
        r.add_argument("--export", choices=FORMATS, default="text" if name == "run" else "markdown",
                       help="format of the printed tables")
        r.add_argument("--checkpoints", type=Path, default=Path("data") / "checkpoints", help="checkpoint folder")
        r.add_argument("--quiet", action="store_true", help="no progress bar")
        r.add_argument("--nproc", type=int, default=1, metavar="N",
                       help="train each step data-parallel in N processes (one per GPU on CUDA, gloo on CPU)")
        r.add_argument("--tasks", action="store_true",
                       help="evaluate each matrix through tasks that any 'worker --tasks' (any machine) may share")
        r.add_argument("--task-block-rows", type=int, default=FanOut.block_rows, metavar="N",
                       help="with --tasks: query rows per search task")
        r.add_argument("--task-shard-rows", type=int, default=FanOut.shard_rows, metavar="N",
                       help="with --tasks: gallery rows per search task")
        _add_db(r)

    w = sub.add_parser("worker", help="run queued jobs from the database (used by the dashboard)")
    w.add_argument("--once", action="store_true", help="exit when the queue is empty")
    w.add_argument("--checkpoints", type=Path, default=Path("data") / "checkpoints")
    w.add_argument("--kinds", nargs="+", choices=JOB_KINDS, metavar="KIND",
                   help=f"run only jobs of these kinds ({', '.join(JOB_KINDS)}; default: every kind); run_app.py "
                        f"starts a second worker with --kinds {' '.join(SHORT_JOB_KINDS)}")
    w.add_argument("--tasks", action="store_true",
                   help="run tasks of fanned-out jobs (matrix cells, extractions) instead of jobs (any number of "
                        "machines, one database)")
    w.add_argument("--threads", type=int, metavar="N",
                   help="torch / BLAS / numba threads (default: $COMPATLAB_THREADS, else the libraries' own defaults, "
                        "every core; run_app.py has its workers share the cores: --share-cores)")
    w.add_argument("--share-cores", action="store_true",
                   help="as each job starts, use cores // the jobs running on this machine (this one included), "
                        "unless --threads or $COMPATLAB_THREADS gives a count (run_app.py starts its workers so)")
    _add_db(w, torchscript=True)
    add_ceiling_argument(w)

    ad = sub.add_parser("adapt", help="fit paper 004's adapters between two stored models; print the query/gallery table")
    ad.add_argument("--experiment", type=int, required=True, help="experiment id (see the dashboard or 'run' output)")
    ad.add_argument("--old-step", type=int, default=1)
    ad.add_argument("--new-step", type=int, help="default: the last step")
    ad.add_argument("--kind", choices=("perp", "lambda", "fct"), default="perp")
    ad.add_argument("--view", default="encoder")
    ad.add_argument("--epochs", type=int, default=60)
    ad.add_argument("--batch-size", type=int, default=64)
    ad.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (the paper's 1e-3 suits large feature sets)")
    ad.add_argument("--lam", type=float, default=12.0, help="lambda of the lambda-orthogonality regulariser")
    _add_db(ad)

    ex = sub.add_parser("extract-tasks", help="queue one checkpoint's embedding of an image set as tasks for many workers")
    ex.add_argument("--model-version", type=int, required=True, metavar="ID", help="the model version the features belong to")
    ex.add_argument("--checkpoint", required=True, metavar="FILE", help="checkpoint file (or pretrained:NAME)")
    ex.add_argument("--arch", help="architecture of a plain state_dict (see compare-checkpoints)")
    ex.add_argument("--num-classes", type=int, metavar="N")
    ex.add_argument("--input-size", type=int, metavar="PX", help="image size the model takes (default: its own)")
    ex.add_argument("--images", required=True, metavar="TEXT", help="NAME[:ROOT], e.g. imagefolder:/data/gallery")
    ex.add_argument("--split", required=True, help="query, gallery or train")
    ex.add_argument("--rows-per-task", type=int, default=10_000, metavar="N")
    ex.add_argument("--batch-size", type=int, default=64)
    ex.add_argument("--needs-gpu", action="store_true", help="only workers with a GPU take the extract tasks")
    _add_db(ex)

    cc = sub.add_parser("compare-checkpoints", help="compare your own checkpoints (TorchScript, state_dict, safetensors)")
    add_checkpoint_arguments(cc)
    _add_db(cc)

    add_export_arguments(sub.add_parser("export-images", help="write a dataset split as PNG class folders (for imagefolder)"))
    sub.add_parser("presets", help="list the named presets")
    add_upgrade_arguments(sub.add_parser("check-upgrade", help="can the new model ship without re-indexing? (ECC verdict, exit 0/1/3)"))
    rp = sub.add_parser("reproduce", help="reproduce named paper table cells (P2-Tab2, ...) over seeds; queued or --here")
    add_reproduce_arguments(rp)
    _add_db(rp)
    return parser


def _run_config(args: argparse.Namespace):
    """The config file or preset with the command line's overrides, validated as a whole."""
    from engine.core.config import config_from_dict, load_config
    from engine.core.presets import preset_config
    from engine.data.fashion_files import fashion_available

    if (args.config is None) == (args.preset is None):
        raise ValueError("give a config file or --preset NAME (exactly one)")
    cfg = preset_config(args.preset, fashion_present=fashion_available) if args.preset else load_config(args.config)
    data = cfg.to_dict()
    if args.methods:
        data |= {"methods": args.methods, "method_params": {m: p for m, p in cfg.method_params.items() if m in args.methods}}
    if args.device:
        data["device"] = args.device
    if args.epochs is not None:
        data["training"]["epochs"] = args.epochs
    return config_from_dict(data)


def _check_checkpoint_folder(path: Path) -> None:
    """``--checkpoints`` must be a folder or creatable as one (checked, not created, before any row is written)."""
    for folder in (path, *path.absolute().parents):
        if folder.exists():
            if not folder.is_dir():
                raise ValueError(f"--checkpoints {path}: {folder} is not a folder")
            if not os.access(folder, os.W_OK | os.X_OK):
                raise ValueError(f"--checkpoints {path}: {folder} is not writable")
            return


def cmd_run(args: argparse.Namespace) -> int:
    from engine.run.ddp import check_nproc
    from engine.models.device import pick_device
    from engine.run.pipeline import RunContext, check_study, run_study
    from engine.core.progress import TerminalProgress
    from engine.results.study_summary import print_study, study_summary
    from storage import get_engine, init_db

    cfg = _run_config(args)
    check_nproc(args.nproc, pick_device(cfg.device))
    fan_out = FanOut(args.task_block_rows, args.task_shard_rows) if args.tasks else None
    if fan_out is not None:
        check_task_gallery(cfg.eval.gallery)
    _check_checkpoint_folder(args.checkpoints)
    data = check_study(cfg)  # everything refusable is refused before the database is touched
    db = get_engine(args.db)
    init_db(db)
    bar = None if args.quiet else TerminalProgress()
    study_id, ids = run_study(cfg, RunContext(db, args.checkpoints, bar, nproc=args.nproc, fan_out=fan_out), data=data)
    if bar:
        bar.close()
    summary = study_summary(db, study_id, ids)
    for i, metric in enumerate(cfg.eval.metrics):  # each metric the study computed, with its own convention line
        if i:
            print()
        print_study(summary, fmt=args.export, table_only=args.command == "compare", metric=metric)
    if args.json:
        write_json_atomic(args.json, summary)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from engine.core import threads
    from engine.jobs.worker import serve
    from storage import get_engine

    count = threads.requested(args.threads)
    share = args.share_cores and count is None
    if count is None and not share:  # on its own: the libraries' defaults (every core) stay as they are
        import torch

        print(f"worker {os.getpid()}: torch's default {torch.get_num_threads()} compute thread(s) (--threads N or "
              f"${threads.THREADS_ENV} to choose)", flush=True)
    else:
        count = count or threads.available_cores()  # sharing: every core until a job beside it starts
        used = threads.apply(count)
        print(f"worker {os.getpid()}: {count} compute thread(s) "
              f"({', '.join(f'{lib} {n}' for lib, n in used.items())})"
              f"{'; each job: cores // the jobs running on this machine' if share else ''}", flush=True)
    try:
        if args.tasks:
            from engine.tasks.loop import serve_tasks

            serve_tasks(get_engine(args.db), once=args.once)
            return 0
        serve(get_engine(args.db), once=args.once, checkpoint_dir=args.checkpoints, kinds=args.kinds,
              share_cores=share)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_extract_tasks(args: argparse.Namespace) -> int:
    from engine.checkpoints.extract_tasks import fan_out_extract
    from storage import get_engine, init_db

    db = get_engine(args.db)
    init_db(db)
    model = {"path": args.checkpoint, "arch": args.arch, "num_classes": args.num_classes,
             "preprocessing": {"input_size": args.input_size}}
    print(fan_out_extract(db, model_version_id=args.model_version, model=model, images=args.images, split=args.split,
                          rows_per_task=args.rows_per_task, batch_size=args.batch_size, needs_gpu=args.needs_gpu))
    return 0


def cmd_adapt(args: argparse.Namespace) -> int:
    from engine.jobs.adapt import AdapterJob, run_adapters
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


def cmd_presets(args: argparse.Namespace) -> int:
    from engine.core.presets import RUN_PRESETS, preset_config, preset_deviations
    from engine.data.fashion_files import fashion_available
    from engine.core.vocab import DSIMPLEX_METHODS

    for name in RUN_PRESETS:
        cfg = preset_config(name, fashion_present=fashion_available)
        simplex = f"  d-Simplex: {cfg.model.dsimplex_normalization}" if set(cfg.methods) & set(DSIMPLEX_METHODS) else ""
        print(f"{name:16s} {cfg.dataset.name:10s} {cfg.scenario.num_steps or '?'} steps  methods: {', '.join(cfg.methods)}"
              f"  keeps: {cfg.training.select} epoch{simplex}")
        for line in preset_deviations(name):
            print(f"    differs: {line}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
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
    result = evaluate_folder(folder, metrics=metrics, protocol=args.protocol, same_set=args.same_set)
    for name, C in result.values.items():
        print(render_matrix(C, title=f"{name} ({args.protocol}{', same set' if args.same_set else ''})",
                            comparable=result.comparable, ties=args.ties))
        if args.export:
            print(render_matrix(C, fmt=args.export, title=name, comparable=result.comparable, ties=args.ties,
                                metric=name, view="external", protocol=args.protocol))
    payload = {"features": str(args.features), "protocol": args.protocol, "same_set": args.same_set,
               "metrics": result_json(result, ecc_ties=args.ties)}
    if not args.no_store:
        from engine.checkpoints.evaluate_folder import store_feature_evaluation
        from storage import get_engine

        config = {"source": "features", "folder": str(args.features.resolve()), "metrics": list(metrics),
                  "protocol": args.protocol, "same_set": args.same_set, "ties": args.ties}
        payload["experiment_id"] = store_feature_evaluation(get_engine(args.db), name=args.name or args.features.name,
                                                            config=config, sets=folder.sets, result=result,
                                                            protocol=args.protocol, ties=args.ties)
        print(f"stored as experiment {payload['experiment_id']}")
    if args.json:
        write_json_atomic(args.json, payload)
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from engine.reproduce.cli import reproduce
    from engine.run.pipeline import RunContext, run_study
    from storage import get_engine, init_db

    db = get_engine(args.db)
    init_db(db)
    return reproduce(args, db, lambda cfg, db, ckpt: run_study(cfg, RunContext(db, ckpt, None)))


COMMANDS = {"run": cmd_run, "compare": cmd_run, "evaluate": cmd_evaluate, "worker": cmd_worker, "presets": cmd_presets,
            "adapt": cmd_adapt, "extract-tasks": cmd_extract_tasks,
            "compare-checkpoints": cmd_compare_checkpoints, "export-images": cmd_export_images,
            "check-upgrade": cmd_check_upgrade, "reproduce": cmd_reproduce}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    roots.export(args)
    export_ceiling(args)
    try:
        if getattr(args, "json", None) is not None:
            json_target(args.json)  # a --json that could not be written is refused before any work
        if args.command in ("evaluate", "compare-checkpoints") and args.name is not None:
            from storage import name_problem  # the name every page shows: refused now, not after the work

            if problem := name_problem(args.name, what="--name"):
                raise ValueError(problem)
        return COMMANDS[args.command](args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m engine presets | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush does not fail again
        return 0
