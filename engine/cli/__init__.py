"""Command line: ``python -m engine <command>``.

Commands: ``run`` (train/evaluate a config or preset; several methods = a study), ``compare``
(the same, printing the paper-style methods table), ``evaluate`` (matrices for a folder of
features), ``compare-checkpoints`` (your own models on an image folder), ``adapt`` (paper 004's
adapters between two stored models), ``adapter fit|curve|apply`` (post-hoc maps fitted on paired embeddings from any
source, exported as safetensors + JSON + ONNX), ``export-images`` (a dataset split as PNG class folders),
``worker`` (the background job runner), ``extract`` (one checkpoint's embedding of an image set into the feature
store, fanned out over a Dask cluster with ``--cluster``), ``presets``, ``check-upgrade`` (the upgrade verdict of two
models' features; exit 0/1/3), ``doctor`` (does one store hold more than one model's vectors; exit 0/1), ``mteb`` (MTEB's evaluator scores the
cross-tests of text models on a local retrieval task). Every
refused input prints one line ``error: ...`` on stderr and exits with code 2.

One module per command group (``run``, ``evaluate``, ``worker``, ``adapt``, ``adapter``, ``checkpoints``, ``export_images``,
``upgrade``, ``doctor``, ``mteb``), each with its options and its command; the options several commands share are in ``options``.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import NamedTuple

from engine.checkpoints.files import export_ceiling
from engine.cli import (adapt, adapter, checkpoints, doctor, evaluate, export_images, mteb, reproduce, run, upgrade,
                        worker)
from engine.data import roots
from engine.results.json_file import json_target


class Command(NamedTuple):
    """One subcommand: its line in ``--help``, what adds its options (None: it has none) and what runs it."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None] | None
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {  # in the order ``--help`` lists them
    "evaluate": Command("compatibility matrices for a folder of step_*.npz features", evaluate.add_arguments,
                        evaluate.cmd_evaluate),
    "run": Command("train and evaluate a config (several methods = a study)", run.add_run_arguments, run.cmd_run),
    "compare": Command("run several methods on one scenario and print the methods x AC/AA/ACA table",
                       run.add_compare_arguments, run.cmd_run),
    "worker": Command("run queued jobs from the database (used by the dashboard)", worker.add_worker_arguments,
                      worker.cmd_worker),
    "adapt": Command("fit paper 004's adapters between two stored models; print the query/gallery table",
                     adapt.add_arguments, adapt.cmd_adapt),
    "adapter": Command("post-hoc maps new -> old space fitted on paired embeddings: fit, curve, apply (exported)",
                       adapter.add_arguments, adapter.cmd_adapter),
    "extract": Command("embed an image set by one checkpoint into the feature store (on Dask with --cluster)",
                       worker.add_extract_arguments, worker.cmd_extract),
    "compare-checkpoints": Command("compare your own checkpoints (TorchScript, state_dict, safetensors)",
                                   checkpoints.add_arguments, checkpoints.cmd_compare_checkpoints),
    "export-images": Command("write a dataset split as PNG class folders (for imagefolder)", export_images.add_arguments,
                             export_images.cmd_export_images),
    "presets": Command("list the named presets", None, run.cmd_presets),
    "check-upgrade": Command("can the new model ship without re-indexing? (ECC verdict, exit 0/1/3)",
                             upgrade.add_arguments, upgrade.cmd_check_upgrade),
    "reproduce": Command("reproduce named paper table cells (P2-Tab2, ...) over seeds; queued or --here",
                         reproduce.add_command_arguments, reproduce.cmd_reproduce),
    "doctor": Command("does one store hold vectors of more than one model? (exit 0 clean / 1 mixed)",
                      doctor.add_arguments, doctor.cmd_doctor),
    "mteb": Command("MTEB's retrieval evaluator scores every cross-test of text models on a local task folder",
                    mteb.add_arguments, mteb.cmd_mteb),
}


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m engine`` parser with every command of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(prog="python -m engine", description="Compatibility Lab engine")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help)
        if command.add_arguments is not None:
            command.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's), run the command and return its exit code (2: a refused input)."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command line as given (check-upgrade --report)
    roots.export(args)
    export_ceiling(args)
    try:
        if getattr(args, "json", None) is not None:
            json_target(args.json)  # a --json that could not be written is refused before any work
        if args.command in ("evaluate", "compare-checkpoints") and args.name is not None:
            from storage import name_problem  # the name every page shows: refused now, not after the work

            if problem := name_problem(args.name, what="--name"):
                raise ValueError(problem)
        return COMMANDS[args.command].run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m engine presets | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush does not fail again
        return 0
