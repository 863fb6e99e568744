"""``python -m engine doctor SRC``: does one store hold vectors of more than one model? (issue 42 item 4).

SRC is a source text as ``check-upgrade`` and ``adapter`` take it (``file.npz``, ``parquet:DIR#vector=emb``,
``lance:DB#table=items``, ``sqlite:///e.db#table=items``, ...). Prints each test's verdict, statistic and groups
(``engine.analysis.doctor``); exit code 0 clean, 1 mixed, 2 a refused input; ``--json OUT`` also writes the report.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from engine.core.kinds import SOURCE_HELP
from engine.data import roots


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``doctor`` command's options."""
    from engine.analysis.doctor import DEFAULT_SAMPLE, MAX_SAMPLE

    p.description = __doc__.split("\n\n")[0]
    p.add_argument("source", metavar="SRC", help=f"the store to examine. {SOURCE_HELP}")
    p.add_argument("--sample", type=int, default=DEFAULT_SAMPLE, metavar="N",
                   help=f"items sampled for the norm and neighbour tests (default {DEFAULT_SAMPLE}, at most "
                        f"{MAX_SAMPLE}); the dimension and fingerprint tests read every item")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample and the mixture fits")
    p.add_argument("--block-rows", type=int, default=65536, help="rows read at a time (default 65536)")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the report as JSON (atomically)")
    roots.add_arguments(p)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Examine the store; 0 when clean, 1 when mixed."""
    from engine.analysis.doctor import diagnose, format_report
    from engine.results.json_file import write_json_atomic
    from engine.sources import open_source

    if args.block_rows < 1:
        raise ValueError(f"--block-rows must be at least 1, got {args.block_rows}")
    source = open_source(args.source, what="the store")
    try:
        report = diagnose(source, sample=args.sample, seed=args.seed, block_rows=args.block_rows)
    finally:
        source.close()
    if args.json is not None:
        write_json_atomic(args.json, report)
    print(format_report(report))
    return 1 if report["verdict"] == "mixed" else 0


__all__ = ["add_arguments", "cmd_doctor"]
