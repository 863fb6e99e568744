"""A local MTEB retrieval task made from WordNet, offline (Debian's ``wordnet-base``), in the BEIR layout MTEB reads.

Queries are example sentences, the corpus holds definitions, and each query's one relevant document is its own
synset's definition (the sample of ``engine.data.wordnet.wordnet_task``, fixed by the seed). Written to FOLDER:
``corpus.jsonl``, ``queries.jsonl`` and ``qrels/test.tsv``; ``python -m engine mteb FOLDER --model ...`` scores it.

    python examples/wordnet_mteb_task.py data/wordnet-task [--queries 200] [--gallery 800] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine.data.wordnet import wordnet_task


def write_jsonl(path: Path, ids: list[str], texts: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for ident, text in zip(ids, texts):
            f.write(json.dumps({"_id": ident, "text": text}, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--gallery", type=int, default=800)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    task = wordnet_task(queries=args.queries, gallery=args.gallery, seed=args.seed)
    (args.folder / "qrels").mkdir(parents=True, exist_ok=True)
    write_jsonl(args.folder / "corpus.jsonl", task.gallery_ids, task.gallery_texts)
    write_jsonl(args.folder / "queries.jsonl", task.query_ids, task.query_texts)
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{grade}" for q, rel in task.qrels.items()
                                              for d, grade in rel.items()]
    (args.folder / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote a retrieval task of {len(task.query_ids)} WordNet example sentences and {len(task.gallery_ids)} "
          f"definitions to {args.folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
