"""``python -m engine run`` and ``compare`` (train and evaluate a config or preset; several methods = a study) and
``presets`` (the named presets)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from engine.cli.options import add_db
from engine.core.fan_out import FanOut, check_fan_out_gallery
from engine.results.json_file import write_json_atomic
from engine.results.report import FORMATS


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``run`` (tables printed as text by default)."""
    _add_study_arguments(p, export="text")


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``compare``: those of ``run``, the methods table printed as Markdown by default."""
    _add_study_arguments(p, export="markdown")


def _add_study_arguments(r: argparse.ArgumentParser, *, export: str) -> None:
    """The options ``run`` and ``compare`` share; ``export``: the default format of the printed tables."""
    r.add_argument("config", nargs="?", type=Path, help="TOML config file")
    r.add_argument("--preset", help="a named preset instead of a file (see 'presets')")
    r.add_argument("--methods", nargs="+", help="override the config's methods")
    r.add_argument("--device", help="override the device (auto, cpu, cuda)")
    r.add_argument("--epochs", type=int, help="override training.epochs")
    r.add_argument("--json", type=Path, metavar="OUT", help="write the study summary as JSON")
    r.add_argument("--export", choices=FORMATS, default=export, help="format of the printed tables")
    r.add_argument("--checkpoints", type=Path, help="checkpoint folder (default: the database's own, "
                                                     "storage/checkpoint_folders.py: data/checkpoints/compatlab.db)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="train each step data-parallel in N processes (one per GPU on CUDA, gloo on CPU)")
    r.add_argument("--cluster", metavar="SPEC",
                   help="where each matrix's search runs: in-process (the default), local:N (a Dask LocalCluster of N "
                        "worker processes) or tcp://HOST:PORT (a running Dask scheduler whose workers reach the "
                        "database and the feature store); default $COMPATLAB_DASK_SCHEDULER, else in-process; the "
                        "same matrices")
    r.add_argument("--query-block-rows", type=int, default=FanOut.block_rows, metavar="N",
                   help=f"on a cluster: query rows per Dask task (default {FanOut.block_rows})")
    r.add_argument("--gallery-partition-rows", type=int, default=FanOut.shard_rows, metavar="N",
                   help=f"on a cluster: gallery rows per Dask task (default {FanOut.shard_rows})")
    add_db(r)


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
    """``run`` and ``compare``: train and evaluate the study, print its tables (``compare``: the methods table only)."""
    from engine.run.ddp import check_nproc
    from engine.models.device import pick_device
    from engine.run.pipeline import RunContext, check_study, run_study
    from engine.core.progress import TerminalProgress
    from engine.results.study_summary import print_study, study_summary
    from storage import default_db_url, get_engine, init_db
    from storage.checkpoint_folders import checkpoint_root
    from engine.core.cluster import requested_cluster
    from engine.evaluate.dask_search import dask_client

    cfg = _run_config(args)
    check_nproc(args.nproc, pick_device(cfg.device))
    cluster = requested_cluster(args.cluster)
    fan_out = FanOut(args.query_block_rows, args.gallery_partition_rows)
    if not cluster.in_process:
        check_fan_out_gallery(cfg.eval.gallery)
    _check_checkpoint_folder(checkpoint_root(args.db or default_db_url(), args.checkpoints))
    data = check_study(cfg)  # everything refusable is refused before the database is touched
    db = get_engine(args.db)
    init_db(db)
    bar = None if args.quiet else TerminalProgress()
    with dask_client(cluster) as client:
        study_id, ids = run_study(cfg, RunContext(db, args.checkpoints, bar, nproc=args.nproc, client=client,
                                                  fan_out=fan_out), data=data)
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


def cmd_presets(args: argparse.Namespace) -> int:
    """``presets``: one line per named preset (dataset, steps, methods, kept epoch, d-Simplex), then how it differs from
    its paper's released code; then the comparison presets (``engine.checkpoints.presets``)."""
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
    from engine.checkpoints.presets import COMPARISON_PRESETS

    for name, spec in COMPARISON_PRESETS.items():  # named comparisons of given models (compare-checkpoints --preset)
        print(f"{name:16s} comparison: {' -> '.join(m['path'] for m in spec['models'])} on {spec['dataset']}, "
              f"views {', '.join(spec['views'])}  (compare-checkpoints --preset {name})")
    return 0
