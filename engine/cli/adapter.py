"""``python -m engine adapter fit|curve|apply``: post-hoc maps from the new space to the old one (issue 29).

``fit`` fits one map on N pairs and exports it (safetensors + JSON + ONNX, ``engine/adapters/artifact.py``) with
its held-out scores; ``curve`` prints (and with ``--json`` writes) the recovery curve of one or more kinds over a
grid of pair counts; ``apply`` maps a file of new embeddings into the old space, block by block. Sources are the
texts of ``engine/sources`` (``file.npz``, ``parquet:DIR#vector=emb``, ``sqlite:///e.db#table=items``, ...), the
old and new embeddings joined by item id. Every refused input is one line ``error: ...`` and exit code 2.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from dataclasses import asdict
from pathlib import Path

from engine.core.kinds import POSTHOC_ADAPTERS, listed
from engine.core.vocab import check_resamples
from engine.data import roots
from engine.metrics.paired import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES

KINDS_HELP = listed(POSTHOC_ADAPTERS)  # checked against engine.adapters.posthoc.POSTHOC when run
GRID_TEXT = "250,500,1000,2000,5000,10000,20000"


def _grid(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pairs takes comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("--pairs is empty")
    return values


def _add_sources(p: argparse.ArgumentParser) -> None:
    p.add_argument("--old", required=True, metavar="SRC", help="the old model's embeddings of the items (a source text)")
    p.add_argument("--new", required=True, metavar="SRC", help="the new model's embeddings of the same items")
    p.add_argument("--query-old", metavar="SRC", help="a separate query set's old embeddings (with --query-new); "
                                                      "default: --held-out random items are the queries")
    p.add_argument("--query-new", metavar="SRC", help="the same queries' new embeddings")
    p.add_argument("--held-out", type=int, default=None, metavar="M",
                   help="without --query-*: items held out as queries, never fitted on (default 1000, at most a fifth)")
    p.add_argument("--relevance", choices=("labels", "qrels", "none"),
                   help="labels: Recall@k by shared label; qrels: nDCG@k under --qrels; none: neighbour recall@k against "
                        "the new model's own top-k (default: qrels with --qrels, else labels when both sources have labels)")
    p.add_argument("--qrels", metavar="SRC", help="with --query-old/--query-new: judgements query id -> item id -> grade "
                   "(TREC, BEIR .tsv or Parquet; or named trec:/beir:), the relevance check-upgrade --old-gallery --qrels judges with")
    p.add_argument("--k", type=int, help="the k of the metric (default 1 for labels, 10 for qrels and none)")
    p.add_argument("--normalise", choices=("l2", "none"), default="l2",
                   help="l2 (default): unit rows in and out (cosine retrieval); none: the raw vectors")
    p.add_argument("--set", action="append", default=[], dest="settings", metavar="[KIND.]KEY=VALUE",
                   help="an option of an adapter kind, e.g. ridge=0.1, clusters=16, routing=soft, rank=32, epochs=50 "
                        "(KIND. needed when several kinds are fitted)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out split and the order pairs are taken in")
    p.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help="bootstrap resamples of the intervals")
    p.add_argument("--level", type=float, default=DEFAULT_CONFIDENCE, help="confidence level of the intervals")
    roots.add_arguments(p)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``adapter`` command's subcommands and their options."""
    p.description = __doc__.split("\n\n")[0]
    sub = p.add_subparsers(dest="adapter_command", required=True, metavar="{fit,curve,apply}")
    fit = sub.add_parser("fit", help="fit one map on N pairs and export it (safetensors, JSON, ONNX)")
    _add_sources(fit)
    fit.add_argument("--kind", required=True, help=KINDS_HELP)
    fit.add_argument("--pairs", type=int, required=True, metavar="N", help="pairs to fit on (from the gallery items)")
    fit.add_argument("--out", type=Path, required=True, metavar="DIR", help="the adapter folder to write (in the data roots)")
    fit.add_argument("--no-onnx", action="store_true", help="write no ONNX graph (without the onnx package)")
    fit.add_argument("--force", action="store_true", help="replace an existing --out folder")
    curve = sub.add_parser("curve", help="recovery curve vs the number of pairs, per adapter kind")
    _add_sources(curve)
    curve.add_argument("--kind", action="append", dest="kinds",
                       help=f"a kind to fit: {KINDS_HELP} (repeatable; default every kind)")
    curve.add_argument("--pairs", type=_grid, default=_grid(GRID_TEXT), metavar="N,N,...",
                       help=f"pair counts, capped by the gallery's size (default {GRID_TEXT})")
    curve.add_argument("--json", type=Path, metavar="OUT", help="also write the curve as JSON (atomically)")
    apply = sub.add_parser("apply", help="map a file of new embeddings into the old space (streamed in blocks)")
    apply.add_argument("--adapter", type=Path, required=True, metavar="DIR", help="a folder written by 'adapter fit'")
    apply.add_argument("--in", required=True, dest="input", metavar="SRC", help="the new embeddings (a source text)")
    apply.add_argument("--out", type=Path, required=True, metavar="FILE", help="output .npy, .npz or .parquet (in the data roots)")
    apply.add_argument("--force", action="store_true", help="replace an existing output file")
    apply.add_argument("--block-rows", type=int, default=65536, help="rows read and mapped at a time (default 65536)")
    roots.add_arguments(apply)


def _settings(items: list[str], kinds: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {k: {} for k in kinds}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: give KEY=VALUE or KIND.KEY=VALUE")
        kind, dot, name = key.rpartition(".")
        if dot:
            if kind not in out:
                raise ValueError(f"--set {item!r}: {kind!r} is not a kind being fitted ({', '.join(kinds)})")
            out[kind][name] = value
        elif len(kinds) == 1:
            out[kinds[0]][name] = value
        else:
            raise ValueError(f"--set {item!r}: several kinds are fitted; name one, e.g. --set {kinds[0]}.{key}={value}")
    return out


def _paired(old_text: str, new_text: str, what: str):
    from engine.sources import join_by_id, open_source

    old = open_source(old_text, what=f"old {what}")
    new = open_source(new_text, what=f"new {what}")
    try:
        return join_by_id(old, new), old.description, new.description
    finally:
        old.close()
        new.close()


def _split_and_scorer(args: argparse.Namespace):
    from engine.adapters.recovery import DEFAULT_HELD_OUT, Scorer, split_items

    if (args.query_old is None) != (args.query_new is None):
        raise ValueError("give --query-old and --query-new together (the same queries under both models)")
    if args.query_old is not None and args.held_out is not None:
        raise ValueError("--held-out goes without --query-old/--query-new (the separate queries are the held-out set)")
    check_resamples(args.resamples, "--resamples")
    if not 0 < args.level < 1:
        raise ValueError("--level must lie strictly between 0 and 1")
    if args.qrels is not None and args.query_old is None:
        raise ValueError("--qrels judges named queries: give them as --query-old/--query-new (held-out items have no "
                         "judgements)")
    if args.relevance == "qrels" and args.qrels is None:
        raise ValueError("--relevance qrels needs --qrels SRC (query id, item id, grade)")
    if args.qrels is not None and args.relevance not in (None, "qrels"):
        raise ValueError(f"--qrels goes with --relevance qrels (its default), not {args.relevance}")
    items, old_desc, new_desc = _paired(args.old, args.new, "embeddings (--old/--new)")
    queries = None
    if args.query_old is not None:
        queries = _paired(args.query_old, args.query_new, "queries (--query-old/--query-new)")[0]
    held_out = args.held_out if args.held_out is not None else max(1, min(DEFAULT_HELD_OUT, len(items.ids) // 5))
    split = split_items(items, queries=queries, held_out=held_out, seed=args.seed)
    judged, table = None, None
    if args.qrels is not None:
        from engine.sources.qrels import read_qrels
        from engine.upgrade.from_sources import qrels_rows

        table = read_qrels(args.qrels)
        judged = qrels_rows(table, split.queries.ids, split.gallery.ids)
    scorer = Scorer(split, relevance=args.relevance, k=args.k, resamples=args.resamples, confidence=args.level,
                    seed=args.seed, qrels=judged)
    fitted_on = {"old": old_desc, "new": new_desc, "items": len(items.ids), "gallery": len(split.gallery.ids),
                 "queries": "held-out" if queries is None else "separate", "held_out": len(split.queries.ids),
                 "seed": args.seed, **({} if table is None else {"qrels": table.description})}
    return split, scorer, fitted_on


def cmd_fit(args: argparse.Namespace) -> int:
    """Fit, score on the held-out queries, export."""
    from engine.adapters.artifact import check_replaceable, save_adapter
    from engine.adapters.posthoc import options_for
    from engine.adapters.recovery import apply_timed, fit_on_pairs

    if os.path.islink(args.out):
        raise ValueError(f"--out {args.out} is a symbolic link; give the folder itself (a link is never replaced)")
    out = roots.confine(args.out, what="--out")
    if out in roots.data_roots():
        raise ValueError(f"--out {args.out} is a data root; give a new folder inside it (a root is never replaced)")
    if out.exists() and not args.force:
        raise ValueError(f"--out {args.out} exists; give --force to replace it")
    if out.is_dir():
        check_replaceable(out)  # before the fit: --force replaces only an adapter folder
    if not args.no_onnx and importlib.util.find_spec("onnx") is None:
        raise ValueError("the ONNX graph needs the onnx package: pip install -e .[onnx] (requirements-onnx.txt), "
                         "or give --no-onnx")
    options = options_for(args.kind, _settings(args.settings, [args.kind])[args.kind])
    split, scorer, fitted_on = _split_and_scorer(args)
    m, fit_s = fit_on_pairs(split, args.kind, args.pairs, normalise=args.normalise, options=options, fitted_on=fitted_on)
    adapted, apply_us = apply_timed(m, split.queries.new)
    m.metrics = {"metric": scorer.metric, "relevance": scorer.relevance, **scorer.baselines(), **scorer.score(adapted),
                 "fit_seconds": fit_s, "apply_us_per_query": apply_us}
    save_adapter(m, out, force=args.force, onnx=not args.no_onnx)
    s = m.metrics
    print(f"{args.kind} adapter ({m.new_dim} -> {m.old_dim} dims) fitted on {args.pairs} pairs, written to {out}")
    print(f"  {scorer.metric} on {s['n_queries']} held-out queries: old/old {s['old/old']:.4f}  new/new "
          f"{s['new/new']:.4f}  adapted/old {s['adapted/old']:.4f} ({_share(s['share of old/old'])} of old/old, "
          f"{_share(s['share of new/new'])} of new/new)")
    print(f"  fit {fit_s:.3f} s, apply {apply_us:.2f} us per query; options {asdict(options)}")
    return 0


def _share(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{100 * x:.1f}%"


def cmd_curve(args: argparse.Namespace) -> int:
    """Print the recovery curve (and write it with --json)."""
    from engine.adapters.posthoc import options_for
    from engine.adapters.recovery import format_curve, recovery_curve
    from engine.results.json_file import json_target, write_json_atomic

    if args.json is not None:
        json_target(args.json)
    from engine.adapters.posthoc import POSTHOC

    kinds = list(dict.fromkeys(args.kinds or POSTHOC))
    settings = _settings(args.settings, kinds)
    specs = [(k, options_for(k, settings[k])) for k in kinds]
    split, scorer, fitted_on = _split_and_scorer(args)
    curve = recovery_curve(split, scorer, specs, grid=args.pairs, normalise=args.normalise,
                           progress=lambda line: print("  " + line, file=sys.stderr, flush=True))
    curve["fitted_on"] = fitted_on
    if args.json is not None:
        write_json_atomic(args.json, curve)
    print(format_curve(curve))
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    """Map --in through --adapter into --out."""
    from engine.adapters.artifact import load_adapter
    from engine.adapters.batch_apply import apply_to_file, output_kind
    from engine.sources import open_source

    out = roots.confine(args.out, what="--out")
    output_kind(out)
    if args.block_rows < 1:
        raise ValueError(f"--block-rows must be at least 1, got {args.block_rows}")
    adapter = roots.confine(args.adapter, what="--adapter")
    m = load_adapter(adapter)
    source = open_source(args.input, what="new embeddings (--in)", dim=m.new_dim)
    try:
        location = Path(source.text.location) if source.text.kind in ("npy", "npz", "parquet") else None
        if location is not None and location.exists() and location.resolve() == out:
            raise ValueError(f"--out {args.out} is the input itself; write the mapped vectors to another file")
        n = apply_to_file(m, source, out, force=args.force, block_rows=args.block_rows)
    finally:
        source.close()
    print(f"{n} vectors mapped {m.new_dim} -> {m.old_dim} dims by the {m.kind} adapter, written to {out}")
    return 0


def cmd_adapter(args: argparse.Namespace) -> int:
    """Dispatch ``adapter fit|curve|apply``."""
    return {"fit": cmd_fit, "curve": cmd_curve, "apply": cmd_apply}[args.adapter_command](args)


__all__ = ["add_arguments", "cmd_adapter"]
