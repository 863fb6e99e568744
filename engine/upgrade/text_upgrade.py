"""The summary of a stored text comparison (the ``text_upgrade`` analysis, ``check-upgrade --text-summary``).

A text comparison (:mod:`engine.checkpoints.text_compare`) stores T text encoders' embeddings of WordNet example
sentences (queries) and definitions (gallery). For every pair of its models (old = earlier step) this gives what the
dashboard's "check a text-embedding upgrade" entry shows:

* the T x T matrices (row = query model, column = gallery model, lower triangle) of the stored relevance's
  Recall@1, Recall@k, mAP@k (AP@k of :mod:`engine.metrics.relevance`) and nDCG@k (task ``qrels``: a query's one
  relevant item is its own synset's definition; task ``class``: definitions of its supersense) and of the
  supersense-level Recall@1 (labels re-derived from the stored corpus options and checked against the stored texts);
* per pair and metric, new/old against old/old paired over the queries with check-upgrade's own pieces: the
  interval of :func:`engine.metrics.cell_interval.paired_intervals` seeded as check-upgrade's cell (1, 0) (two-way
  for Recall@k, over the queries otherwise, as :func:`engine.upgrade.verdict.check_upgrade` does), judged by
  :func:`engine.upgrade.verdict.compare` under strict ECC; plus the label-free neighbour recall@k of
  :mod:`engine.upgrade.from_sources` (reference: each query's new/new top-k, so new/new is 1 by definition and
  "better on its own" is not judged);
* adapters (``adapters``: true), every pair: the post-hoc maps of :data:`POSTHOC_KINDS` fitted on a seeded half of the
  gallery's old/new pairs and judged on the queries exactly as the migration plan's adapters
  (:mod:`engine.upgrade.migration`), and paper 004's B (kinds :data:`PAPER_KINDS`) trained on the stored ``train``
  split (supersense labels), its adapted new queries judged on the old gallery the same way.

Each cell's neighbours are computed once (:func:`engine.metrics.topk.stream_topk`, depth k) and every metric of the
cell derives from them; the two-way interval reads check-upgrade's own ranked lists
(:func:`engine.metrics.twoway.top_lists`).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine

from engine.adapters.fit import fit_adapters
from engine.analysis.views import Progress, StoredVersion, load_experiment
from engine.checkpoints.request import text_corpus
from engine.core.kinds import ADAPTERS, PAPER_004, PAPER_ADAPTERS, POSTHOC_ADAPTERS, POSTHOC_FAMILY, adapter_label, metric_parts
from engine.core.vocab import TEXT_DATASET_NAMES
from engine.data.wordnet import LEXNAMES, parse_options, wordnet_task
from engine.metrics.cell_interval import cell_seed, paired_intervals
from engine.metrics.compatibility import CellFeatures
from engine.metrics.relevance import label_outcomes, neighbour_recall
from engine.metrics.topk import TopK, array_blocks, stream_topk
from engine.metrics.twoway import TopLists, top_lists
from engine.upgrade.migration import fitted_maps, judge_map
from engine.upgrade.plan import DEFAULT_FIT_SHARE, migration_plan
from engine.upgrade.rule import Rule
from engine.upgrade.verdict import BETTER, UpgradeReport, compare
from storage import get_model_version, json_ready, list_feature_views, load_feature_set, load_image_refs, session_scope

VIEW = "encoder"
POSTHOC_KINDS = POSTHOC_ADAPTERS  # each fits in about a second at 1,000 pairs (mlp ~0.8 s)
PAPER_KINDS = tuple(k for k in PAPER_ADAPTERS if ADAPTERS[k].backward)  # paper 004's B (fct has none)
SUPERSENSE = "supersense_recall@1"
# paper 004's training on a few thousand training texts: batches of 512, lr 1e-2, 10 epochs. B_perp's matrix
# exponential costs ~0.15 s a step on one loaded core, so the small-data setting of engine.analysis.adapted (batches of
# 64, 60 epochs) takes minutes a pair. A convergence probe on WordNet L3 -> L6 (B_perp trained on the 1,200 gallery
# definitions themselves, so not a result): new queries on the old gallery Recall@1 6.3 % -> 21.3 % in 6 s (20 epochs:
# 20.7 % in 14 s).
PAPER_FIT = {"epochs": 10, "batch_size": 512, "lr": 1e-2}
NEIGHBOUR_NOTE = ("neighbour_recall@{k} is label-free: the reference is each query's top-{k} under the new model on "
                  "its own gallery, so new/new is 1 by definition and 'better on its own' is not judged")


@dataclass(frozen=True)
class TextExperiment:
    """A stored text comparison read back: corpus options, model names, features and both label sets."""

    options: Any  # engine.data.wordnet.WordNetOptions
    versions: list[StoredVersion]
    names: list[str]
    queries: list[np.ndarray]  # per model, (n_q, d)
    gallery: list[np.ndarray]  # per model, (n_g, d)
    query_labels: np.ndarray  # the stored relevance (qrels: gallery positions; class: supersense)
    gallery_labels: np.ndarray
    query_supersense: np.ndarray
    gallery_supersense: np.ndarray
    train: list[np.ndarray] | None  # per model, (n_train, d); None: no train split stored
    train_labels: np.ndarray | None


def metric_names(k: int) -> list[str]:
    """The summary's metrics, in the payload's order (Recall@1 once when k is 1)."""
    names = ["recall@1", f"recall@{k}", f"map@{k}", f"ndcg@{k}", SUPERSENSE, f"neighbour_recall@{k}"]
    return list(dict.fromkeys(names))


def _text_spec(config: dict[str, Any], experiment_id: int) -> str:
    """The stored ``wordnet[:OPTIONS]`` of a text comparison; one line when the experiment is not one."""
    dataset = text_corpus(config.get("spec") or {}) if config.get("source") == "checkpoints" else None
    if dataset is None:
        raise ValueError(f"experiment {experiment_id} is not a text comparison (compare-checkpoints of text models on "
                         f"{' or '.join(TEXT_DATASET_NAMES)}); the text upgrade summary needs one")
    return dataset


def _first_difference(stored: Sequence[str], fresh: Sequence[str]) -> int | None:
    if len(stored) != len(fresh):
        return min(len(stored), len(fresh))
    return next((i for i, (a, b) in enumerate(zip(stored, fresh)) if a != b), None)


def load_text_experiment(db: Engine, experiment_id: int) -> TextExperiment:
    """Read a stored text comparison (see the module docstring); ``ValueError`` with one line when it is not one,
    has fewer than two models, or when WordNet's texts on this machine are not the ones it embedded."""
    config, versions = load_experiment(db, experiment_id)
    dataset = _text_spec(config, experiment_id)
    if len(versions) < 2:
        raise ValueError(f"experiment {experiment_id} holds {len(versions)} text model(s); an upgrade needs two")
    options = parse_options(dataset.partition(":")[2] or None)
    feats: dict[str, list[np.ndarray]] = {"query": [], "gallery": [], "train": []}
    labels: dict[str, np.ndarray] = {}
    texts: dict[str, list[str]] = {}
    names, has_train = [], True
    with session_scope(db) as s:
        for v in versions:
            mv = get_model_version(s, v.id)
            names.append(mv.name or mv.architecture or f"step {v.step}")
            has_train = has_train and VIEW in list_feature_views(s, v.id, "train")
            for split in ("query", "gallery", "train") if has_train else ("query", "gallery"):
                x, y, _ = load_feature_set(s, v.id, split, VIEW)
                if split in labels and not np.array_equal(labels[split], y):
                    raise ValueError(f"the {split} texts of step {v.step} are not the ones of step {versions[0].step} "
                                     "(other labels or another count); the models must embed the same texts")
                labels.setdefault(split, np.asarray(y))
                feats[split].append(np.asarray(x, np.float32))
            for split in ("query", "gallery"):
                refs = load_image_refs(s, v.id, split)
                stored = None if refs is None else refs[0].get("texts")
                if not isinstance(stored, list):
                    raise ValueError(f"experiment {experiment_id}: step {v.step} stored no {split} texts; re-run the "
                                     "comparison to store them")
                stored = [str(stored[i]) for i in np.asarray(refs[1])]
                if texts.setdefault(split, stored) != stored:
                    raise ValueError(f"the {split} texts of step {v.step} differ from those of step {versions[0].step}")
    task = wordnet_task(queries=options.queries, gallery=options.gallery, seed=options.seed)
    q_rel, g_rel = task.relevance_labels(options.task)
    for split, fresh, rel in (("query", task.query_texts, q_rel), ("gallery", task.gallery_texts, g_rel)):
        at = _first_difference(texts[split], fresh)
        if at is None and not np.array_equal(labels[split], rel):
            at = int(np.flatnonzero(labels[split] != rel)[0]) if len(labels[split]) == len(rel) else 0
        if at is not None:
            raise ValueError(f"WordNet changed since experiment {experiment_id} was embedded: {split} text {at} of "
                             f"{dataset} is not the stored one; re-run the comparison on this machine's WordNet")
    widths = sorted({x.shape[1] for x in feats["query"] + feats["gallery"]})
    if len(widths) > 1:
        raise ValueError(f"the models of experiment {experiment_id} embed in different widths {widths}; a new-query / "
                         "old-gallery search needs one space (fit an adapter first)")
    train = feats["train"] if has_train else None
    return TextExperiment(options, versions, names, feats["query"], feats["gallery"], labels["query"],
                          labels["gallery"], task.query_labels, task.gallery_labels, train,
                          labels.get("train") if has_train else None)


@dataclass(frozen=True)
class Cell:
    """One (query model, gallery model) cell: its top-k lists and the per-query outcomes derived from them."""

    top: TopK
    values: dict[str, np.ndarray]  # metric -> (n_q,) float64 (the label-based metrics)


def _cell(q: np.ndarray, g: np.ndarray, exp: TextExperiment, k: int) -> Cell:
    """Top-k of the cell once, then the stored relevance's and the supersense outcomes from the same lists."""
    rows = np.arange(len(g), dtype=np.int64)
    top = stream_topk(q, array_blocks(rows, g), k=k)
    values = dict(label_outcomes(top, exp.query_labels, rows, exp.gallery_labels, ks=tuple(sorted({1, k}))).values)
    values[SUPERSENSE] = label_outcomes(top, exp.query_supersense, rows, exp.gallery_supersense, ks=(1,)).values["recall@1"]
    return Cell(top, values)


def _mean(x: np.ndarray) -> float:
    return float(np.nanmean(x)) if np.isfinite(x).any() else float("nan")


class _Lists:
    """check-upgrade's ranked lists of a cell for the two-way interval, computed when a Recall@k row first needs them."""

    def __init__(self, exp: TextExperiment) -> None:
        self.exp, self.cache = exp, {}

    def __call__(self, t: int, g: int, supersense: bool, at: int) -> TopLists:
        key = (t, g, supersense, at)
        if key not in self.cache:
            e = self.exp
            ql, gl = (e.query_supersense, e.gallery_supersense) if supersense else (e.query_labels, e.gallery_labels)
            self.cache[key] = top_lists(e.queries[t], ql, e.gallery[g], gl, depth=16 + 4 * at)  # check_upgrade's depth
        return self.cache[key]


def _judged(oo: np.ndarray, no: np.ndarray, nn: np.ndarray | None, *, unchanged: bool, resamples: int, level: float,
            seed: int, at: int, lists: tuple[TopLists, TopLists, TopLists] | None) -> dict[str, Any]:
    """new/old vs old/old (and new/new vs old/old when given) as check_upgrade judges them: one seeded draw."""
    others = [no] if nn is None else [no, nn]
    got = paired_intervals(oo, others, seed=cell_seed(seed, 1, 0), resamples=resamples, confidence=level, k=at,
                           base_lists=lists and lists[0], other_lists=lists and list(lists[1: len(others) + 1]),
                           bound_unchanged=[not unchanged, False][: len(others)])
    settings = {"resamples": resamples, "level": level, "seed": seed}
    compat = compare(no, oo, **settings, rule=Rule(0.0, "fail"), bounds=(got[0].lo, got[0].hi))
    better = None if nn is None else compare(nn, oo, **settings, names=BETTER, bounds=(got[1].lo, got[1].hi))
    return {"compat": compat, "better": better, "interval": got[0].interval,  # what was resampled ("unchanged": none)
            "setting": "two-way" if lists else "queries"}  # check_upgrade's interval option


def pair_rows(exp: TextExperiment, cells: dict[tuple[int, int], Cell], old: int, new: int, *, k: int,
              resamples: int, level: float, seed: int, lists: _Lists) -> tuple[list[dict[str, Any]], UpgradeReport]:
    """One row per metric of the pair (old, new), and check_upgrade's Recall@1 report of it (the adapters' settings)."""
    oo_c, no_c, nn_c = cells[(old, old)], cells[(new, old)], cells[(new, new)]
    unchanged = bool(np.array_equal(exp.queries[old], exp.queries[new]) and np.array_equal(exp.gallery[old], exp.gallery[new]))
    rows, report = [], None
    for metric in metric_names(k):
        kind, at = metric_parts(metric)
        if kind == "neighbour_recall":
            ref = nn_c.top
            oo = neighbour_recall(oo_c.top, ref, ks=(at,)).values[metric]
            no = neighbour_recall(no_c.top, ref, ks=(at,)).values[metric]
            got = _judged(oo, no, None, unchanged=unchanged, resamples=resamples, level=level, seed=seed, at=at, lists=None)
            nn = np.ones(len(oo))
        else:
            oo, no, nn = oo_c.values[metric], no_c.values[metric], nn_c.values[metric]
            two_way = None
            if kind in ("recall", "supersense_recall"):  # check_upgrade's default interval for Recall@k: two-way
                sup = kind == "supersense_recall"
                two_way = (lists(old, old, sup, at), lists(new, old, sup, at), lists(new, new, sup, at))
            got = _judged(oo, no, nn, unchanged=unchanged, resamples=resamples, level=level, seed=seed, at=at,
                          lists=two_way)
        c, b = got["compat"], got["better"]
        rows.append({"metric": metric, "old_old": _mean(oo), "new_old": _mean(no), "new_new": _mean(nn),
                     "diff": c.diff, "lo": c.lo, "hi": c.hi, "verdict": c.verdict, "interval": got["interval"],
                     "queries": c.n, "better": None if b is None else b.verdict,
                     "better_diff": None if b is None else b.diff})
        if metric == "recall@1":
            report = UpgradeReport(exp.names[old], exp.names[new], metric, _mean(oo), _mean(no), _mean(nn), len(oo),
                                   int(np.isnan(oo).sum()), len(exp.gallery_labels), c, b, resamples, level, seed, False,
                                   interval=got["setting"])
    return rows, report


@dataclass(frozen=True)
class _Backward:
    """Paper 004's B of a fitted pair seen as a map new -> old, for :func:`engine.upgrade.migration.judge_map`."""

    kind: str
    new_dim: int
    old_dim: int
    pair: Any  # engine.adapters.pair.AdapterPair

    def apply(self, new: np.ndarray) -> np.ndarray:
        return self.pair.apply_backward(new)


def _adapter_row(family: str, kind: str, fitted_on: str, pairs: int, got: UpgradeReport, adapted_queries: np.ndarray,
                 exp: TextExperiment, old: int, new_new_r1: float, k: int, seconds: float) -> dict[str, Any]:
    """One adapter's row: its Recall@1 verdict (check_upgrade's) and its Recall@k, from one top-k of its queries."""
    rows = np.arange(len(exp.gallery[old]), dtype=np.int64)
    top = stream_topk(adapted_queries, array_blocks(rows, exp.gallery[old]), k=k)
    recall = label_outcomes(top, exp.query_labels, rows, exp.gallery_labels, ks=tuple(sorted({1, k}))).values
    c = got.compatibility
    return {"family": family, "kind": kind, "fitted_on": fitted_on, "pairs": pairs,
            "recall@1": _mean(recall["recall@1"]), f"recall@{k}": _mean(recall[f"recall@{k}"]),
            "share_of_new_new": got.new_old / new_new_r1 if new_new_r1 > 0 else None,
            "diff": c.diff, "lo": c.lo, "hi": c.hi, "verdict": c.verdict, "fit_seconds": seconds}


def _train_rows(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """Train rows of supersenses with at least 2 texts (the contrastive loss needs a positive), and how many are left out."""
    classes, counts = np.unique(labels, return_counts=True)
    keep = np.isin(labels, classes[counts >= 2])
    return np.flatnonzero(keep), int((~keep).sum())


def adapter_rows(exp: TextExperiment, old: int, new: int, report: UpgradeReport, *, k: int, seed: int,
                 notes: list[str], train_rows: np.ndarray | None = None) -> list[dict[str, Any]]:
    """The post-hoc adapters (fitted on a seeded share of the gallery) and paper 004's (on the train split's
    ``train_rows``, :func:`_train_rows`; None: none fitted)."""
    o = CellFeatures(exp.queries[old], exp.query_labels, exp.gallery[old], exp.gallery_labels)
    n = CellFeatures(exp.queries[new], exp.query_labels, exp.gallery[new], exp.gallery_labels)
    out = []
    for kind, m, fitted, seconds in fitted_maps(o, n, POSTHOC_KINDS, share=DEFAULT_FIT_SHARE, seed=report.seed):
        out.append(_adapter_row(POSTHOC_FAMILY, kind, f"{len(fitted):,} gallery definitions embedded by both models",
                                len(fitted), judge_map(m, o, n, report), m.apply(n.query), exp, old, report.new_new, k,
                                seconds))
    if train_rows is None:
        return out
    for kind in PAPER_KINDS:
        start = time.perf_counter()
        try:
            pair = fit_adapters(exp.train[old][train_rows], exp.train[new][train_rows], exp.train_labels[train_rows],
                                kind=kind, **PAPER_FIT, seed=seed)
        except ValueError as exc:
            notes.append(f"paper 004 {kind} ({exp.names[old]} -> {exp.names[new]}) not fitted: {exc}")
            continue
        seconds = time.perf_counter() - start
        b = _Backward(kind, pair.new_dim, pair.old_dim, pair)
        adapted = b.apply(n.query)
        out.append(_adapter_row(PAPER_004, kind, f"{len(train_rows):,} training texts (split train, supersense "
                                "labels) embedded by both models", len(train_rows), judge_map(b, o, n, report), adapted,
                                exp, old, report.new_new, k, seconds))
    return out


def pair_decision(report: UpgradeReport, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The pair's one decision (:func:`engine.upgrade.plan.migration_plan`) from its Recall@1 report and its adapters'
    verdicts. Recall@1 decides here: a query's one relevant item is its own synset's definition, so it cannot flatter a
    backfill the way a class label does (and the summary measures no backfill curve, so a better new model that no
    adapter serves reads "re-embed the gallery", the only remedy measured to pass)."""
    adapters = [{"name": adapter_label(r["kind"]),
                 "adapted_old": r["recall@1"], "compatibility": {"diff": r["diff"], "lo": r["lo"], "hi": r["hi"],
                                                                  "verdict": r["verdict"]}} for r in rows]
    plan = migration_plan(report.to_json(), adapters=adapters, rollouts=())
    return {**plan.to_json(), "headline": plan.headline()}


def compute_text_upgrade(db: Engine, experiment_id: int, params: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """The payload of a ``text_upgrade`` analysis (see the module docstring), JSON-ready."""
    k, resamples, level, seed = int(params["k"]), int(params["resamples"]), float(params["level"]), int(params["seed"])
    progress(0.02, "reading the stored texts and embeddings")
    exp = load_text_experiment(db, experiment_id)
    T, n_g = len(exp.versions), len(exp.gallery_labels)
    if k > n_g:
        raise ValueError(f"k = {k} is larger than the gallery ({n_g} definitions)")
    cells: dict[tuple[int, int], Cell] = {}
    lower = [(t, g) for t in range(T) for g in range(t + 1)]
    for i, (t, g) in enumerate(lower):
        progress(0.05 + 0.25 * i / len(lower), f"top-{k} of {exp.names[t]} queries on {exp.names[g]} gallery")
        cells[(t, g)] = _cell(exp.queries[t], exp.gallery[g], exp, k)
    metrics = metric_names(k)
    matrices = {m: [[_mean(cells[(t, g)].values[m]) if g <= t else None for g in range(T)] for t in range(T)]
                for m in metrics if not m.startswith("neighbour_recall")}
    notes = [f"wordnet ({exp.options.task}): {len(exp.query_labels):,} example-sentence queries, {n_g:,} definitions "
             f"in the gallery, seed {exp.options.seed}", NEIGHBOUR_NOTE.format(k=k),
             f"{SUPERSENSE}: a hit when the first definition is of the query's supersense (one of {len(LEXNAMES)})"]
    if exp.options.task == "class":
        notes.append(f"task class: the stored relevance is the supersense, so recall@1 and {SUPERSENSE} coincide")
    lists = _Lists(exp)
    pairs, adapters = [], []
    train_rows = None
    if params.get("adapters", True) and exp.train is not None:  # one set of training rows for every pair
        train_rows, dropped = _train_rows(exp.train_labels)
        if dropped:
            notes.append(f"paper 004: {dropped} training text(s) of supersenses with fewer than 2 training texts left "
                         "out (the contrastive loss needs a same-supersense positive)")
    pair_list = [(a, b) for a in range(T) for b in range(a + 1, T)]
    for i, (old, new) in enumerate(pair_list):
        at = 0.3 + 0.65 * i / len(pair_list)
        progress(at, f"paired verdicts: {exp.names[old]} -> {exp.names[new]}")
        rows, report = pair_rows(exp, cells, old, new, k=k, resamples=resamples, level=level, seed=seed, lists=lists)
        fitted: list[dict[str, Any]] = []
        if params.get("adapters", True):
            progress(at + 0.2 / len(pair_list), f"adapters: {exp.names[old]} -> {exp.names[new]}")
            fitted = adapter_rows(exp, old, new, report, k=k, seed=seed, notes=notes, train_rows=train_rows)
            adapters.append({"old": old, "new": new, "rows": fitted})
        pairs.append({"old": old, "new": new, "rows": rows, "decision": pair_decision(report, fitted)})
    if params.get("adapters", True):
        notes.append(f"post-hoc adapters ({', '.join(POSTHOC_KINDS)}) fitted on a seeded "
                     f"{DEFAULT_FIT_SHARE:.0%} of the gallery's definitions, judged on every query against old/old "
                     "as check-upgrade --plan judges them")
        if exp.train is None:
            notes.append("paper 004 adapters: no train split stored (re-run the comparison with wordnet:train=N); "
                         "only the post-hoc adapters are shown")
    corpus = {"task": exp.options.task, "queries": len(exp.query_labels), "gallery": n_g,
              "train_texts": 0 if exp.train_labels is None else len(exp.train_labels), "seed": exp.options.seed}
    progress(0.97, "done")
    return json_ready({"corpus": corpus, "models": exp.names, "steps": [v.step for v in exp.versions], "k": k,
                       "level": level, "resamples": resamples, "seed": seed, "metrics": metrics, "matrices": matrices,
                       "pairs": pairs, "adapters": adapters, "notes": notes})


__all__ = ["POSTHOC_KINDS", "PAPER_KINDS", "TextExperiment", "compute_text_upgrade", "load_text_experiment",
           "metric_names"]
