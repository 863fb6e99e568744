"""``python -m engine check-upgrade``: the upgrade verdict from the command line, for a CI gate.

Exit codes: 0 compatible, 1 not compatible, 3 too close to call, 2 bad input (one line ``error: ...`` on
stderr from :func:`engine.cli.main`; nothing written). ``--json OUT`` is written to a temporary file in the
same folder and renamed, so OUT is either the whole report or untouched.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from engine.contract import DEFAULT_ORDERINGS
from engine.metrics.paired import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, DEFAULT_SEED

EXIT_CODES = {"compatible": 0, "not compatible": 1, "too close to call": 3}
DESCRIPTION = """\
Is the new model compatible with the old one (paper 002's ECC: new queries against the old gallery score
above the old model's self-test), with a paired percentile bootstrap over queries; is it better on its own;
and, if not compatible, how much of the gallery to re-embed (best backfilling order by area under its curve).
Only the --features form is available for now (step_1.npz = old, step_2.npz = new, the folder format of
'evaluate'); --experiment ID --old-step A --new-step B and --model OLD --model NEW come later.
Exit code: 0 compatible, 1 not compatible, 3 too close to call, 2 bad input."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``check-upgrade``."""
    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--features", required=True, type=Path, metavar="DIR",
                   help="folder with exactly step_1.npz (old) and step_2.npz (new), each with query_features, "
                        "query_labels, gallery_features, gallery_labels of the same images")
    p.add_argument("--name", action="append", dest="names", metavar="NAME",
                   help="the models' names, old then new (give it twice; default: old, new)")
    p.add_argument("--metric", default="recall@1", help="recall@K, map or map@K (default recall@1)")
    p.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help=f"bootstrap resamples (default {DEFAULT_RESAMPLES})")
    p.add_argument("--level", type=float, default=DEFAULT_CONFIDENCE,
                   help=f"confidence level of the interval (default {DEFAULT_CONFIDENCE})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the bootstrap and of the random backfilling order")
    p.add_argument("--same-set", action="store_true", help="queries are the gallery images: exclude each query's own image")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the report as JSON (atomically)")


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    text = json.dumps(data, indent=2, allow_nan=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _check_json_target(path: Path) -> None:
    if path.is_dir():
        raise ValueError(f"--json {path}: is a folder; give a file name")
    if not path.parent.is_dir():
        raise ValueError(f"--json {path}: folder {path.parent} does not exist")


def cmd_check_upgrade(args: argparse.Namespace) -> int:
    """Print the verdict sentence and the numbers; the exit code is the verdict's."""
    from engine.checkpoints.evaluate_folder import load_feature_folder
    from engine.upgrade.verdict import check_upgrade

    names = args.names or ["old", "new"]
    if args.json is not None:
        _check_json_target(args.json)  # refused before any work, so nothing is half-done
    folder = load_feature_folder(args.features)
    if len(folder.sets) != 2:
        raise ValueError(f"{args.features}: check-upgrade compares two models, step_1.npz (old) and step_2.npz (new); "
                         f"found {len(folder.sets)} step file(s)")
    report = check_upgrade(folder.sets[0], folder.sets[1], names=names, metric=args.metric, resamples=args.resamples,
                           level=args.level, seed=args.seed, same_set=args.same_set, orderings=DEFAULT_ORDERINGS)
    c, b = report.compatibility, report.better
    reach = lambda x: "never" if x is None else f"{x:.3f}"  # noqa: E731
    lines = [report.sentence(),
             f"  {report.metric}: {report.old_name}/{report.old_name} {report.old_old:.4f}  "
             f"{report.new_name}/{report.old_name} {report.new_old:.4f}  {report.new_name}/{report.new_name} {report.new_new:.4f}  "
             f"({report.n_queries} queries, {report.n_no_positive} without a positive; {report.n_gallery} gallery items)",
             f"  compatibility diff {c.diff:+.4f} [{c.lo:+.4f}, {c.hi:+.4f}] -> {c.verdict}; "
             f"on its own diff {b.diff:+.4f} [{b.lo:+.4f}, {b.hi:+.4f}] -> {b.verdict} "
             f"(paired percentile bootstrap, {report.resamples} resamples, level {report.level:g}, seed {report.seed})"]
    lines += [f"  backfill {need.ordering:<16} area {need.area:.4f}  to reach {report.old_name}'s self-test "
              f"{reach(need.to_old_self)}, {report.new_name}'s {reach(need.to_new_self)}"
              + ("  (best)" if need.ordering == report.best_ordering else "") for need in report.backfill]
    if args.json is not None:  # written before anything is printed: a failed write prints only the error
        try:
            write_json_atomic(args.json, {"features": str(args.features), **report.to_json()})
        except OSError as exc:
            raise ValueError(f"--json {args.json}: cannot write ({exc.strerror or type(exc).__name__})") from None
    print("\n".join(lines))
    return EXIT_CODES[report.verdict]
