"""Issue 29's remedies on two real upgrades: post-hoc adapter recovery curves and the migration plan.

Text: MiniLM L3 (old, ONNX) -> L6 (new, safetensors) on a WordNet qrels sample (queries: a synset's first example
sentence; gallery: definitions; the one relevant item of a query is its own synset's definition). Image, when
``--image-old/--image-new`` are given: EfficientNet-Lite0 -> Lite2 ``encoder`` features of the same images (npz: ids,
vectors, labels; the README "Post-hoc adapters" says how they were made), 1,000 seeded random items the queries.

Steps (each skipped when its output exists): embed WordNet with both models into OUT/text_{gallery,queries}_{old,new}.npz
(ids = synset ids; labels: gallery positions, so label-based Recall@k is the qrels task); run
``python -m engine adapter curve`` at Recall@1, Recall@10 and label-free neighbour recall@10 on them (and, with ``--image-curve``, on the image features); write the ``check-upgrade --features`` folders
(step_1.npz old, step_2.npz new) for both upgrades and run ``check-upgrade --plan``. Prints a summary.

    OMP_NUM_THREADS=1 python bench/bench_remedies.py --out /tmp/remedies [--queries 1000 --gallery 4000]
        [--image-old img_old.npz --image-new img_new.npz [--image-curve]]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("procrustes", "affine", "cluster", "mlp")


def embed_wordnet(out: Path, queries: int, gallery: int, seed: int) -> None:
    """Embed a WordNet qrels sample with MiniLM L3 (old) and L6 (new); four npz files under ``out``."""
    from engine.data.wordnet import wordnet_task
    from engine.models.text_models import load_text_model

    task = wordnet_task(queries=queries, gallery=gallery, seed=seed)
    q_labels, g_labels = task.relevance_labels("qrels")
    for tag, name in (("old", "minilm_l3"), ("new", "minilm_l6")):
        if (out / f"text_queries_{tag}.npz").exists():
            continue
        start = time.perf_counter()
        model = load_text_model(name, threads=1, device="cpu")
        g = model.encode(task.gallery_texts)
        q = model.encode(task.query_texts)
        model.close()
        print(f"{name}: {len(g) + len(q)} texts in {time.perf_counter() - start:.0f} s", flush=True)
        np.savez(out / f"text_gallery_{tag}.npz", ids=np.array(task.gallery_ids), vectors=g, labels=g_labels)
        np.savez(out / f"text_queries_{tag}.npz", ids=np.array(task.query_ids), vectors=q, labels=q_labels)


def engine(args: list[str], log: Path) -> int:
    """Run ``python -m engine ARGS`` with this checkout's code; stdout+stderr to ``log``; its exit code."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    start = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "engine", *args], stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    print(f"python -m engine {args[0]}: exit {rc} in {time.perf_counter() - start:.0f} s ({log})", flush=True)
    return rc


def text_curves(out: Path, pairs: str) -> None:
    """``adapter curve`` of the four kinds at Recall@1 and Recall@10 (qrels by gallery position) and label-free
    (neighbour recall@10 against L6's own top-10)."""
    for relevance, k, tag in (("labels", 1, "k1"), ("labels", 10, "k10"), ("none", 10, "none_k10")):
        target = out / f"text_curve_{tag}.json"
        if target.exists():
            continue
        engine(["adapter", "curve", "--old", str(out / "text_gallery_old.npz"), "--new", str(out / "text_gallery_new.npz"),
                "--query-old", str(out / "text_queries_old.npz"), "--query-new", str(out / "text_queries_new.npz"),
                "--relevance", relevance, "--k", str(k), "--pairs", pairs, "--resamples", "1000",
                "--data-root", str(out), "--json", str(target)], out / f"text_curve_{tag}.log")


def image_curve(out: Path, image_old: Path, image_new: Path) -> None:
    """``adapter curve`` of the four kinds on the image features: 1,000 held-out items the queries, Recall@1 by label."""
    target = out / "image_curve_k1.json"
    if not target.exists():
        engine(["adapter", "curve", "--old", str(image_old), "--new", str(image_new), "--held-out", "1000",
                "--pairs", "250,500,1000,2000,4000", "--resamples", "1000", "--data-root", str(out),
                "--data-root", str(image_old.parent), "--data-root", str(image_new.parent), "--json", str(target)],
               out / "image_curve_k1.log")


def _step(path: Path, q: np.ndarray, ql: np.ndarray, g: np.ndarray, gl: np.ndarray) -> None:
    np.savez(path, query_features=q.astype(np.float32), query_labels=ql, gallery_features=g.astype(np.float32),
             gallery_labels=gl)


def write_features(out: Path, image_old: Path | None, image_new: Path | None, seed: int) -> list[str]:
    """The ``check-upgrade --features`` folders (step_1 old, step_2 new) of the upgrades whose embeddings exist."""
    names = []
    text = out / "features_text"
    if not text.exists():
        text.mkdir()
        for step, tag in ((1, "old"), (2, "new")):
            q, g = np.load(out / f"text_queries_{tag}.npz"), np.load(out / f"text_gallery_{tag}.npz")
            _step(text / f"step_{step}.npz", q["vectors"], q["labels"], g["vectors"], g["labels"])
    names.append("text")
    if image_old is not None and image_new is not None:
        image = out / "features_image"
        if not image.exists():
            old, new = np.load(image_old), np.load(image_new)
            if not np.array_equal(old["ids"], new["ids"]):
                raise SystemExit("error: the image npz files hold different ids (or another order)")
            image.mkdir()
            order = np.random.default_rng(seed).permutation(len(old["ids"]))
            queries, gallery = order[:1000], np.sort(order[1000:])
            for step, arrays in ((1, old), (2, new)):
                v, lab = arrays["vectors"], arrays["labels"]
                _step(image / f"step_{step}.npz", v[queries], lab[queries], v[gallery], lab[gallery])
        names.append("image")
    return names


def plans(out: Path, names: list[str], text_threshold: float) -> None:
    """``check-upgrade --features DIR --plan`` with all four adapter kinds, four backfilling orders and the roll-outs,
    for each upgrade; the text upgrade once more with an old threshold given (its qrels never reach the default's
    precision 0.9: one relevant item per query)."""
    runs = [(name, name, []) for name in names]
    if "text" in names:
        runs.append((f"text_t{text_threshold:g}", "text", ["--threshold", f"{text_threshold:g}"]))
    for tag, name, extra in runs:
        target = out / f"plan_{tag}"
        if Path(f"{target}.json").exists():
            continue
        engine(["check-upgrade", "--features", str(out / f"features_{name}"), "--plan", str(target),
                "--metric", "recall@1",  # the README's figures: Recall@1 (the decision's own default is mAP)
                "--adapters", *KINDS, "--orderings", "random", "distance_mse", "distance_cosine", "adapter_residual",
                "--rollout", *extra, "--json", str(out / f"check_{tag}.json"), "--data-root", str(out)],
               out / f"plan_{tag}.log")


def summary(out: Path) -> None:
    """One line per kind and pair count: adapted/old, its shares of old/old and new/new, the paired interval."""
    for name, tag in (("text", "k1"), ("text", "k10"), ("text", "none_k10"), ("image", "k1")):
        path = out / f"{name}_curve_{tag}.json"
        if not path.exists():
            continue
        curve = json.loads(path.read_text())
        print(f"{name} {curve['metric']}:", json.dumps(curve["baselines"]))
        for row in curve["rows"]:
            d = row["vs new/new"]
            print(f"  {row['kind']:10s} {row['pairs']:5d} pairs: {row['adapted/old']:.3f} "
                  f"({100 * row['share of old/old']:.0f} % of old/old, {100 * row['share of new/new']:.0f} % of new/new; "
                  f"vs new/new {100 * d['lo']:+.1f}..{100 * d['hi']:+.1f} points)")
    for plan in sorted(out.glob("plan_*.md")):
        print(f"--- {plan.name}\n{plan.read_text()}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="scratch folder (created; finished steps are reused)")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--gallery", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pairs", default="250,500,1000,2000,3000,4000", help="the text curve's pair counts")
    p.add_argument("--text-threshold", type=float, default=0.6, help="the old (L3) cosine threshold to re-map")
    p.add_argument("--image-old", type=Path, help="EfficientNet-Lite0 features (npz: ids, vectors, labels)")
    p.add_argument("--image-new", type=Path, help="EfficientNet-Lite2 features of the same images")
    p.add_argument("--image-curve", action="store_true",
                   help="also the image upgrade's recovery curve (about 15 min of 1280-d fits on one loaded core)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    embed_wordnet(args.out, args.queries, args.gallery, args.seed)
    text_curves(args.out, args.pairs)
    plans(args.out, write_features(args.out, args.image_old, args.image_new, args.seed), args.text_threshold)
    if args.image_curve and args.image_old is not None and args.image_new is not None:
        image_curve(args.out, args.image_old, args.image_new)
    summary(args.out)
    print(f"total {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
