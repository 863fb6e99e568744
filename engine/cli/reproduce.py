"""``python -m engine reproduce NAME``: queue (or run here) a claim's missing seeds, then print its table.

Without ``--here`` the missing seeds go to the job queue as run jobs (``python -m engine worker`` runs them; rerun
this command to read what is finished); with ``--here`` they run in this process, seed by seed, each stored as it
ends, so an interrupted reproduction resumes where it stopped. The runner is passed in by the entry point (a stage
does not import the run stage).
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from engine.cli.options import add_db
from engine.core.config import RunConfig
from engine.reproduce.claims import CLAIMS, GROUPS, SCALES, claim_names
from engine.reproduce.table import DEFAULT_INTERVAL, INTERVALS, claim_rows, markdown_header, render, why_lines

RunHere = Callable[[RunConfig, Engine, Path], object]  # one one-seed study config -> stored


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``reproduce`` subcommand's arguments (``--db`` is added by the entry point)."""
    p.add_argument("name", metavar="NAME", help=f"a named table cell ({', '.join(CLAIMS)}) or {', '.join(GROUPS)} (all)")
    p.add_argument("--scale", choices=SCALES, default="reduced",
                   help="smoke: seconds, for tests; reduced: 10 seeds, 400 test images per class; paper: all images")
    p.add_argument("--seeds", type=int, metavar="N", help="seeds 0 .. N-1 (default: the scale's)")
    p.add_argument("--here", action="store_true", help="run the missing seeds in this process instead of queueing them")
    p.add_argument("--table", action="store_true",
                   help="print the README's Markdown table (header: command, versions, threads, device, interval)")
    p.add_argument("--sensitivity", action="store_true",
                   help="also AC under seen/all x instance/template x metric, re-evaluated from the stored features "
                        "(with --table: a second Markdown table)")
    p.add_argument("--interval", choices=tuple(INTERVALS), default=DEFAULT_INTERVAL,
                   help="hierarchical: bootstrap over seeds, then each seed's test queries (pairs: their images), "
                        "recomputed from the stored features (default); seeds: Student-t over the seeds' values")
    p.add_argument("--device", default="auto", help="with --here: auto, cpu or cuda")
    p.add_argument("--checkpoints", type=Path, default=Path("data") / "checkpoints", help="checkpoint folder (--here)")


def environment(device: str = "auto") -> str:
    """Where the numbers come from: torch's device and thread count in this process."""
    import torch

    from engine.models.device import pick_device

    return f"device {pick_device(device)}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


def run_environment(db: Engine, runs: dict[tuple[int, str], int]) -> str:
    """The arithmetic the stored runs recorded with their matrices (threads, CPU kernels, versions), each distinct
    record once; "" when none is recorded."""
    from storage import load_matrices, session_scope

    seen: dict[str, None] = {}
    with session_scope(db) as s:
        for exp_id in runs.values():
            for m in load_matrices(s, exp_id):
                a = (m.summary or {}).get("arithmetic")
                if a:
                    seen[", ".join(f"{k} {v}" for k, v in a.items())] = None
    return "; ".join(seen)


def reproduce(args: argparse.Namespace, db: Engine, run_here: RunHere) -> int:
    """Queue or run every claim's missing seeds, then print its table; return the exit code (0, or 3 while unfinished)."""
    # here, not at the top: importing the CLI package must not load torch or numba (a worker sizes them first)
    from engine.reproduce.plan import enqueue_missing, missing_seeds, seed_config, stored_runs, study_config
    from engine.reproduce.sensitivity import render_sensitivity, sensitivity_header, sensitivity_rows

    names = claim_names(args.name)
    configs = {n: study_config(CLAIMS[n], args.scale, args.seeds, device=args.device) for n in names}
    pending = 0
    start = time.perf_counter()
    for name, cfg in configs.items():
        if args.here:
            for seed in missing_seeds(db, cfg):
                print(f"{name}: running seed {seed} here", flush=True)
                run_here(seed_config(cfg, seed), db, args.checkpoints)
        else:
            new, queued = enqueue_missing(db, cfg)
            pending += len(new) + len(queued)
            if new or queued:
                print(f"{name}: queued run jobs {', '.join(map(str, new + queued))} "
                      f"({len(new)} new); start `python -m engine worker` and rerun this command", flush=True)
    if args.here:
        print(f"ran in {time.perf_counter() - start:.1f} s", flush=True)
    interval = getattr(args, "interval", DEFAULT_INTERVAL)
    runs = {name: stored_runs(db, cfg) for name, cfg in configs.items()}
    here = environment(args.device)
    recorded = run_environment(db, {k: v for r in runs.values() for k, v in r.items()})
    made = f"reader {here}" + (f"; runs recorded {recorded}" if recorded else "; the runs recorded no arithmetic")
    if args.table:
        print(markdown_header(interval, environment=made, command=command_line(args)))
    else:
        print(f"# reproduce {args.name} --scale {args.scale}: {made}")
    sensitivity, why = [], []
    for i, (name, cfg) in enumerate(configs.items()):
        rows = claim_rows(db, CLAIMS[name], runs[name], interval=interval)
        if i and not args.table:
            print()
        print(render(CLAIMS[name], rows, markdown=args.table))
        why += [f"- {name}: {line}" for line in why_lines(rows)] if args.table else []
        if args.sensitivity:
            sens = render_sensitivity(CLAIMS[name], sensitivity_rows(db, CLAIMS[name], runs[name], CLAIMS[name].methods,
                                                                     interval=interval), markdown=args.table)
            if args.table:  # a second table under the claims' table: its columns differ
                sensitivity.append(sens)
            else:
                print(sens)
    if why:  # under the table: a Markdown list (the text table prints its own under each claim)
        print()
        print("\n".join(why))
    if sensitivity:
        print()
        print(sensitivity_header(interval))
        print("\n".join(sensitivity))
    return 3 if pending else 0


def command_line(args: argparse.Namespace) -> str:
    """The command that prints this table again (``--db`` left out: it names the reader's database)."""
    parts = ["python -m engine reproduce", args.name, "--scale", args.scale]
    if args.seeds is not None:
        parts += ["--seeds", str(args.seeds)]
    if getattr(args, "interval", DEFAULT_INTERVAL) != DEFAULT_INTERVAL:
        parts += ["--interval", args.interval]
    parts.append("--table")
    if args.sensitivity:
        parts.append("--sensitivity")
    return " ".join(parts)


def add_command_arguments(p: argparse.ArgumentParser) -> None:
    """The ``reproduce`` command's options and ``--db``."""
    add_arguments(p)
    add_db(p)


def cmd_reproduce(args: argparse.Namespace) -> int:
    """``reproduce``: the named cells' table from stored runs; missing runs queued (or trained here with ``--here``)."""
    from engine.run.pipeline import RunContext, run_study
    from storage import get_engine, init_db

    db = get_engine(args.db)
    init_db(db)
    return reproduce(args, db, lambda cfg, db, ckpt: run_study(cfg, RunContext(db, ckpt, None)))
