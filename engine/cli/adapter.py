"""``python -m engine adapter fit|curve|apply``: post-hoc maps from the new space to the old one (issue 29).

``fit`` fits one map on N pairs and exports it (safetensors + JSON + ONNX, ``engine/adapters/artifact.py``) with
its held-out scores; ``curve`` prints (and with ``--json`` writes) the recovery curve of one or more kinds over a
grid of pair counts; ``apply`` maps a file of new embeddings into the old space, block by block (``fit --direction
old-to-new``: a corpus transform, and ``apply`` maps the stored old gallery into the new space, into a new file). Sources are the
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
from typing import TYPE_CHECKING

from engine.core.kinds import POSTHOC_ADAPTERS, QRELS_HELP, listed
from engine.core.vocab import check_resamples
from engine.data import roots
from engine.metrics.paired import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES

if TYPE_CHECKING:  # the command line imports no kernel before a command runs
    import numpy as np

    from engine.adapters.posthoc import PosthocMap
    from engine.core.fingerprint import Fingerprint
    from engine.sources import Source

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
    p.add_argument("--qrels", metavar="SRC", help="with --query-old/--query-new: the relevance check-upgrade --old-gallery "
                   f"--qrels judges with. {QRELS_HELP}")
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
    fit.add_argument("--direction", choices=("new-to-old", "old-to-new"), default="new-to-old",
                     help="new-to-old (default): a query-side adapter, new queries mapped onto the old gallery; "
                          "old-to-new: a corpus transform, the stored old vectors mapped once into the new space "
                          "(apply it to the old gallery with 'adapter apply'); recorded in the adapter's fitted_on")
    fit.add_argument("--no-onnx", action="store_true", help="write no ONNX graph (without the onnx package)")
    fit.add_argument("--force", action="store_true", help="replace an existing --out folder")
    fit.add_argument("--old-model", metavar="NAME", help="declare the model of --old (recorded in the adapter's "
                     "fingerprint when the store carries none)")
    fit.add_argument("--new-model", metavar="NAME", help="declare the model of --new (the adapter's input fingerprint; its output for "
                     "--direction old-to-new)")
    curve = sub.add_parser("curve", help="recovery curve vs the number of pairs, per adapter kind")
    _add_sources(curve)
    curve.add_argument("--kind", action="append", dest="kinds",
                       help=f"a kind to fit: {KINDS_HELP} (repeatable; default every kind)")
    curve.add_argument("--pairs", type=_grid, default=_grid(GRID_TEXT), metavar="N,N,...",
                       help=f"pair counts, capped by the gallery's size (default {GRID_TEXT})")
    curve.add_argument("--json", type=Path, metavar="OUT", help="also write the curve as JSON (atomically)")
    apply = sub.add_parser("apply", help="map a file of embeddings through an adapter (streamed in blocks): new ones "
                                         "into the old space, or, with an old-to-new transform, the old gallery into "
                                         "the new space")
    apply.add_argument("--adapter", type=Path, required=True, metavar="DIR", help="a folder written by 'adapter fit'")
    apply.add_argument("--in", required=True, dest="input", metavar="SRC",
                       help="the embeddings to map (a source text): new ones, or the old gallery for an old-to-new "
                            "transform; read only, the output is a new file")
    apply.add_argument("--out", type=Path, required=True, metavar="FILE", help="output .npy, .npz or .parquet (in the data roots)")
    apply.add_argument("--force", action="store_true", help="replace an existing output file")
    apply.add_argument("--block-rows", type=int, default=65536, help="rows read and mapped at a time (default 65536)")
    apply.add_argument("--model", metavar="NAME", help="declare the model that made --in when its store carries no "
                       "fingerprint (checked against the adapter's input fingerprint)")
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
    from engine.adapters.posthoc import NEW_TO_OLD, OLD_TO_NEW, options_for
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
    transform = args.direction == "old-to-new"
    new_space = _space(args.new, args.new_model, split.gallery.new, "--new")
    old_space = _space(args.old, args.old_model, split.gallery.old, "--old")
    # the adapter's input is the space it maps from: new for a query-side adapter, old for a corpus transform
    spaces = {"input": old_space, "output": new_space} if transform else {"input": new_space, "output": old_space}
    m, fit_s = fit_on_pairs(split, args.kind, args.pairs, normalise=args.normalise, options=options, fitted_on=fitted_on,
                            direction=OLD_TO_NEW if transform else NEW_TO_OLD)
    if transform:
        return _fit_transform(args, m, scorer, split, fit_s, out, spaces)
    adapted, apply_us = apply_timed(m, split.queries.new)
    m.metrics = {"metric": scorer.metric, "relevance": scorer.relevance, **scorer.baselines(), **scorer.score(adapted),
                 "fit_seconds": fit_s, "apply_us_per_query": apply_us}
    save_adapter(m, out, force=args.force, onnx=not args.no_onnx, fingerprints=spaces)
    s = m.metrics
    print(f"{args.kind} adapter ({m.new_dim} -> {m.old_dim} dims) fitted on {args.pairs} pairs, written to {out}")
    print(f"  {scorer.metric} on {s['n_queries']} held-out queries: old/old {s['old/old']:.4f}  new/new "
          f"{s['new/new']:.4f}  adapted/old {s['adapted/old']:.4f} ({_share(s['share of old/old'])} of old/old, "
          f"{_share(s['share of new/new'])} of new/new)")
    print(f"  fit {fit_s:.3f} s, apply {apply_us:.2f} us per query; options {asdict(options)}")
    print(f"  fingerprints: input {spaces['input'].describe()}; output {spaces['output'].describe()}")
    return 0


def _fit_transform(args: argparse.Namespace, m, scorer, split, fit_s: float, out: Path,
                   spaces: dict[str, Fingerprint]) -> int:
    """Score an old -> new corpus transform on the held-out queries (the new queries on the transformed old gallery)
    and export it; its direction is in its ``fitted_on``."""
    from engine.adapters.artifact import save_adapter
    from engine.adapters.recovery import apply_timed

    transformed, apply_us = apply_timed(m, split.gallery.old)
    m.metrics = {"metric": scorer.metric, "relevance": scorer.relevance, **scorer.baselines(),
                 **scorer.score_transformed(transformed), "fit_seconds": fit_s, "apply_us_per_vector": apply_us}
    save_adapter(m, out, force=args.force, onnx=not args.no_onnx, fingerprints=spaces)
    s = m.metrics
    print(f"{args.kind} corpus transform (old -> new, {m.new_dim} -> {m.old_dim} dims) fitted on {args.pairs} pairs, "
          f"written to {out}")
    print(f"  {scorer.metric} on {s['n_queries']} held-out queries: old/old {s['old/old']:.4f}  new/new "
          f"{s['new/new']:.4f}  new queries on the transformed gallery {s['new/transformed']:.4f} "
          f"({_share(s['share of old/old'])} of old/old, {_share(s['share of new/new'])} of new/new)")
    print(f"  fit {fit_s:.3f} s, apply {apply_us:.2f} us per stored vector (one pass, no model); options "
          f"{asdict(m.options)}")
    print(f"  fingerprints: input {spaces['input'].describe()}; output {spaces['output'].describe()}")
    return 0


def _space(text: str, declared: str | None, vectors: np.ndarray, flag: str) -> Fingerprint:
    """The fingerprint of the space of ``text``'s vectors: what its store carries (its metadata), else the declared
    name, else the dimension alone; the normalisation measured on ``vectors`` when the store states none."""
    from dataclasses import replace

    from engine.core.fingerprint import Fingerprint, carried_or_declared, normalisation_of
    from engine.sources import open_source

    source = open_source(text, what=f"{flag} embeddings")
    try:
        carried = _one_fingerprint(source, flag)
    finally:
        source.close()
    dim = int(vectors.shape[1])
    fp = carried_or_declared(carried, declared, dim, what=flag) or Fingerprint(dim)
    return fp if fp.normalisation is not None else replace(fp, normalisation=normalisation_of(vectors))


def _one_fingerprint(source: Source, flag: str) -> Fingerprint | None:
    """The fingerprint ``source`` carries (None: none); a store whose files carry different ones is refused, one whose
    files carry one and no other is read as that one's, saying on stderr how many files carry none."""
    parts = source.fingerprint_parts
    found = {fp for _, _, fp in parts if fp is not None}
    if len(found) > 1:
        raise ValueError(f"{flag} {source.text.masked()} mixes vectors of several models: its files carry "
                         f"{len(found)} different fingerprints; run python -m engine doctor on it")
    bare = sum(fp is None for _, _, fp in parts)
    if found and bare:
        print(f"warning: {bare} of the {len(parts)} files of {flag} carry no fingerprint; they are taken to hold "
              f"vectors of the others' model", file=sys.stderr)
    fp = found.pop() if found else None
    if fp is not None and source.dim is not None and fp.dim != source.dim:
        raise ValueError(f"{flag}: the store's fingerprint says {fp.dim}-d vectors, it holds {source.dim}-d ones")
    return fp


def _checked_input(m: PosthocMap, adapter: Path, source: Source, declared: str | None) -> None:
    """Refuse (one line) vectors whose fingerprint does not match the adapter's input; say on stderr when the check
    is left to the dimension (an adapter from before fingerprints, or a source with no fingerprint, none declared)."""
    from engine.adapters.artifact import load_fingerprints
    from engine.core.fingerprint import MISMATCH, UNKNOWN, carried_or_declared, compare

    spaces = load_fingerprints(adapter)
    got = carried_or_declared(_one_fingerprint(source, "--in"), declared, source.dim, what="--in")
    if spaces is None:
        print(f"warning: {adapter} records no fingerprint (written before fingerprints); the input is checked on its "
              f"dimension alone ({m.new_dim}-d)", file=sys.stderr)
        return
    if got is None:
        print(f"warning: --in carries no fingerprint and none was declared (--model NAME); the input is checked on its "
              f"dimension alone ({m.new_dim}-d), not on the model ({spaces['input'].describe()})", file=sys.stderr)
        return
    verdict, reason = compare(spaces["input"], got, ignore=("normalisation",) if m.normalise == "l2" else ())
    if verdict == MISMATCH:
        raise ValueError(f"--in holds {reason}: the adapter maps {spaces['input'].describe()}; nothing was written")
    if verdict == UNKNOWN:
        print(f"warning: {reason}; the input is checked on its dimension alone ({m.new_dim}-d)", file=sys.stderr)


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
    from engine.adapters.posthoc import OLD_TO_NEW, map_direction
    from engine.sources import open_source

    out = roots.confine(args.out, what="--out")
    output_kind(out)
    if args.block_rows < 1:
        raise ValueError(f"--block-rows must be at least 1, got {args.block_rows}")
    adapter = roots.confine(args.adapter, what="--adapter")
    m = load_adapter(adapter)
    source = open_source(args.input, what="old gallery (--in)" if map_direction(m) == OLD_TO_NEW
                         else "new embeddings (--in)", dim=m.new_dim)
    try:
        location = Path(source.text.location) if source.text.kind in ("npy", "npz", "parquet") else None
        if location is not None and location.exists() and location.resolve() == out:
            raise ValueError(f"--out {args.out} is the input itself; write the mapped vectors to another file")
        _checked_input(m, adapter, source, args.model)
        n = apply_to_file(m, source, out, force=args.force, block_rows=args.block_rows)
    finally:
        source.close()
    how = "old -> new by the" if map_direction(m) == OLD_TO_NEW else "by the"
    print(f"{n} vectors mapped {m.new_dim} -> {m.old_dim} dims {how} {m.kind} "
          f"{'corpus transform' if map_direction(m) == OLD_TO_NEW else 'adapter'}, written to {out}")
    return 0


def cmd_adapter(args: argparse.Namespace) -> int:
    """Dispatch ``adapter fit|curve|apply``."""
    return {"fit": cmd_fit, "curve": cmd_curve, "apply": cmd_apply}[args.adapter_command](args)


__all__ = ["add_arguments", "cmd_adapter"]
