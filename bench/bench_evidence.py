"""Decisions proven on real upgrades: the plan's decision on samples of a corpus against the same decision on the whole.

A **run** is an ordered pair of model versions (old, new) on one corpus with one relevance. Its **truth** is the
paired difference new/old - old/old (and new/new - old/old) and the migration plan's decision
(:func:`engine.upgrade.plan.migration_plan` through :func:`engine.upgrade.migration.decide_in_memory`), computed on
the whole corpus with the decision metric (:func:`engine.core.vocab.decision_metric`: mAP with labels). The product
then decides from random samples of 1 %, 5 % and 10 % of the queries (and of the gallery too where the metric does not
depend on the gallery's size: WordNet's supersense labels, 45 classes of 200 definitions on average, whose AP a uniform
thinning leaves about where it was; with one relevant item per query, or the 400 images of Fashion-MNIST's gallery,
the whole gallery is kept), several seeded draws each, with the same functions and defaults. The
draws are sorted by :mod:`engine.upgrade.evidence` (agreement, false ship, false block, too close; Clopper-Pearson
upper bounds; rates in bins of the true gap; the operating curve).

Models (text, all offline): MiniLM L3, L6, L6 int8 (the shipped wheels), and versions made here from their
embeddings: a float16 export of L6, and PCA exports of L6 and L3 to 256 and 128 dimensions fitted on WordNet's
training split, each mapped back into its parent's coordinates by its own basis (``centre + (x - centre) V^T V``), so
old and new indexes share one space. The static distillation of L6 joins when model2vec is installed (its extra;
skipped with a note otherwise). Corpora: WordNet example sentences -> definitions (qrels: one relevant item), the same
texts with supersense labels (class relevance, 45 classes), and WordNet definitions -> GCIDE's Webster 1913 senses of
the same word (:mod:`engine.data.gcide`, Debian ``dict-gcide``). Images: EfficientNet-Lite0/1/2 on Fashion-MNIST's
test split (60 images per class, a third of them queries, class labels; embedding them costs minutes on two cores),
and the project's own sequences on Fashion-MNIST's whole test split (``fashion-test``, 3,330 queries x 6,670 gallery
images): five methods (:data:`TRAINED_METHODS`: independent, BCT, ER, BCT-ER, d-Simplex-HOC), each a small CNN per step
of 6 + 2 + 2 classes trained by the pipeline (:func:`engine.run.pipeline.run_study`, seed 0, CPU, one thread, the
reduced scale's 600 images per class and 10 epochs; minutes on two cores), each upgrade 1 -> 2, 2 -> 3 and 1 -> 3 a run.
Each corpus is embedded once per model (texts through the project's cache, ``data/cache/text-embeddings``; image
features in ``bench/results/cache``; the trained models and their features in the pipeline's database there,
``bench/results/cache/trained``, found again by their config's hash, so they are trained once).

Speed: a decision that rules 1-4 of the plan take from the verdicts alone (do not ship, too close on its own, ship
as is) reads no adapter, roll-out or threshold, so it is taken from :func:`~engine.upgrade.verdict.check_upgrade`
without backfill curves and :func:`~engine.upgrade.plan.migration_plan`; any other adds the backfill curves
check_upgrade computes when the guardrail fails (:func:`~engine.upgrade.verdict.backfill_needs`, default orderings)
and goes through :func:`~engine.upgrade.migration.decide_in_memory` (``tests/test_evidence_smoke.py`` checks that
both give check_upgrade + decide_in_memory's decision). The recovery forecast's inputs (:mod:`engine.upgrade.forecast`)
are measured on the whole corpus and on every draw; its truth is the whole corpus's Procrustes adapter.

    python bench/bench_evidence.py            # the evidence base: >= 63 runs, under an hour on the 2-core machine
    python bench/bench_evidence.py --quick    # a smaller corpus, fewer pairs, two models trained briefly, fewer draws

Writes ``bench/results/evidence.json`` (every run and draw) and ``docs/evidence/summary.json`` (what the README and the
Upgrade check page show) with the operating curve ``docs/evidence/operating_curve.png``; prints the tables.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.config import RunConfig, config_from_dict
from engine.core.vocab import decision_metric
from engine.metrics.compatibility import CellFeatures
from engine.upgrade import evidence as ev

from engine.upgrade import forecast as fc
from engine.upgrade.migration import decide_in_memory, forecast_inputs
from engine.upgrade.plan import Plan, migration_plan
from engine.upgrade.verdict import (UpgradeReport, backfill_needs, best_ordering, check_upgrade,
                                    per_query_scores)

FRACTIONS = (0.01, 0.05, 0.10)
SIZES = {"full": {"wordnet": (3000, 9000, 1000), "gcide": (2000, 6000), "fashion": 60, "draws": 4},
         "quick": {"wordnet": (600, 2400, 300), "gcide": (400, 1600), "fashion": 60, "draws": 2}}
BASE_TEXT = {"L3": "minilm_l3", "L6": "minilm_l6", "L6-int8": "minilm_l6_int8", "L6-static": "minilm_l6_static"}
EXPORTS = {"L6-fp16": ("L6", "fp16"), "L6-pca256": ("L6", 256), "L6-pca128": ("L6", 128), "L3-pca256": ("L3", 256),
           "L3-pca128": ("L3", 128)}
TEXT_PAIRS = (("L3", "L6"), ("L6", "L3"), ("L6", "L6-int8"), ("L6-int8", "L6"), ("L6", "L6-fp16"), ("L6-fp16", "L6"),
              ("L6", "L6-pca256"), ("L6-pca256", "L6"), ("L6", "L6-pca128"), ("L6-pca128", "L6"),
              ("L6-pca128", "L6-pca256"), ("L6-pca256", "L6-pca128"), ("L3", "L3-pca256"), ("L3-pca256", "L3"),
              ("L3-pca128", "L3"), ("L3-pca128", "L6"))
STATIC_PAIRS = (("L6", "L6-static"), ("L6-static", "L6"))
QUICK_PAIRS = (("L3", "L6"), ("L6", "L6-int8"), ("L6", "L6-pca128"), ("L6-pca128", "L6"))
LITE = ("lite0", "lite1", "lite2")
IMAGE_PAIRS = tuple((a, b) for a in LITE for b in LITE if a != b)
# the project's own sequences (train_sequences): 6 + 2 + 2 Fashion-MNIST classes, one model per step, trained from
# scratch (independent: no tie to the last model; bct: its classifier's influence loss) or fine-tuned from the last
# model (er: plain cross-entropy; bct_er: with BCT's loss; dsimplex_hoc: CL2R's fixed d-Simplex and its distillation)
TRAINED_METHODS = ("independent", "bct", "er", "bct_er", "dsimplex_hoc")
TRAINED_SCENARIO = {"initial_classes": 6, "increment": 2, "num_steps": 3}
# full: the reduced scale of `reproduce` (engine.reproduce.plan.SCALE_SETTINGS) on the whole test split
TRAINED_BUDGET = {"full": {"train_per_class": 600, "test_per_class": 1000, "epochs": 10, "width": 32},
                  "quick": {"train_per_class": 100, "test_per_class": 300, "epochs": 2, "width": 16}}
TRAINED_PAIRS = tuple((f"{m}-{a}", f"{m}-{b}") for m in TRAINED_METHODS for a, b in ((1, 2), (2, 3), (1, 3)))
QUICK_TRAINED = ("independent", "bct_er")  # --quick: their first upgrade each
ROOT = Path(__file__).resolve().parents[1]  # where the results and docs/evidence are written
CACHE = ROOT / "bench" / "results" / "cache"
SUMMARY = ROOT / "docs" / "evidence" / "summary.json"
FIGURE = ROOT / "docs" / "evidence" / "operating_curve.png"


@dataclass(frozen=True)
class Corpus:
    """One corpus with one relevance: its label arrays, whether a draw samples the gallery too, and where the
    embeddings of each version come from (``key``: the texts' or images' name in :func:`embed_all`)."""

    name: str
    key: str
    query_labels: np.ndarray
    gallery_labels: np.ndarray
    sample_gallery: bool
    about: str


# ------------------------------------------------------------------------------------------------ embeddings
def text_corpora(size: dict[str, Any]) -> tuple[list[Corpus], dict[str, dict[str, list[str]]], str]:
    """The three text corpora and their texts (``wordnet``: query, gallery, train; ``gcide``: query, gallery)."""
    from engine.data.gcide import gcide_task
    from engine.data.wordnet import wordnet_task

    q, g, t = size["wordnet"]
    wn = wordnet_task(queries=q, gallery=g, seed=0, train=t)
    gq, gg = size["gcide"]
    gc = gcide_task(queries=gq, gallery=gg, seed=0)
    qrels, supersense = wn.relevance_labels("qrels"), wn.relevance_labels("class")
    corpora = [Corpus("wordnet-qrels", "wordnet", *qrels, False,
                      f"WordNet example -> its synset's definition, {q:,} queries x {g:,} definitions"),
               Corpus("wordnet-supersense", "wordnet", *supersense, True,
                      f"WordNet example -> definitions of its supersense (45 classes), {q:,} x {g:,}"),
               Corpus("gcide", "gcide", gc.query_labels, gc.gallery_labels, False,
                      f"WordNet definition -> GCIDE's Webster 1913 senses of the same word, {gq:,} x {gg:,}")]
    texts = {"wordnet": {"query": wn.query_texts, "gallery": wn.gallery_texts, "train": wn.train_texts},
             "gcide": {"query": gc.query_texts, "gallery": gc.gallery_texts}}
    spec = f"wordnet:task=qrels|class,queries={q},gallery={g},seed=0,train={t}; gcide:queries={gq},gallery={gg},seed=0"
    return corpora, texts, spec


def embed_texts(texts: dict[str, dict[str, list[str]]], names: Sequence[str],
                log: Callable[[str], None]) -> tuple[dict[str, dict[str, dict[str, np.ndarray]]], dict[str, Any]]:
    """version -> corpus key -> split -> float32 embeddings, each (model, list of texts) through the text cache."""
    from engine.checkpoints.text_cache import TextEmbeddingCache, cached_encode
    from engine.models.text_models import load_text_model

    cache, out, timing = TextEmbeddingCache(), {}, {}
    for short in names:
        started, embedded, cached_n = time.perf_counter(), 0, 0
        encoder = load_text_model(BASE_TEXT[short], device="cpu")
        try:
            out[short] = {}
            for key, splits in texts.items():
                out[short][key] = {}
                for split, items in splits.items():
                    x, cached = cached_encode(encoder, items, cache=cache, batch_size=64)
                    out[short][key][split] = np.asarray(x, np.float32)
                    cached_n += len(items) if cached else 0
                    embedded += 0 if cached else len(items)
        finally:
            encoder.close()
        timing[short] = {"seconds": round(time.perf_counter() - started, 1), "embedded": embedded, "cached": cached_n}
        log(f"{short}: {embedded:,} texts embedded, {cached_n:,} read from the cache, {timing[short]['seconds']} s")
    return out, timing


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def pca_export(train: np.ndarray, dims: int) -> Callable[[np.ndarray], np.ndarray]:
    """The ``dims``-d PCA export of unit-normalised embeddings fitted on ``train``, mapped back by its own basis."""
    x = unit(train)
    centre = x.mean(axis=0)
    _, _, vt = np.linalg.svd(x - centre, full_matrices=False)
    basis = vt[:dims]
    return lambda e: (centre + (unit(e) - centre) @ basis.T @ basis).astype(np.float32)


def derive_exports(emb: dict[str, dict[str, dict[str, np.ndarray]]]) -> None:
    """Add :data:`EXPORTS` to ``emb`` (in place), each made from its parent's embeddings of every corpus."""
    for name, (parent, how) in EXPORTS.items():
        if parent not in emb:
            continue
        f = ((lambda e: e.astype(np.float16).astype(np.float32)) if how == "fp16"
             else pca_export(emb[parent]["wordnet"]["train"], int(how)))
        emb[name] = {key: {split: f(x) for split, x in splits.items()} for key, splits in emb[parent].items()}


def embed_images(per_class: int, log: Callable[[str], None]) -> tuple[dict[str, dict[str, dict[str, np.ndarray]]],
                                                                     Corpus | None, dict[str, Any]]:
    """EfficientNet-Lite0/1/2 encoder features of Fashion-MNIST's test split (``per_class`` images of each class: the
    first third of each class's images are queries, the rest the gallery), cached as ``.npy`` in :data:`CACHE`."""
    from engine.data.registry import load_dataset

    try:
        images = load_dataset("fashion", split="test", per_class=per_class)
    except (OSError, ValueError) as exc:
        log(f"images skipped: {str(exc).splitlines()[0]}")
        return {}, None, {}
    labels = images.labels.numpy()
    is_query = first_thirds(labels)
    out, timing = {}, {}
    for short in LITE:
        path = CACHE / f"fashion_test_{per_class}_{short}.npy"
        started = time.perf_counter()
        x = np.load(path, allow_pickle=False) if path.is_file() else None
        if x is None or x.shape[0] != len(labels):
            x = _lite_features(f"efficientnet_{short}", images)
            CACHE.mkdir(parents=True, exist_ok=True)
            np.save(path, x, allow_pickle=False)
        timing[short] = {"seconds": round(time.perf_counter() - started, 1), "images": len(labels)}
        out[short] = {"fashion": {"query": x[is_query], "gallery": x[~is_query]}}
        log(f"{short}: {len(labels):,} images, {timing[short]['seconds']} s")
    corpus = Corpus("fashion", "fashion", labels[is_query], labels[~is_query], False,
                    f"Fashion-MNIST test split, {int(is_query.sum()):,} queries x {int((~is_query).sum()):,} gallery "
                    "images, class labels")
    return out, corpus, timing


def first_thirds(labels: np.ndarray) -> np.ndarray:
    """The queries of an image corpus: the first third (rounded down) of each class's images, in the given order."""
    labels = np.asarray(labels)
    rank, third = np.zeros(len(labels), np.int64), np.zeros(len(labels), np.int64)
    for c in np.unique(labels):
        members = labels == c
        rank[members] = np.arange(int(members.sum()))
        third[members] = int(members.sum()) // 3
    return rank < third


def trained_config(budget: dict[str, int], methods: Sequence[str] = TRAINED_METHODS) -> RunConfig:
    """The study config of the trained sequences: ``methods`` on Fashion-MNIST, :data:`TRAINED_SCENARIO`, a small
    CNN, seed 0, on the CPU with one pinned thread (the same models on any machine), at ``budget``'s sizes."""
    return config_from_dict({
        "name": "evidence: trained sequences", "methods": list(methods), "seeds": [0], "device": "cpu",
        "dataset": {"name": "fashion", "train_per_class": budget["train_per_class"],
                    "test_per_class": budget["test_per_class"]},
        "scenario": dict(TRAINED_SCENARIO), "model": {"backbone": "small_cnn", "width": budget["width"]},
        "eval": {"metrics": ["map"], "train_features_per_class": 0},
        "training": {"epochs": budget["epochs"], "batch_size": 64, "lr": 0.05, "lr_schedule": "cosine"}})


def train_sequences(budget: dict[str, int], folder: Path, log: Callable[[str], None],
                    methods: Sequence[str] = TRAINED_METHODS) -> tuple[dict[str, dict[str, dict[str, np.ndarray]]],
                                                                       Corpus | None, dict[str, Any]]:
    """The project's own sequences (``methods``, one model per step of :data:`TRAINED_SCENARIO`), trained by the
    pipeline (:func:`engine.run.pipeline.run_study`) into ``folder`` (a SQLite database and its checkpoints), and
    their encoder features of Fashion-MNIST's test split as the pipeline stored them. A sequence trained before, with
    this config, is found by its config's hash and not trained again. Versions are named ``method-step``."""
    from engine.reproduce.plan import stored_runs
    from engine.run.pipeline import RunContext, run_study
    from storage import get_engine, init_db, list_model_versions, load_feature_set, session_scope

    cfg = trained_config(budget, methods)
    started, last = time.perf_counter(), [0.0]
    db = get_engine(f"sqlite:///{folder.absolute() / 'runs.db'}")
    init_db(db)
    before = len(stored_runs(db, cfg))

    def progress(fraction: float, message: str) -> None:
        if time.perf_counter() - last[0] >= 60:
            last[0] = time.perf_counter()
            log(f"training: {100 * fraction:.0f} %, {message}")

    try:
        _, ids = run_study(cfg, RunContext(db, folder / "checkpoints", progress=progress))
    except (OSError, ValueError) as exc:
        log(f"trained sequences skipped: {str(exc).splitlines()[0]}")
        return {}, None, {}
    out: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    with session_scope(db) as s:
        for exp_id in ids:
            for v in list_model_versions(s, exp_id):
                x, labels, _ = load_feature_set(s, v.id, "query", "encoder")  # closed set: every test image
                out[f"{v.method}-{v.step}"] = {"x": np.asarray(x, np.float32)}
    is_query = first_thirds(labels)
    out = {name: {"fashion-test": {"query": v["x"][is_query], "gallery": v["x"][~is_query]}} for name, v in out.items()}
    seconds = round(time.perf_counter() - started, 1)
    timing = {"seconds": seconds, "sequences": len(ids), "already_trained": before, "images": len(labels),
              "config": cfg.to_dict()}
    log(f"trained sequences: {len(ids)} ({before} trained before), {len(out)} models, {seconds} s")
    corpus = Corpus("fashion-test", "fashion-test", labels[is_query], labels[~is_query], False,
                    f"Fashion-MNIST test split ({budget['test_per_class']:,} per class), {int(is_query.sum()):,} "
                    f"queries x {int((~is_query).sum()):,} gallery images, class labels; small CNNs trained here on "
                    "its training split")
    return out, corpus, timing


def _lite_features(name: str, images: Any) -> np.ndarray:
    import torch

    from engine.checkpoints.embedding import extract, model_batch
    from engine.checkpoints.loading import load_model
    from engine.checkpoints.request import model_source

    source = model_source({"path": f"pretrained:{name}"})
    model = load_model(source.path, arch=source.arch, num_classes=source.num_classes)
    size = source.input_size or model.input_size
    batches = (model_batch(images.batch(slice(s, min(s + 64, len(images))), size=size), model, source)
               for s in range(0, len(images), 64))
    return np.asarray(extract(model, batches, torch.device("cpu"))["encoder"], np.float32)


# ------------------------------------------------------------------------------------------------ decisions
def verdicts_decide(plan: Plan) -> bool:
    """Whether rules 1-4 of the plan took ``plan`` (taken from the verdicts alone: no adapter, roll-out or threshold
    is read): ship as is, do not ship, or do not ship yet because v2's own gain is too close to call."""
    return plan.decision in ("ship as is", "do not ship") or (plan.decision == "do not ship yet"
                                                               and plan.success == "too close to call")


def decide(old: CellFeatures, new: CellFeatures, names: tuple[str, str], metric: str,
           seed: int = 0) -> tuple[UpgradeReport, Plan, list[dict[str, Any]]]:
    """The report, the plan and its adapter rows, as check-upgrade --plan takes them (see the module docstring)."""
    report = check_upgrade(old, new, names=names, metric=metric, seed=seed, orderings=())
    plan = migration_plan(report.to_json())
    if verdicts_decide(plan):
        return report, plan, []
    if report.compatibility.verdict == "not compatible":  # what check_upgrade adds with its default orderings
        needs = backfill_needs(old, new, metric=metric, old_self=report.old_old, seed=seed)
        report = dataclasses.replace(report, backfill=needs, best_ordering=best_ordering(needs))
    got = decide_in_memory(old, new, report)
    return report, got.plan, got.adapters


def procrustes_truth(old: CellFeatures, new: CellFeatures, report: UpgradeReport,
                     adapters: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole corpus's Procrustes adapter (the plan's, fitted on its seeded half of the gallery): adapted/old and
    its shares of new/new and old/old."""
    from engine.upgrade.migration import adapter_rows

    rows = adapters or adapter_rows(old, new, report, kinds=("procrustes",))
    row = next(r for r in rows if r["name"] == "procrustes")
    got = row["adapted_old"]
    return {"adapted_old": got, "share_of_new": got / report.new_new if report.new_new else None,
            "share_of_old": got / report.old_old if report.old_old else None,
            "verdict": row["compatibility"]["verdict"]}


def _sub(cell: CellFeatures, rows: np.ndarray | None, cols: np.ndarray | None) -> CellFeatures:
    q = slice(None) if rows is None else rows
    g = slice(None) if cols is None else cols
    return CellFeatures(cell.query[q], np.asarray(cell.query_labels)[q], cell.gallery[g], np.asarray(cell.gallery_labels)[g])


def _pts(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(100 * float(x), 4)


def _compact(f: dict[str, Any]) -> dict[str, Any]:
    """Forecast inputs as JSON: per-query scores rounded, NaN (no positive) as null."""
    return {**f, **{k: [None if math.isnan(v) else round(float(v), 6) for v in f[k]] for k in ("oo", "nn", "adapted")}}


def run_pair(index: int, corpus: Corpus, old_x: dict[str, np.ndarray], new_x: dict[str, np.ndarray],
             names: tuple[str, str], draws: int, metric: str,
             self_test: Callable[[str, CellFeatures], np.ndarray] | None = None) -> dict[str, Any]:
    """One run: the truth on the whole corpus, then ``draws`` seeded samples at each fraction of :data:`FRACTIONS`.
    ``self_test(version, cell)``: a version's per-query self-test on the whole corpus (cached across runs)."""
    started = time.perf_counter()
    old = CellFeatures(old_x["query"], corpus.query_labels, old_x["gallery"], corpus.gallery_labels)
    new = CellFeatures(new_x["query"], corpus.query_labels, new_x["gallery"], corpus.gallery_labels)
    report, plan, adapters = decide(old, new, names, metric)
    whole = None
    if self_test is not None:
        whole = _compact(forecast_inputs(old, new, metric, index,
                                                  self_tests=(self_test(names[0], old), self_test(names[1], new))))
    truth = {"decision": plan.decision, "headline": plan.headline(), "success": plan.success,
             "guardrail": plan.guardrail, "old_old": _pts(report.old_old), "new_old": _pts(report.new_old),
             "new_new": _pts(report.new_new), "gap": _pts(report.compatibility.diff),
             "gap_lo": _pts(report.compatibility.lo), "gap_hi": _pts(report.compatibility.hi),
             "better": _pts(report.better.diff), "better_lo": _pts(report.better.lo),
             "better_hi": _pts(report.better.hi), "n_queries": report.n_queries, "n_gallery": report.n_gallery,
             "procrustes": procrustes_truth(old, new, report, adapters), "forecast_inputs": whole}
    rows = []
    n_q, n_g = len(corpus.query_labels), len(corpus.gallery_labels)
    for fraction in FRACTIONS:
        for d in range(draws):
            rng = np.random.default_rng([index, round(1000 * fraction), d])
            qi = np.sort(rng.choice(n_q, size=max(2, round(fraction * n_q)), replace=False))
            gi = np.sort(rng.choice(n_g, size=max(2, round(fraction * n_g)), replace=False)) if corpus.sample_gallery else None
            o, n = _sub(old, qi, gi), _sub(new, qi, gi)
            t0 = time.perf_counter()
            try:
                r, p, _ = decide(o, n, names, metric)
            except ValueError as exc:  # a sample without a query that has a positive: nothing to judge
                rows.append({"run": index, "fraction": fraction, "draw": d, "refused": str(exc).splitlines()[0]})
                continue
            f = forecast_inputs(o, n, metric, seed=index)
            rows.append({"run": index, "fraction": fraction, "draw": d, "n_queries": r.n_queries,
                         "n_gallery": r.n_gallery, "decision": p.decision, "headline": p.headline(),
                         "verdict": r.compatibility.verdict, "better": r.better.verdict,
                         "gap": _pts(r.compatibility.diff), "guardrail_lo": _pts(r.compatibility.lo),
                         "guardrail_hi": _pts(r.compatibility.hi), "better_diff": _pts(r.better.diff),
                         "success_lo": _pts(r.better.lo), "success_hi": _pts(r.better.hi),
                         "seconds": round(time.perf_counter() - t0, 3),
                         "forecast_inputs": _compact(f)})
    return {"run": index, "corpus": corpus.name, "old": names[0], "new": names[1], "metric": metric, "truth": truth,
            "draws": rows, "seconds": round(time.perf_counter() - started, 1)}


# ------------------------------------------------------------------------------------------------ summary
def flat_draws(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every judged draw with its run's truth beside it (the records :mod:`engine.upgrade.evidence` reads)."""
    out = []
    for run in runs:
        t = run["truth"]
        for d in run["draws"]:
            if "refused" in d:
                continue
            out.append({"run": run["run"], "corpus": run["corpus"], "pair": f"{run['old']} -> {run['new']}",
                        "fraction": d["fraction"], "draw": d["draw"], "truth": t["decision"], "decision": d["decision"],
                        "truth_headline": t["headline"], "headline": d["headline"], "verdict": d["verdict"],
                        "better": d["better"], "true_gap": t["gap"], "true_better": t["better"],
                        "truth_guardrail": t["guardrail"], "truth_success": t["success"],
                        "guardrail_lo": d["guardrail_lo"], "guardrail_hi": d["guardrail_hi"],
                        "success_lo": d["success_lo"], "success_hi": d["success_hi"], "gap": d["gap"],
                        "better_diff": d["better_diff"], "n_queries": d["n_queries"], "n_gallery": d["n_gallery"]})
    return out


def forecast_rows(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run on the whole corpus (``fraction`` "whole") and per draw: the forecast's inputs and the whole
    corpus's Procrustes recovery (its truth)."""
    def scores(values: Sequence[float | None]) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in values], np.float64)

    out = []
    for run in runs:
        truth = run["truth"]["procrustes"]
        if truth["share_of_new"] is None or truth["share_of_old"] is None:
            continue
        samples = [(run["truth"].get("forecast_inputs"), "whole")]
        samples += [(d["forecast_inputs"], d["fraction"]) for d in run["draws"] if "refused" not in d]
        for f, fraction in samples:
            if f is None or "adapted" not in f:  # an older --out file: no per-query adapted scores
                continue
            row = {"run": run["run"], "corpus": run["corpus"], "fraction": fraction, "residual": f["residual"],
                   "share_of_new": truth["share_of_new"], "share_of_old": truth["share_of_old"],
                   **{k: scores(f[k]) for k in ("oo", "nn", "adapted")}}
            try:  # a sample whose queries score 0 on the old model alone has no ratio to forecast
                fc.forecast_recovery(row["oo"], row["nn"], row["adapted"], row["residual"])
            except ValueError:
                continue
            out.append(row)
    return out


def why(d: dict[str, Any]) -> str:
    """What makes a listed disagreement, from the draw's own numbers: too few queries, a whole corpus that is itself
    too close to call, a sample interval that misses the whole corpus's difference, or a remedy judged otherwise."""
    if d["n_queries"] < 10:
        return f"{d['n_queries']} queries: too few for any interval"
    missed = [r for r in ("guardrail", "success") if d[f"{r}_covers"] is False]
    where = " (the gallery sampled too)" if d["corpus"] == "wordnet-supersense" else ""
    if d["truth"] == ev.NOT_YET:
        return ("the whole corpus is itself too close to call (differences "
                f"{d['true_gap']:+.2f} / {d['true_better']:+.2f} points); the sample's "
                + (" and ".join(missed) + " interval misses them" + where if missed else "intervals cover them"))
    if missed:
        return f"the sample's {' and '.join(missed)} interval misses the whole corpus's difference{where}"
    return "same verdicts' direction; an adapter is judged otherwise on the sample (fitted or scored on fewer items)"


def summarise(runs: Sequence[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """The committed summary: decision rates per sample fraction and overall, per-run rates, verdict error and too-close
    rates in bins of the true gap, the operating curves, the disagreements and the forecast's validation."""
    draws = flat_draws(runs)
    per_fraction = {str(f): ev.decision_rates([d for d in draws if d["fraction"] == f]) for f in FRACTIONS}
    decided = [d for d in draws if d["truth"] != ev.NOT_YET]  # runs whose whole corpus decides
    truth_decided = {**{str(f): ev.decision_rates([d for d in decided if d["fraction"] == f]) for f in FRACTIONS},
                     "all": ev.decision_rates(decided)}
    bins = {reading: {str(f): ev.verdict_bins([d for d in draws if d["fraction"] == f], reading) for f in FRACTIONS}
            for reading in ("guardrail", "success")}
    truths = {}
    for run in runs:
        truths[run["truth"]["decision"]] = truths.get(run["truth"]["decision"], 0) + 1
    keep = ("run", "corpus", "pair", "fraction", "draw", "truth_headline", "headline", "verdict", "better", "true_gap",
            "true_better", "guardrail_lo", "guardrail_hi", "success_lo", "success_hi", "truth_guardrail",
            "truth_success", "n_queries", "n_gallery", "outcome", "guardrail_covers", "success_covers")
    return {"meta": meta, "runs": len(runs), "draws": len(draws), "truth_decisions": truths,
            "corpora": sorted({r["corpus"] for r in runs}), "fractions": list(FRACTIONS),
            "overall": ev.decision_rates(draws), "per_fraction": per_fraction, "truth_decided": truth_decided,
            "per_run": ev.run_rates(draws),
            "bins": bins, "operating_curve": {r: ev.operating_curve(draws, r) for r in ("guardrail", "success")},
            "disagreements": [{**{k: d.get(k) for k in keep}, "why": why(d)} for d in ev.disagreements(draws)],
            "runs_table": [{"run": r["run"], "corpus": r["corpus"], "pair": f"{r['old']} -> {r['new']}",
                            "truth": r["truth"]["headline"], "gap": r["truth"]["gap"], "better": r["truth"]["better"],
                            "old_old": r["truth"]["old_old"], "new_old": r["truth"]["new_old"],
                            "new_new": r["truth"]["new_new"],
                            "procrustes_share_of_new": r["truth"]["procrustes"]["share_of_new"],
                            "seconds": r["seconds"]} for r in runs],
            "forecast": fc.validate(forecast_rows(runs))}


def _cell(r: dict[str, Any], *, lower: bool = False) -> str:
    """``1.7 % (13/744; <= 2.8 %)``: an error rate with its upper bound, or an agreement with its lower (``lower``)."""
    if not r["n"]:
        return "–"
    bound = f">= {100 * r['lower']:.1f}" if lower else f"<= {100 * r['upper']:.1f}"
    return f"{100 * r['rate']:.1f} % ({r['k']}/{r['n']}; {bound} %)"


def tables(summary: dict[str, Any]) -> str:
    """The README's tables (Markdown): decisions per fraction, then verdict errors and too-close calls per gap bin."""
    head = ("| sample | draws | agreement | agreement when both decide | the same or a costlier remedy, both decide "
            "| false ship | false ship, whole corpus decided | false block | too close (do not ship yet) | costlier remedy "
            "| other |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for f, r in [*summary["per_fraction"].items(), ("all", summary["overall"])]:
        label = f"{100 * float(f):g} %" if f != "all" else "**all**"
        lines.append(f"| {label} | {r['draws']} | {_cell(r['agree'], lower=True)} | "
                     f"{_cell(r['agree_when_both_decide'], lower=True)} | "
                     f"{_cell(r['agree_or_costlier_when_both_decide'], lower=True)} | "
                     f"{_cell(r['false_ship'])} | {_cell(summary['truth_decided'][f]['false_ship'])} | "
                     f"{_cell(r['false_block'])} | {_cell(r['too_close'])} | {_cell(r['costlier'])} | {_cell(r['other'])} |")
    lines += ["", "| reading | sample | " + " | ".join(f"gap {b['bin']} pts: error / too close"
                                                       for b in summary["bins"]["guardrail"]["0.01"]) + " |",
              "|---|---|" + "---|" * len(summary["bins"]["guardrail"]["0.01"])]
    for reading, per in summary["bins"].items():
        for f, rows in per.items():
            cells = [f"{_cell(b['error'])} / {100 * b['too_close']['rate']:.0f} %" if b["draws"] else "–" for b in rows]
            lines.append(f"| {reading} | {100 * float(f):g} % | " + " | ".join(cells) + " |")
    reasons: dict[str, int] = {}
    for d in summary["disagreements"]:
        key = d["why"].split(" (differences")[0].split(":")[0]
        reasons[key] = reasons.get(key, 0) + 1
    lines += ["", "disagreements outside 'too close to call', by what makes them:"]
    lines += [f"- {n} x {k}" for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def figure(summary: dict[str, Any], path: Path) -> None:
    """The operating curves (guardrail and success), one panel per sample fraction, as a PNG (altair + vl-convert):
    the share of draws whose verdict passes, fails or is too close, against the whole corpus's gap (symlog axis)."""
    import altair as alt
    import pandas as pd
    import vl_convert as vlc

    kind = {"compatible": "passes", "better": "passes", "not compatible": "fails", "not better": "fails",
            "too close to call": "too close to call"}
    reading = {"guardrail": "compatibility (new/old vs old/old)", "success": "new alone (new/new vs old/old)"}
    samples = [f"{100 * f:g} % of the queries" for f in summary["fractions"]]
    rows = [{**r, "reading": reading[name], "sample": f"{100 * r['fraction']:g} % of the queries",
             "kind": kind[r["verdict"]]} for name, curve in summary["operating_curve"].items() for r in curve]
    chart = alt.Chart(pd.DataFrame(rows)).mark_line(point=True).encode(
        x=alt.X("gap:Q", title="whole-corpus difference (points)",
                scale=alt.Scale(type="symlog", constant=0.5)),
        y=alt.Y("share:Q", title="share of draws", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("kind:N", title="sampled verdict",
                        scale=alt.Scale(domain=["passes", "fails", "too close to call"],
                                        range=["#2e7d32", "#c62828", "#9e9e9e"])),
    ).properties(width=230, height=150).facet(
        row=alt.Row("reading:N", title=None, sort=list(reading.values())),
        column=alt.Column("sample:N", title=None, sort=samples))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(vlc.vegalite_to_png(chart.to_json(), scale=1.5))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a small corpus, four text, two Lite and two briefly trained pairs, two draws (minutes)")
    p.add_argument("--draws", type=int, help="seeded draws per sample fraction (default 4; --quick 2)")
    p.add_argument("--no-images", action="store_true", help="text runs only (no Lite, no training)")
    p.add_argument("--runs", type=int, help="only the first N runs (a look: the summary is written only to --summary)")
    p.add_argument("--out", type=Path, help="every run and draw as JSON (default bench/results/evidence.json; --quick: "
                   "evidence-quick.json)")
    p.add_argument("--summary", type=Path, default=SUMMARY, help="the committed summary (--quick: not written unless given)")
    p.add_argument("--from-json", type=Path, help="summarise an earlier --out file again (no embedding, no run)")
    args = p.parse_args(argv)
    started, load_start = time.perf_counter(), os.getloadavg()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {msg}", file=sys.stderr, flush=True)

    if args.from_json:
        data = json.loads(args.from_json.read_text())
        runs, meta = data["runs"], data["meta"]
    else:
        size = SIZES["quick" if args.quick else "full"]
        draws = args.draws or size["draws"]
        log("reading the corpora")
        corpora, texts, spec = text_corpora(size)
        static = importlib.util.find_spec("model2vec") is not None
        names = ["L3", "L6", "L6-int8"] + (["L6-static"] if static else [])
        notes = [] if static else ["the static distillation of L6 is skipped: model2vec is not installed "
                                   "(pip install -r requirements-text-static.txt)"]
        emb, timing = embed_texts(texts, names, log)
        derive_exports(emb)
        pairs = list(QUICK_PAIRS if args.quick else TEXT_PAIRS) + ([] if args.quick or not static else list(STATIC_PAIRS))
        plan = [(c, a, b) for c in corpora for a, b in pairs]
        if not args.no_images:
            img, fashion, itiming = embed_images(size["fashion"], log)
            timing.update(itiming)
            if fashion is not None:
                emb.update(img)
                plan += [(fashion, a, b) for a, b in (IMAGE_PAIRS[:2] if args.quick else IMAGE_PAIRS)]
            else:
                notes.append("images skipped: Fashion-MNIST is not on this machine")
            trained, fashion_test, ttiming = train_sequences(TRAINED_BUDGET["quick" if args.quick else "full"],
                                                             CACHE / "trained", log,
                                                             QUICK_TRAINED if args.quick else TRAINED_METHODS)
            if fashion_test is not None:
                emb.update(trained)
                timing["trained"] = ttiming
                plan += [(fashion_test, a, b) for a, b in
                         ([(f"{m}-1", f"{m}-2") for m in QUICK_TRAINED] if args.quick else TRAINED_PAIRS)]
            else:
                notes.append("trained sequences skipped: Fashion-MNIST is not on this machine")
        plan = plan[: args.runs] if args.runs else plan
        embedded_at = time.perf_counter() - started
        metric = decision_metric("labels")
        runs, self_tests = [], {}

        def self_test(version: str, cell: CellFeatures, corpus: Corpus) -> np.ndarray:
            key = (corpus.name, version)
            if key not in self_tests:
                self_tests[key] = per_query_scores(cell.query, cell.query_labels, cell.gallery, cell.gallery_labels,
                                                   metric=metric)
            return self_tests[key]

        for i, (corpus, a, b) in enumerate(plan):
            runs.append(run_pair(i, corpus, emb[a][corpus.key], emb[b][corpus.key], (a, b), draws, metric,
                                 lambda v, c, corpus=corpus: self_test(v, c, corpus)))
            t = runs[-1]["truth"]
            log(f"run {i + 1}/{len(plan)} {corpus.name} {a} -> {b}: {t['headline']} (gap {t['gap']:+.2f}, own "
                f"{t['better']:+.2f} pts), {runs[-1]['seconds']} s")
        meta = {"command": "python bench/bench_evidence.py" + (" --quick" if args.quick else ""),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                "load_average_start": [round(x, 2) for x in load_start],
                "load_average_end": [round(x, 2) for x in os.getloadavg()],
                "seconds": round(time.perf_counter() - started, 1), "embedding_seconds": round(embedded_at, 1),
                "embedding": timing, "corpora": {c.name: c.about for c in corpora} | (
                    {"fashion": fashion.about} if not args.no_images and fashion is not None else {}) | (
                    {"fashion-test": fashion_test.about} if not args.no_images and fashion_test is not None else {}),
                "corpus_spec": spec, "draws_per_fraction": draws, "metric": metric, "notes": notes,
                "exports": "PCA exports fitted on WordNet's training split, mapped back by their own basis; fp16 cast"}
        out = args.out or ROOT / "bench" / "results" / ("evidence-quick.json" if args.quick else "evidence.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": meta, "runs": runs}))
    summary = summarise(runs, meta)
    print(tables(summary))
    print(f"\n{summary['runs']} runs, {summary['draws']} draws in {meta['seconds']:.0f} s (embedding "
          f"{meta['embedding_seconds']:.0f} s); load average {meta['load_average_start']} -> {meta['load_average_end']}")
    print(f"disagreements outside 'too close to call': {len(summary['disagreements'])}")
    for side in ("new", "old"):
        print(f"forecast of the share of {side}/{side} (leave one run out; coverage, mean half-width in points): " + ", ".join(
            f"{k}: {100 * v[side]['coverage']:.1f} %, {100 * v[side]['half_width']:.1f} (n {v['n']})"
            for k, v in summary["forecast"].get("leave_one_run_out", {}).items() if v.get("n")))
    if not (args.quick or args.runs) or args.summary != SUMMARY:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(json.dumps(summary, indent=1) + "\n")
        figure(summary, args.summary.parent / FIGURE.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
