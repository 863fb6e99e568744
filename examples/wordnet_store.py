"""A team's embedding store for the README's engineer example, made offline from real models.

Today's model (MiniLM L3) and the candidate (MiniLM L6) embed WordNet: example sentences are the queries, definitions
the gallery (Debian's ``wordnet-base``; the models are the offline data wheels of ``requirements-text-models.txt``).
Written to FOLDER: ``old_gallery.parquet``, ``new_gallery.parquet``, ``old_queries.parquet``, ``new_queries.parquet``
(columns ``id``, ``vector``) and ``qrels.tsv`` (BEIR: each query's relevant definition is its own synset's).

    python examples/wordnet_store.py data/store [--queries 300] [--gallery 1200] [--seed 0]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from engine.data.wordnet import wordnet_task
from engine.models.text_models import load_text_model


def write(path: Path, ids: list[str], vectors: np.ndarray) -> None:
    d = vectors.shape[1]
    column = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(vectors, np.float32).ravel()), d)
    pq.write_table(pa.table({"id": ids, "vector": column}), path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--gallery", type=int, default=1200)
    p.add_argument("--seed", type=int, default=0, help="the sample's seed (another seed: other synsets)")
    args = p.parse_args(argv)
    task = wordnet_task(queries=args.queries, gallery=args.gallery, seed=args.seed)
    args.folder.mkdir(parents=True, exist_ok=True)
    for side, name in (("old", "minilm_l3"), ("new", "minilm_l6")):
        model = load_text_model(name, device="cpu")
        write(args.folder / f"{side}_queries.parquet", task.query_ids, model.encode(task.query_texts))
        write(args.folder / f"{side}_gallery.parquet", task.gallery_ids, model.encode(task.gallery_texts))
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{g}\t{grade}" for q, rel in task.qrels.items() for g, grade in rel.items()]
    (args.folder / "qrels.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.queries} queries and {args.gallery} gallery items embedded by minilm_l3 (old) and minilm_l6 "
          f"(new), and their qrels, to {args.folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
