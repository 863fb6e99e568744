"""``python -m engine check-upgrade``: the upgrade verdict from the command line, for a CI gate.

Exit codes: 0 compatible, 1 not compatible, 3 too close to call, 2 bad input (one line ``error: ...`` on
stderr from :func:`engine.cli.main`; nothing written). ``--json OUT`` is written to a temporary file in the
same folder and renamed, so OUT is either the whole report or untouched. ``--plan OUT`` writes the migration plan
(:mod:`engine.upgrade.migration`) as OUT.json and OUT.md, both or neither, never over an existing file.
``--report OUT.html`` (or ``OUT.md``) writes the release report (:mod:`engine.upgrade.release_report`) of the check and
its plan, computed as ``--plan`` computes it, never over an existing file.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from engine.cli.options import add_model_arguments, models_spec_from_args, trec_folder
from engine.core.contract import DEFAULT_ORDERINGS, ORDERINGS
from engine.core.vocab import RELEVANCE, RELEVANCE_K as DEFAULT_K, decision_metric
from engine.data import roots
from engine.results.json_file import write_json_atomic
from engine.metrics.paired import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, DEFAULT_SEED
from engine.upgrade.plan import (DEFAULT_ADAPTERS, DEFAULT_FIT_SHARE, DEFAULT_PRECISION, THRESHOLD_K, Plan, backfill_metric,
                                 recovery_line, forecast_line)
from engine.metrics.decision import margin_to_decide
from engine.core.kinds import LIST_RANK_TIES, QRELS_HELP, SOURCES, STRICT, TIE_RULES, canonical_metric
from engine.upgrade.rule import DEFAULT_INTERVAL, DEFAULT_POWER, INTERVALS
from engine.upgrade.words import NOT_JUDGED, tie_line

SOURCE_OPTIONS = ("new_gallery", "old_queries", "new_queries", "qrels", "relevance", "backfill_depth", "cluster")

if TYPE_CHECKING:
    from engine.metrics.compatibility import CellFeatures
    from engine.upgrade.from_sources import SourcesCheck
    from engine.upgrade.migration import PlanInputs
    from engine.upgrade.verdict import UpgradeReport

    # a form's features in memory (old, new, the query groups or None), or the check from sources
    Features = tuple[CellFeatures, CellFeatures, np.ndarray | None] | SourcesCheck

EXIT_CODES = {"compatible": 0, "not compatible": 1, "too close to call": 3}
DESCRIPTION = f"""\
Is the new model compatible with the old one (paper 002's ECC: new queries against the old gallery score
above the old model's self-test), with a paired percentile bootstrap over queries and gallery items (--interval);
the rule is strict ECC unless --ties pass (equal scores pass) or --margin POINTS (non-inferiority: compatible
when the interval's lower end is above minus the margin); a too-close call prints the queries that would
decide it; is it better on its own;
and, if not compatible, how much of the gallery to re-embed (best backfilling order by area under its curve).
Three forms: --features DIR (step_1.npz = old, step_2.npz = new, the folder format of 'evaluate') or
--experiment ID --old-step A --new-step B [--view V] [--db URL] (two steps of any stored experiment: a training
run, a checkpoint comparison, an evaluated folder; models are named by their stored names, else "step N"), or
--model OLD --model NEW --dataset NAME[:ROOT] (or --query-dataset and --gallery-dataset) [--view V] [--db URL]: two
checkpoints embed the images once, with compare-checkpoints' model specs and image options (see
'python -m engine compare-checkpoints --help'); models are named by --name, else their file names; with --db the
comparison is stored as compare-checkpoints stores it and the report names the experiment (steps 1 and 2).
Embeddings from a table or store: --old-gallery SRC [--new-gallery SRC] --old-queries SRC --new-queries SRC [--qrels SRC]
[--relevance labels|qrels|none] [--k K], a SRC being a path or URL whose kind is recognised (.npz, .npy, .parquet,
.arrow, a LanceDB or Qdrant folder, a SQLAlchemy URL) or given as {', '.join(f'{k}:' for k in SOURCES)}, with
#key=value options (e.g. #id=doc_id&vector=emb&label=cls, #table=items, #collection=docs&vector=dense). Old and new
are joined by item id; the gallery is read in blocks (never whole, nothing written); the two-way interval (recall@K
with labels) walks the streamed top-D lists, other metrics resample the queries.
Related queries (paraphrases, one user's reformulations): --query-groups NAME|FILE resamples whole groups (a cluster
bootstrap) on every form. Teams that add queries and rerun until it decides: --sequential (an anytime-valid interval;
the printed "queries needed" is a one-look estimate at 80 % power).
Relevance: labels (a label column), qrels (--qrels: query id, item id, grade) or none (label-free: the new model's
top-K on --new-gallery is the reference; neighbour recall@K). Backfill curves need --new-gallery.
Every check prints one decision (engine.upgrade.plan): ship as is / ship with adapter X / backfill p % in order Y /
do not ship (yet), from the verdicts (success: new alone vs old alone; guardrail: new or adapted queries on the old
gallery vs old alone, under the rule), post-hoc adapters fitted on a seeded share of the gallery's old/new pairs
(--adapters, --fit-share, or an exported --adapter DIR), the backfill (and, with --rollout, rank-merge) curves read on
a metric that does not flatter backfilling, and the similarity threshold re-mapped to the same precision
(--threshold T); --plan OUT also writes it (OUT.json, OUT.md). With --old-gallery these need --new-gallery (the pairs
are read from both galleries block by block, at most 50,000 of them; without it the plan is decided from the verdicts).
--report OUT.html (or OUT.md) writes the release report:
the plan's decision first, the inputs (secrets masked), the rule, every number with its interval, the cost of each
option and the curves as pictures, in one self-contained file.
Exit code: 0 compatible, 1 not compatible, 3 too close to call, 2 bad input."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``check-upgrade``."""
    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--features", type=Path, metavar="DIR",
                        help="folder with exactly step_1.npz (old) and step_2.npz (new), each with query_features, "
                             "query_labels, gallery_features, gallery_labels of the same images")
    source.add_argument("--experiment", type=int, metavar="ID", help="a stored experiment (with --old-step, --new-step)")
    add_model_arguments(p, model_group=source)  # --model, --classes, --dataset, ...: compare-checkpoints' own options
    source.add_argument("--old-gallery", metavar="SRC", help="the gallery the old model embedded, read where it lives "
                        "(with --old-queries, --new-queries; see 'embeddings from a table or store' above)")
    p.add_argument("--new-gallery", metavar="SRC", help="with --old-gallery: the same items embedded by the new model "
                   "(new/new, and the reference of --relevance none)")
    p.add_argument("--old-queries", metavar="SRC", help="with --old-gallery: the queries embedded by the old model")
    p.add_argument("--new-queries", metavar="SRC", help="with --old-gallery: the same queries embedded by the new model")
    p.add_argument("--qrels", metavar="SRC", help=f"with --old-gallery (implies --relevance qrels). {QRELS_HELP}")
    p.add_argument("--relevance", choices=RELEVANCE, help="with --old-gallery: what is relevant: labels (same class "
                   "label; the default), qrels (--qrels) or none (label-free: the new model's top-k on --new-gallery)")
    p.add_argument("--k", type=int, default=DEFAULT_K, metavar="K",
                   help=f"with --old-gallery: depth of the top-k lists (default {DEFAULT_K})")
    p.add_argument("--backfill-depth", type=int, metavar="D",
                   help="with --old-gallery and --new-gallery: depth of the lists the backfill curves merge (default "
                        "max(10 k, 100); a query the lists cannot decide at a point is left out of it and counted)")
    p.add_argument("--cluster", metavar="SPEC", help="with --old-gallery: where the search over the old gallery runs: "
                   "in-process (the default), local:N (a Dask LocalCluster of N worker processes) or tcp://HOST:PORT (a "
                   "running Dask scheduler); default $COMPATLAB_DASK_SCHEDULER, else in-process; the same numbers")
    p.add_argument("--old-step", type=int, metavar="A", help="with --experiment: the old model's step")
    p.add_argument("--new-step", type=int, metavar="B", help="with --experiment: the new model's step")
    p.add_argument("--view", default="encoder",
                   help="with --experiment or --model: feature view, e.g. encoder, psp, lsp (default encoder)")
    p.add_argument("--db", metavar="URL", help="with --experiment: database URL (default: $COMPATLAB_DB_URL or "
                                                "sqlite:///data/compatlab.db); with --model: store the comparison there "
                                                "(nothing is stored without --db)")
    p.add_argument("--name", action="append", dest="names", metavar="NAME",
                   help="the models' names, old then new (give it twice; default: old, new, or the stored names)")
    p.add_argument("--metric", type=canonical_metric,
                   help="the metric the verdict and the plan decide on: map, map@K or recall@K (default map: "
                        "Recall@K flatters backfilling); with --old-gallery recall@K, precision@K, map@K (AP over R, "
                        "trec_eval's map_cut_K), map_capped@K (over min(R, K)), mrr@K, ndcg@K or, label-free, "
                        "neighbour_recall@K (defaults: map@K, ndcg@K, neighbour_recall@K by --relevance); trec_eval, "
                        "ranx and ir-measures spellings are read too (ndcg_cut_10, nDCG@10, P_10, recall_100, "
                        "recip_rank)")
    p.add_argument("--rank-ties", choices=LIST_RANK_TIES, default="pessimistic",
                   help="with --old-gallery: how equal scores in a list rank: a non-relevant item first (pessimistic, "
                        "the default) or trec_eval's order, by doc id descending (trec: the numbers of trec_eval on "
                        "the --export trec files); the ECC rule on a tie is --ties")
    p.add_argument("--export", nargs=2, metavar=("trec", "DIR"),
                   help="with --old-gallery: write DIR/old_old.run, new_old.run, new_new.run and, for each adapter of "
                        "the plan, adapted_<name>_old.run (TREC run files, each cell's top-k lists) and DIR/qrels.txt "
                        "(the judgements the check used), so trec_eval, pytrec_eval or ranx recompute every number "
                        "printed")
    p.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help=f"bootstrap resamples (default {DEFAULT_RESAMPLES})")
    p.add_argument("--level", type=float, default=DEFAULT_CONFIDENCE,
                   help=f"confidence level of the interval (default {DEFAULT_CONFIDENCE})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the bootstrap and of the random backfilling order")
    p.add_argument("--margin", type=float, default=0.0, metavar="POINTS",
                   help="non-inferiority margin in points: compatible when the interval's lower end is above -POINTS "
                        "(default 0: the papers' strict ECC)")
    p.add_argument("--ties", choices=TIE_RULES, default=STRICT,
                   help="a cross-test equal to the self-test: fail (strict >, the papers' rule, default) or pass (>=)")
    p.add_argument("--interval", choices=tuple(i for i in INTERVALS if i != "sequential"),
                   help="what the bootstrap resamples: two-way = queries and gallery items (default; recall@k, with "
                        "--old-gallery recall@k with labels; other metrics fall back to queries), queries = queries only "
                        "(the gallery taken as fixed)")
    p.add_argument("--query-groups", metavar="NAME|FILE",
                   help="related queries (paraphrases of one topic, one user's reformulations) are resampled as whole "
                        "groups (a cluster bootstrap): with --old-gallery NAME is a column of the query sources; with "
                        "--features the name query_groups reads that array of step_1.npz; or FILE.npy / FILE.txt (one "
                        "group per query, in the queries' order; any form)")
    p.add_argument("--sequential", action="store_true",
                   help="an anytime-valid interval (a confidence sequence over the queries in their order) for teams "
                        "that add queries and rerun until it decides: valid at every look, wider than the one-look "
                        "interval; takes the gallery as fixed; not with --query-groups or --interval")
    p.add_argument("--same-set", action="store_true", help="queries are the gallery images: exclude each query's own image")
    p.add_argument("--orderings", nargs="+", default=list(DEFAULT_ORDERINGS), metavar="ORDER",
                   help=f"backfilling orders when not compatible (default {' '.join(DEFAULT_ORDERINGS)}; known: {', '.join(ORDERINGS)})")
    p.add_argument("--rollout", action="store_true",
                   help="when not compatible, also the rank merge of the old index (old queries) and the new one per "
                        "ordering, and the old index's top K re-ranked by the new model (candidate re-scoring, over K / N); "
                        "with --old-gallery (and --new-gallery, --plan) the plan's rank-merge rows, from top-D lists")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the report as JSON (atomically)")
    p.add_argument("--text-summary", action="store_true",
                   help="with --experiment (a stored text comparison): every pair of its models, the matrices, paired "
                        "verdicts per metric (qrels, supersense, label-free neighbour recall@K) and the adapters; "
                        "--json writes the dashboard's payload; exit 0")
    plan_arguments(p)
    report_arguments(p)
    roots.add_arguments(p)


def plan_arguments(p: argparse.ArgumentParser) -> None:
    """``--plan OUT`` and what the plan is decided from (:mod:`engine.upgrade.migration`)."""
    p.add_argument("--plan", type=Path, metavar="OUT", help="also write the migration plan as OUT.json and OUT.md (both or "
                   "neither; OUT.* must not exist and must lie inside the data roots): ship as is, ship with an adapter, "
                   "backfill p %% in an order, or do not ship, with the numbers behind it")
    p.add_argument("--adapters", nargs="*", metavar="KIND", help="with --plan: post-hoc adapters to fit on a seeded share "
                   f"of the gallery's old/new pairs (default {' '.join(DEFAULT_ADAPTERS)}; the kinds of 'adapter fit'; "
                   "none: give the option alone)")
    p.add_argument("--adapter", action="append", dest="adapter_files", metavar="DIR",
                   help="with --plan: also judge an exported adapter folder ('adapter fit --out DIR'; repeatable)")
    p.add_argument("--fit-share", type=float, default=DEFAULT_FIT_SHARE, metavar="F",
                   help=f"with --plan: share of the gallery the adapters are fitted on (default {DEFAULT_FIT_SHARE:g})")
    p.add_argument("--expected-queries", type=int, metavar="Q", help="the queries the new model will serve before the "
                   "next upgrade: the plan weighs per-query costs (a cascade's re-scorings, an adapter's maps) over "
                   "them against one-time ones (default: as many as the gallery holds items)")
    p.add_argument("--threshold", type=float, metavar="T", help="with --plan: the old model's similarity threshold to "
                   f"re-map (default: the old score at which precision is {DEFAULT_PRECISION:g} on the top-"
                   f"{THRESHOLD_K} candidates)")


def report_arguments(p: argparse.ArgumentParser) -> None:
    """``--report OUT``: the release report (:mod:`engine.upgrade.release_report`)."""
    p.add_argument("--report", type=Path, metavar="OUT", help="also write the release report as one self-contained file, "
                   "HTML (OUT.html) or Markdown (OUT.md): the migration plan's decision (computed as --plan computes it, "
                   "with its options), the inputs with secrets masked, the rule, each number with its interval, the "
                   "cost of each option and the curves; OUT must not exist and must lie inside the data roots")


def report_target(args: argparse.Namespace, taken: Sequence[Path]) -> Path | None:
    """The file of ``--report OUT`` (None without it), refused in one line before any work: a folder, a suffix other
    than .html/.md, an existing file, a path outside the data roots, one of the other outputs."""
    from engine.upgrade.release_report import SUFFIXES

    path = args.report
    if path is None:
        return None
    if path.suffix.lower() not in SUFFIXES:
        raise ValueError(f"--report {path}: give a file name ending in {', '.join(SUFFIXES)} (HTML or Markdown)")
    real = roots.confine(path, what="--report")
    if real.is_dir():
        raise ValueError(f"--report {path} is a folder; give a file name ending in .html or .md")
    if os.path.lexists(real):
        raise ValueError(f"--report {path} exists; give a new name (a report is never overwritten)")
    if not real.parent.is_dir():
        raise ValueError(f"--report {path}: folder {path.parent} does not exist")
    if real in taken:
        raise ValueError(f"--report {path} is also another output (--json or --plan); give them different names")
    return real


def report_text(args: argparse.Namespace, target: Path, plan_json: dict, source: dict) -> str:
    """The release report of this check, rendered before anything is written (a failure writes nothing)."""
    from engine.upgrade.release_report import render, report_context

    skip = ("notes", "means", "backfill_decided", "embedding", "convention")
    inputs = {key: value for key, value in source.items() if key not in skip}
    inputs.update({"database": args.db, "adapter folders": args.adapter_files})
    context = report_context(inputs=inputs, command=getattr(args, "argv", sys.argv[1:]), embedding=source.get("embedding"),
                             notes=source.get("notes", ()))
    return render({**plan_json, "context": context}, target.suffix)


def write_report(target: Path, text: str) -> None:
    """The report written to a temporary file in its folder, then renamed: whole or absent, never over a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, 0o644)  # a report is for sharing (mkstemp makes it private)
        if os.path.lexists(target):
            raise FileExistsError(f"{target.name} appeared meanwhile")
        os.replace(tmp, target)
    except OSError as exc:
        raise ValueError(f"--report: cannot write {target.name} ({exc.strerror or exc})") from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def plan_target(path: Path) -> tuple[Path, Path]:
    """OUT.json and OUT.md of ``--plan OUT``, refused in one line when either exists or OUT is outside the data roots."""
    if not path.name or path.name in (".", ".."):
        raise ValueError(f"--plan {path}: give a file name (OUT.json and OUT.md are written)")
    real = roots.confine(path, what="--plan")
    files = (real.with_name(real.name + ".json"), real.with_name(real.name + ".md"))
    for f in files:  # OUT = a data root would write OUT.json beside it, outside every root
        roots.confine(f, what="--plan's file")
    if not real.parent.is_dir():
        raise ValueError(f"--plan {path}: folder {path.parent} does not exist")
    for f in files:
        if os.path.lexists(f):
            raise ValueError(f"--plan {path}: {f.name} exists; give a new name (a plan is never overwritten)")
    return files


def write_plan(files: tuple[Path, Path], data: dict, markdown: str) -> None:
    """Both files or neither: each written to a temporary file in the folder, then both renamed."""
    texts = (json.dumps(data, indent=2, allow_nan=False), markdown)
    tmps: list[Path] = []
    try:
        for f, text in zip(files, texts):
            fd, tmp = tempfile.mkstemp(prefix=f".{f.name}.", suffix=".tmp", dir=f.parent)
            tmps.append(Path(tmp))
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
        for f in files:
            if os.path.lexists(f):
                raise FileExistsError(f"{f.name} appeared meanwhile")
        os.replace(tmps[0], files[0])
        try:
            os.replace(tmps[1], files[1])
        except BaseException:
            files[0].unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ValueError(f"--plan: cannot write {files[0].stem}.json/.md ({exc.strerror or exc})") from None
    finally:
        for t in tmps:
            t.unlink(missing_ok=True)


def _plan_options(args: argparse.Namespace) -> None:
    """Refuse bad values of what the decision is taken from, before any work (the plan is decided on every check;
    --plan only writes it)."""
    given = [o for o, v in (("--adapters", args.adapters), ("--adapter", args.adapter_files),
                            ("--threshold", args.threshold)) if v is not None]
    if args.fit_share != DEFAULT_FIT_SHARE:
        given.append("--fit-share")
    if args.old_gallery is not None and args.new_gallery is None and (given or args.rollout):
        from engine.upgrade.source_remedies import NEEDS_NEW_GALLERY

        raise ValueError(f"{', '.join(given + ['--rollout'] * args.rollout)}: {NEEDS_NEW_GALLERY}; without it the plan "
                         "is decided from the verdicts alone")
    from engine.upgrade.migration import check_plan_options

    check_plan_options(DEFAULT_ADAPTERS if args.adapters is None else args.adapters, args.fit_share)
    if args.expected_queries is not None:
        from engine.upgrade.plan import horizon

        horizon(args.expected_queries, 1)
    if args.threshold is not None and not math.isfinite(args.threshold):
        raise ValueError(f"--threshold must be a finite score, got {args.threshold!r}")
    from engine.adapters.artifact import load_adapter

    for folder in args.adapter_files or ():
        load_adapter(roots.confine(folder, what="--adapter"))  # a bad folder is refused before the check's work


def _check_json_target(path: Path) -> None:
    if path.is_dir():
        raise ValueError(f"--json {path}: is a folder; give a file name")
    if not path.parent.is_dir():
        raise ValueError(f"--json {path}: folder {path.parent} does not exist")


MODEL_OPTIONS = ("classes", "dataset", "query_dataset", "gallery_dataset", "input_size", "mean", "std")


def _refuse_model_options(args: argparse.Namespace, form: str) -> None:
    given = [f"--{o.replace('_', '-')}" for o in MODEL_OPTIONS if getattr(args, o) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} go(es) with --model; {form} reads features that are already embedded")


GROUP_FILES = (".npy", ".txt")  # --query-groups FILE: an array, or text with one group per line
NPZ_GROUPS = "query_groups"  # --features: the optional array of step_1.npz


def _is_groups_file(text: str) -> bool:
    return Path(text).suffix.lower() in GROUP_FILES


def read_groups_file(text: str) -> np.ndarray:
    """The query groups of ``--query-groups FILE`` (confined to the data roots): a 1-D ``.npy`` of numbers or text
    (never unpickled), or a ``.txt`` with one group per line; one line each for what is refused."""
    import io

    from engine.checkpoints.evaluate_folder import max_array_bytes
    from storage.safe_open import read_regular

    real = roots.confine(text, what="--query-groups")
    try:
        data = read_regular(real, roots=roots.data_roots(), what="--query-groups file", max_bytes=max_array_bytes())
    except OSError as exc:
        raise ValueError(f"--query-groups {text}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if real.suffix.lower() == ".npy":
        try:
            groups = np.load(io.BytesIO(data), allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"--query-groups {text}: not a plain .npy array ({str(exc).splitlines()[0]})") from None
        if groups.ndim != 1 or groups.dtype.kind not in "iuUS":
            raise ValueError(f"--query-groups {text}: give a 1-D array of integers or text, got shape {groups.shape} "
                             f"{groups.dtype}")
        return groups
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"--query-groups {text}: not UTF-8 text (one group per line)") from None
    empty = [i + 1 for i, line in enumerate(lines) if not line.strip()]
    if empty:
        raise ValueError(f"--query-groups {text}: line {empty[0]} is empty; give one group per query, one per line")
    return np.array([line.strip() for line in lines])


def _memory_groups(args: argparse.Namespace, form: str, arrays: Sequence[np.ndarray | None] = ()) -> np.ndarray | None:
    """The query groups of an in-memory form: a file, or with --features the steps' ``query_groups`` arrays."""
    text = args.query_groups
    if text is None:
        return None
    if _is_groups_file(text):
        return read_groups_file(text)
    if form != "--features" or text != NPZ_GROUPS:
        raise ValueError(f"--query-groups {text}: with {form} give a file ending in {' or '.join(GROUP_FILES)}"
                         + (f", or {NPZ_GROUPS} (the array of step_1.npz)" if form == "--features" else ""))
    given = [a for a in arrays if a is not None]
    if arrays[0] is None:
        raise ValueError(f"--query-groups {NPZ_GROUPS}: step_1.npz has no {NPZ_GROUPS} array")
    if any(not np.array_equal(a, given[0]) for a in given[1:]):
        raise ValueError(f"--query-groups {NPZ_GROUPS}: step_1.npz and step_2.npz give the queries different groups")
    return given[0]


def _check_folder(args: argparse.Namespace, settings: dict) -> tuple[UpgradeReport, dict, Features]:
    """The --features form: step_1.npz is the old model, step_2.npz the new one."""
    from engine.checkpoints.evaluate_folder import load_feature_folder
    from engine.upgrade.verdict import check_upgrade

    _refuse_model_options(args, "--features")
    if args.old_step is not None or args.new_step is not None:
        raise ValueError("--old-step and --new-step go with --experiment; --features compares step_1.npz and step_2.npz")
    folder = load_feature_folder(args.features)
    if len(folder.sets) != 2:
        raise ValueError(f"{args.features}: check-upgrade compares two models, step_1.npz (old) and step_2.npz (new); "
                         f"found {len(folder.sets)} step file(s)")
    groups = _memory_groups(args, "--features", folder.query_groups)
    report = check_upgrade(folder.sets[0], folder.sets[1], names=args.names or ["old", "new"], same_set=args.same_set,
                           query_groups=groups, **settings)
    return report, {"features": str(args.features)}, (folder.sets[0], folder.sets[1], groups)


def _check_experiment(args: argparse.Namespace, settings: dict) -> tuple[UpgradeReport, dict, Features]:
    """The --experiment form: two steps of a stored experiment, read through storage functions."""
    from engine.upgrade.stored import check_stored
    from storage import get_engine

    if args.old_step is None or args.new_step is None:
        raise ValueError("--experiment needs --old-step A and --new-step B (the stored steps to compare)")
    if args.same_set:
        raise ValueError("--same-set goes with --features; a stored experiment's config says whether queries are the gallery")
    _refuse_model_options(args, "--experiment")
    groups = _memory_groups(args, "--experiment")
    report, pair = check_stored(get_engine(args.db), args.experiment, args.old_step, args.new_step, view=args.view,
                                names=args.names, query_groups=groups, **settings)
    return report, {"experiment_id": args.experiment, "old_step": args.old_step, "new_step": args.new_step,
                    "view": args.view, "notes": list(pair.notes)}, (pair.old, pair.new, groups)


def _check_models(args: argparse.Namespace, settings: dict) -> tuple[UpgradeReport, dict, Features]:
    """The --model form: two checkpoints embed the images once (compare-checkpoints' pipeline); stored with --db."""
    from engine.upgrade.from_checkpoints import check_models, comparison_pair

    if len(args.models) != 2:
        raise ValueError(f"check-upgrade compares two models: --model OLD --model NEW; got {len(args.models)} --model")
    if args.old_step is not None or args.new_step is not None:
        raise ValueError("--old-step and --new-step go with --experiment; --model OLD --model NEW are steps 1 and 2")
    if args.same_set:
        raise ValueError("--same-set goes with --features; with --model, --dataset is closed-set (own image excluded) and "
                         "--query-dataset with --gallery-dataset open-set")
    spec = models_spec_from_args(args)
    db = None
    if args.db is not None:
        from storage import get_engine

        db = get_engine(args.db)
    groups = _memory_groups(args, "--model")
    report, cmp, experiment_id = check_models(spec, view=args.view, names=args.names, db=db, query_groups=groups, **settings)
    notes = list(cmp.notes)
    if experiment_id is not None:
        notes.append(f"stored as experiment {experiment_id} (steps 1 = {cmp.labels[0]}, 2 = {cmp.labels[1]}): the "
                     "dashboard's Upgrade check shows this report")
    return report, {"models": [m.path for m in cmp.spec.models], "dataset": cmp.spec.dataset,
                    "query_dataset": cmp.spec.query_dataset, "gallery_dataset": cmp.spec.gallery_dataset,
                    "view": args.view, "experiment_id": experiment_id, "notes": notes,
                    "embedding": cmp.embedding}, (*comparison_pair(cmp, args.view), groups)


def _refuse_source_options(args: argparse.Namespace, form: str) -> None:
    given = [f"--{o.replace('_', '-')}" for o in SOURCE_OPTIONS if getattr(args, o) is not None]
    if args.k != DEFAULT_K:
        given.append("--k")
    if args.rank_ties != "pessimistic":
        given.append("--rank-ties")
    if given:
        raise ValueError(f"{', '.join(given)} go(es) with --old-gallery; {form} does not read sources")


def _check_sources(args: argparse.Namespace, settings: dict) -> tuple[UpgradeReport, dict, Features]:
    """The --old-gallery form: embeddings read where they live (engine/sources), the gallery streamed in blocks."""
    from engine.core.cluster import requested_cluster
    from engine.sources.text import first_line
    from engine.upgrade.from_sources import SourceSpecs, check_sources

    _refuse_model_options(args, "--old-gallery")
    missing = [o for o in ("--old-queries", "--new-queries") if getattr(args, o[2:].replace("-", "_")) is None]
    if missing:
        raise ValueError(f"--old-gallery needs {' and '.join(missing)} (the same queries embedded by each model)")
    for given, why in ((args.old_step is not None or args.new_step is not None, "--old-step and --new-step go with "
                        "--experiment"), (args.same_set, "--same-set goes with --features"),
                       (args.db is not None, "--db goes with --experiment or --model; --old-gallery stores nothing"),
                       (args.query_groups is not None and _is_groups_file(args.query_groups),
                        f"--query-groups {args.query_groups}: with --old-gallery name a column of the query sources")):
        if given:
            raise ValueError(why)
    specs = SourceSpecs(args.old_gallery, args.old_queries, args.new_queries, args.new_gallery, args.qrels)
    try:
        check = check_sources(specs, relevance=args.relevance, k=args.k, metric=args.metric,
                              names=args.names or ["old", "new"], resamples=args.resamples, level=args.level,
                              seed=args.seed, margin=args.margin, ties=args.ties, backfill_depth=args.backfill_depth,
                              rollout=args.rollout, interval=settings["interval"], query_groups=args.query_groups,
                              cluster=requested_cluster(args.cluster), rank_ties=args.rank_ties)
    except ValueError as exc:  # one line, credentials masked, whatever raised it
        raise ValueError(first_line(exc)) from None
    data = check.to_json()
    return check.report, {key: data[key] for key in ("relevance", "k", "rank_ties", "convention", "sources", "means",
                                                      "backfill_depth", "backfill_decided")}, check


def _plan(args: argparse.Namespace, report: UpgradeReport, features: Features) -> PlanInputs:
    """The migration plan of this check, the one decision every check prints: in memory
    (:func:`engine.upgrade.migration.decide_in_memory`), from sources with the new gallery
    (:mod:`engine.upgrade.source_remedies`), else from the verdicts alone."""
    from engine.sources.text import first_line
    from engine.upgrade.from_sources import SourcesCheck, SourceSpecs
    from engine.upgrade.migration import decide_in_memory, or_verdicts, plan_from_verdicts

    files = [roots.confine(f, what="--adapter") for f in args.adapter_files or ()]
    if isinstance(features, SourcesCheck):
        if args.new_gallery is None:
            return plan_from_verdicts(report)
        from engine.upgrade.source_remedies import plan_from_sources

        specs = SourceSpecs(args.old_gallery, args.old_queries, args.new_queries, args.new_gallery, args.qrels)
        try:  # one line, credentials masked
            return or_verdicts(lambda: plan_from_sources(
                features, specs, kinds=DEFAULT_ADAPTERS if args.adapters is None else args.adapters, files=files,
                share=args.fit_share, t_old=args.threshold, queries=args.expected_queries), report,
                asked=args.adapters is not None or bool(files) or args.threshold is not None)
        except ValueError as exc:
            raise ValueError(first_line(exc)) from None
    return decide_in_memory(features[0], features[1], report, groups=features[2], kinds=args.adapters, files=files,
                            share=args.fit_share, t_old=args.threshold, queries=args.expected_queries)


def plan_lines(plan: Plan) -> list[str]:
    """The decision's recovery forecast (read before fitting), recovery rows and notes, one line each (the decision
    itself is the ``decision:`` line)."""
    return ([f"forecast: {forecast_line(plan.forecast, plan.old_name, plan.new_name)}"] if plan.forecast else []) + (
        [f"recovery: {recovery_line(r, plan.old_name, plan.new_name)}" for r in plan.recovery]
            + [f"note: {n}" for n in plan.notes])


def needed_line(needed: int | None, n: int, *, tie: bool = False, margin: float | None = None,
                sequential: bool = False) -> str:
    """The queries that would resolve a too-close call, with the assumption behind the number; when no number would,
    what accepts it: ``tie`` (every difference on the threshold: a margin or --ties pass), else the non-inferiority
    ``margin`` (points) under which the interval passes. ``sequential``: the number sizes a one-look check, and the
    confidence sequence, wider, needs more; it may be rerun as often as queries are added."""
    if needed is None:
        if tie or margin is None:
            return ("no number of queries would decide it: the mean paired difference sits exactly on the rule's "
                    "threshold (a tie); a margin (--margin) or --ties pass can accept it")
        return ("no number of queries would decide it: the mean paired difference sits exactly on the rule's threshold "
                "while the interval reaches below it (queries changed: --ties pass does not accept that); "
                f"a non-inferiority margin does: --margin {margin:g}")
    if sequential:
        return (f"about {needed:,} queries ({n:,} now) would decide a one-look check with {100 * DEFAULT_POWER:.0f} % "
                "power (normal approximation, mean and spread as observed); the confidence sequence of --sequential is "
                "wider and needs more, but it stays valid however often you add queries and rerun")
    return (f"about {needed:,} queries ({n:,} now) would decide it with {100 * DEFAULT_POWER:.0f} % power, a one-look "
            "estimate: it assumes the mean paired difference and its per-query spread stay as observed (normal "
            "approximation: n = ((z_{1-a/2} + z_power) * sd / |mean - threshold|)^2, at least n + 1); adding queries "
            "and rerunning until it passes is many looks, which this number does not cover (--sequential does); the "
            "gallery's own sampling noise is not in it either, so grow the gallery with the queries")


def _fmt(x: float | None) -> str:
    return "    -   " if x is None else f"{x:8.4f}"


def text_summary_lines(payload: dict) -> list[str]:
    """The ``text_upgrade`` payload (:mod:`engine.upgrade.text_upgrade`) as plain lines."""
    names, corpus, at_k = payload["models"], payload["corpus"], f"recall@{payload['k']}"
    lines = [f"text upgrade summary: {' -> '.join(names)} on wordnet ({corpus['task']}, {corpus['queries']:,} queries, "
             f"{corpus['gallery']:,} definitions, {corpus['train_texts']:,} training texts, seed {corpus['seed']})"]
    for metric, matrix in payload["matrices"].items():
        lines.append(f"  {metric} (row = query model, column = gallery model)")
        lines += [f"    {names[t]:<20}" + "".join(_fmt(x) for x in row) for t, row in enumerate(matrix)]
    for pair in payload["pairs"]:
        if pair.get("decision"):  # summaries stored before decisions have none
            d = pair["decision"]
            lines.append(f"  {names[pair['old']]} -> {names[pair['new']]}: decision: {d['headline']}: {d['reason']}")
        lines.append(f"  {names[pair['old']]} -> {names[pair['new']]}: old/old new/old new/new, diff [interval] -> verdict")
        lines += [f"    {r['metric']:<22}{_fmt(r['old_old'])}{_fmt(r['new_old'])}{_fmt(r['new_new'])}  "
                  f"{r['diff']:+.4f} [{r['lo']:+.4f}, {r['hi']:+.4f}] -> {r['verdict']}" for r in pair["rows"]]
    for pair in payload["adapters"]:
        lines.append(f"  adapters {names[pair['old']]} -> {names[pair['new']]}: recall@1, recall@{payload['k']}, "
                     "share of new/new, diff [interval] -> verdict")
        lines += [f"    {r['family'] + ' ' + r['kind']:<22}{_fmt(r['recall@1'])}{_fmt(r[at_k])}"
                  f"{_fmt(r['share_of_new_new'])}  {r['diff']:+.4f} [{r['lo']:+.4f}, {r['hi']:+.4f}] -> {r['verdict']} "
                  f"(fitted on {r['fitted_on']})" for r in pair["rows"]]
    return lines + [f"  note: {n}" for n in payload["notes"]]


def _text_summary(args: argparse.Namespace) -> int:
    """``--text-summary``: the text_upgrade analysis of a stored text comparison, printed (and written with --json)."""
    from engine.core.contract import normalize_params
    from engine.upgrade.text_upgrade import compute_text_upgrade
    from storage import get_engine

    if args.experiment is None:
        raise ValueError("--text-summary goes with --experiment ID (a stored text comparison)")
    given = [flag for flag, on in (("--old-step/--new-step", args.old_step is not None or args.new_step is not None),
                                   ("--plan", args.plan is not None), ("--report", args.report is not None),
                                   ("--metric", args.metric is not None)) if on]
    if given:
        raise ValueError(f"--text-summary covers every pair and metric of the experiment; leave out {', '.join(given)}")
    params = normalize_params("text_upgrade", {"k": args.k, "resamples": args.resamples, "level": args.level,
                                               "seed": args.seed})
    payload = compute_text_upgrade(get_engine(args.db), args.experiment, params, lambda fraction, message: None)
    if args.json is not None:
        try:
            write_json_atomic(args.json, payload, allow_nan=False)
        except OSError as exc:
            raise ValueError(f"--json {args.json}: cannot write ({exc.strerror or type(exc).__name__})") from None
    print("\n".join(text_summary_lines(payload)))
    return 0


def _export_target(args: argparse.Namespace) -> Path | None:
    """``--export trec DIR``: the folder (inside the data roots), refused before any work when it cannot be."""
    if args.export is None:
        return None
    fmt, folder = args.export
    if fmt != "trec":
        raise ValueError(f"--export {fmt}: check-upgrade writes trec (run files and qrels), e.g. --export trec DIR")
    if args.old_gallery is None:
        raise ValueError("--export trec goes with --old-gallery (the top-k lists of the sources check)")
    return trec_folder(folder)


def _export_trec(folder: Path, check, adapted: dict) -> list[str]:
    """Write the check's TREC files (with the plan's adapted->old lists); the lines that say so (and how many lists
    hold tied scores)."""
    from engine.results.trec import QRELS_NAME, tied_note, write_files
    from engine.upgrade.from_sources import trec_texts

    runs, qrels, tied = trec_texts(check, adapted)
    try:
        paths = write_files(folder, {**runs, QRELS_NAME: qrels})
    except OSError as exc:
        raise ValueError(f"--export trec {folder}: cannot write ({exc.strerror or type(exc).__name__})") from None
    out = [f"  export: {', '.join(p.name for p in paths)} (TREC, written to {folder})"]
    if note := tied_note(tied, check.rank_ties):
        out.append(f"  note: {note}")
    return out


def cmd_check_upgrade(args: argparse.Namespace) -> int:
    """Print the verdict sentence and the numbers; the exit code is the verdict's."""
    if args.text_summary:
        if args.json is not None:
            _check_json_target(args.json)
        return _text_summary(args)
    if args.json is not None:
        _check_json_target(args.json)  # refused before any work, so nothing is half-done
    _plan_options(args)
    plan_files = plan_target(args.plan) if args.plan is not None else None
    if plan_files and args.json is not None and Path(os.path.realpath(args.json)) in plan_files:
        raise ValueError(f"--json {args.json} is one of --plan's files; give them different names")
    report_file = report_target(args, [*(plan_files or ()), *([Path(os.path.realpath(args.json))] if args.json else [])])
    unknown = [o for o in args.orderings if o not in ORDERINGS]
    if unknown:
        raise ValueError(f"unknown backfilling order(s) {', '.join(unknown)}; known: {', '.join(ORDERINGS)}")
    if args.sequential and (args.interval is not None or args.query_groups is not None):
        raise ValueError("--sequential is its own interval over the queries one by one; leave out "
                         + ("--interval" if args.interval is not None else "--query-groups"))
    settings = {"metric": args.metric or decision_metric("labels"), "resamples": args.resamples, "level": args.level,
                "seed": args.seed, "margin": args.margin, "ties": args.ties,
                "interval": "sequential" if args.sequential else args.interval or DEFAULT_INTERVAL,
                "orderings": tuple(args.orderings), "rollout": args.rollout}
    export = _export_target(args)
    if args.old_gallery is None:
        _refuse_source_options(args, "--features, --experiment or --model")
    if args.old_gallery is not None:
        report, source, features = _check_sources(args, settings)
    elif args.experiment is not None:
        report, source, features = _check_experiment(args, settings)
    elif args.models is not None:
        report, source, features = _check_models(args, settings)
    else:
        report, source, features = _check_folder(args, settings)
    plan = _plan(args, report, features)  # the one decision: printed on every check, written with --plan
    c, b = report.compatibility, report.better
    reach = lambda x: "never" if x is None else f"{x:.3f}"  # noqa: E731
    judged = b.verdict != NOT_JUDGED
    new_new = f"{report.new_new:.4f}" if judged or report.relevance != "none" else "(the reference)"
    if report.new_new != report.new_new and report.relevance != "none":  # NaN: no new gallery
        new_new = "not measured"
    alone = (f"on its own diff {b.diff:+.4f} [{b.lo:+.4f}, {b.hi:+.4f}] -> {b.verdict} " if judged
             else "on its own: not judged ")
    lines = [report.sentence(),
             f"  {report.metric}: {report.old_name}/{report.old_name} {report.old_old:.4f}  "
             f"{report.new_name}/{report.old_name} {report.new_old:.4f}  {report.new_name}/{report.new_name} {new_new}  "
             f"({report.n_queries} queries, {report.n_no_positive} without a "
             f"{'positive' if report.relevance == 'labels' else 'relevant item'}; {report.n_gallery} gallery items)",
             f"  compatibility diff {c.diff:+.4f} [{c.lo:+.4f}, {c.hi:+.4f}] -> {c.verdict}; {alone}"
             + (f"(anytime-valid confidence sequence over {report.paired_over}, level {report.level:g})"
                if report.interval == "sequential" else
                f"(paired percentile bootstrap over {report.paired_over}, {report.resamples} resamples, "
                f"level {report.level:g}, seed {report.seed})"),
             f"  rule: {report.rule.name}",
             f"  decision: {plan.plan.headline()}: {plan.plan.reason}"]
    if "convention" in source:
        lines.append(f"  convention: {source['convention']}")
    if tied := tie_line(report.to_json()):
        lines.append(f"  {tied}")
    if c.verdict == "too close to call":
        needed = needed_line(c.needed, c.n, tie=c.tie, margin=margin_to_decide(c.lo, c.hi),
                             sequential=report.interval == "sequential")
        lines.append(f"  queries needed: {needed}")
    lines += [f"  backfill {need.ordering:<16} area {need.area:.4f}  to reach {report.old_name}'s self-test "
              f"{reach(need.to_old_self)}, {report.new_name}'s {reach(need.to_new_self)} ({report.metric}; the plan reads "
              f"{backfill_metric(report.metric, report.relevance)})" for need in report.backfill]
    lines += [f"  roll-out {need.ordering:<24} area {need.area:.4f}  to reach {report.old_name}'s self-test "
              f"{reach(need.to_old_self)}, {report.new_name}'s {reach(need.to_new_self)}" for need in report.rollout]
    plan_json = plan.to_json({**source, **report.to_json()})
    if report_file is not None:  # rendered before anything is written: a failure writes nothing
        text = report_text(args, report_file, plan_json, source)
    if args.json is not None:  # written before anything is printed: a failed write prints only the error
        try:
            write_json_atomic(args.json, {**source, **report.to_json()}, allow_nan=False)
        except OSError as exc:
            raise ValueError(f"--json {args.json}: cannot write ({exc.strerror or type(exc).__name__})") from None
    if export is not None:
        lines += _export_trec(export, features, plan.adapted_lists)
    if plan_files is not None:
        # OUT.md is the release report in Markdown: the decision first, the inputs, command line, version, date, costs
        write_plan(plan_files, plan_json, report_text(args, plan_files[1], plan_json, source))
        lines.append(f"  plan: {plan.plan.headline()} (written to {plan_files[0].name} and {plan_files[1].name})")
    if report_file is not None:
        write_report(report_file, text)
        lines.append(f"  report: {plan.plan.headline()} (written to {report_file.name})")
    lines += [f"  plan {line}" for line in plan_lines(plan.plan)]
    print("\n".join(lines + [f"  note: {n}" for n in (*report.notes, *source.get("notes", []))]))
    return EXIT_CODES[report.verdict]
