"""Kinds named once (STYLE.md 14), torch-free: each kind of thing the engine, the CLI and the pages share is a frozen
:class:`Kind` record here with its label and help; implementations register in plain dicts on their own floor, and
nothing else spells a kind's name (``tests/test_kinds_named_once.py``).

- ECC tie rules (:data:`TIES`) and the one comparison :func:`beats`: strict ``>`` (an exact tie fails, the papers'
  rule) or ``>=`` (ties pass); parameters call it ``ties``. Not the rank-tie rules of Recall@k (:data:`RANK_TIES`,
  how a negative that ties the best positive ranks; parameters call it ``rank_ties``; ``tests/test_tie_words.py``).
- metrics (:data:`METRICS`) and their one grammar ``kind[@K]`` (:func:`metric_parts`), with the one bound on K
  (:data:`MAX_K`); which kinds a caller accepts is its own (``engine.core.vocab.parse_metric``, the sources check).
- adapter kinds (:data:`ADAPTERS`): paper 004's trained pairs (``engine.adapters.pair``) and the post-hoc maps fitted
  on paired embeddings (``engine.adapters.posthoc.POSTHOC``), each with its family and the label pages show.
- feature views (:data:`VIEW_KINDS`): the raw outputs stored per model and the PSP/LSP views derived from them, and
  which ones a checkpoint comparison evaluates.
- source kinds (:data:`SOURCES`): where embeddings are read from (``engine.sources.READERS`` holds their readers).
- qrels kinds (:data:`QRELS`): where relevance judgements are read from: file formats and stores
  (``engine.sources.qrels.STORES`` holds the stores' readers).
- analysis kinds (:data:`ANALYSES`): what an ``analysis`` job computes from an experiment's stored features
  (``engine.jobs.analysis.ANALYSIS_RUNS`` holds their computations, ``engine.core.contract`` their parameters).
- job kinds (:data:`JOBS`): the worker's lane and claim priority of each (``engine.jobs.job_handlers.JOB_HANDLERS``
  holds their handlers, ``engine.core.contract`` their payloads and the one-line description of a queued job).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kind:
    """One kind: its name (the key configs, payloads and flags use), its label (as pages and reports show it) and a
    one-line help."""

    name: str
    label: str
    help: str = ""


def _named(*kinds: Kind) -> dict[str, Kind]:
    return {k.name: k for k in kinds}


# ---------------------------------------------------------------------------------------------- ECC tie rules
TIES = _named(Kind("fail", ">", "strict ECC: a cross-test equal to its self-test fails (the papers' rule)"),
              Kind("pass", ">=", "ECC with ties passing: a cross-test equal to its self-test passes"))
TIE_RULES = tuple(TIES)
STRICT = "fail"  # the default tie rule
TIES_HELP = "ECC on a tie: strict > (fail) or >= (pass)"


def check_ties(ties: object) -> str:
    """``ties`` when it names a tie rule of :data:`TIES`; one line otherwise."""
    if ties not in TIES:
        raise ValueError(f"unknown tie rule {ties!r}; use 'fail' (strict >) or 'pass' (>=)")
    return str(ties)


def beats(cross: Any, old: Any, ties: str = STRICT) -> Any:
    """Whether ``cross`` passes ECC against ``old`` under the tie rule ``ties``: ``cross > old`` (``"fail"``) or
    ``cross >= old`` (``"pass"``); numbers or numpy arrays (elementwise; NaN never beats)."""
    return cross >= old if check_ties(ties) == "pass" else cross > old


# ------------------------------------------------------------------------------------------- rank-tie rules
# Recall@k's rule for a negative that ties a query's best positive (engine.metrics.retrieval.RankTies); the near-tie
# readings of a cell (engine.core.vocab.RANK_TIE_READINGS) read it three ways
RANK_TIES = _named(Kind("pessimistic", "pessimistic", "a negative tying the best positive ranks before it: a miss "
                        "(the engine's rule, as stored)"),
                   Kind("optimistic", "optimistic", "a negative tying the best positive ranks after it: a hit"),
                   Kind("trec", "trec", "trec_eval's order: equal scores by item id, descending (string compare); "
                        "top-k lists only, since it needs the ids"))
RANK_TIE_RULES = tuple(RANK_TIES)
DEFAULT_RANK_TIES = "pessimistic"  # the default rank-tie rule (the engine's, as stored; check-upgrade's)
TREC_RANK_TIES = "trec"  # trec_eval's order: the rule that needs each listed item's id
LIST_RANK_TIES = (DEFAULT_RANK_TIES, TREC_RANK_TIES)  # the rules a top-k list's metrics take (engine.metrics.relevance)


def check_rank_ties(rank_ties: object, allowed: tuple[str, ...] = RANK_TIE_RULES) -> str:
    """``rank_ties`` when it names a rank-tie rule of :data:`RANK_TIES` among ``allowed``; one line otherwise."""
    if rank_ties not in RANK_TIES or rank_ties not in allowed:
        raise ValueError(f"unknown rank-tie rule {rank_ties!r}; use one of {', '.join(allowed)}")
    return str(rank_ties)


# ---------------------------------------------------------------------------------------------- metrics
METRICS = _named(
    Kind("recall", "Recall", "share of queries with a relevant item in the top K (Recall@K)"),
    Kind("map", "mAP", "mean average precision over the full ranking, or over the top K (mAP@K: the precisions at "
         "relevant ranks <= K over R, the query's relevant items, as trec_eval's map_cut_K)"),
    Kind("map_capped", "capped mAP", "mAP@K over min(R, K) instead of R (reaches 1 when the top K is all relevant)"),
    Kind("ndcg", "nDCG", "discounted gain of the graded judgements by rank in the top K (BEIR's)"),
    Kind("precision", "P", "share of the top K that is relevant (P@K, trec_eval's P_K)"),
    Kind("mrr", "MRR", "reciprocal rank of the first relevant item in the top K (trec_eval's recip_rank on a run of "
         "depth K)"),
    Kind("neighbour_recall", "neighbour recall", "label-free: the share of the new model's own top K a search returns"),
    Kind("supersense_recall", "supersense Recall", "the top K holds a definition of the sentence's supersense"),
)
MAX_K = 1_000_000  # the K of a metric (recall@K, map@K, ...): a bound keeps it a machine integer
_METRIC = re.compile(r"^([a-z_]+?)(?:@(\d+))?$")
# the IR toolchain's spellings (trec_eval / pytrec_eval ``ndcg_cut_10``, ``P_10``, ``recall_100``, ``map_cut_10``,
# ``recip_rank``; ranx ``ndcg@10``, ``precision@10``, ``mrr@10``; ir-measures ``nDCG@10``, ``P@10``, ``R@100``,
# ``AP@10``, ``RR@10``; MTEB ``ndcg_at_10``, ``map_at_10``, ``mrr_at_10``): a name before an optional ``_cut`` / ``_at``
# and a ``_K`` / ``.K`` suffix, read as ``kind@K``
_TREC_CUT = re.compile(r"^([a-z_]+?)(?:_cut|_at)?[_.](\d+)$")
METRIC_ALIASES = {"p": "precision", "r": "recall", "ap": "map", "rr": "mrr", "recip_rank": "mrr"}


def metric_parts(name: object) -> tuple[str, int | None] | None:
    """``("recall", 10)`` of ``"recall@10"``, ``("map", None)`` of ``"map"`` (case and outer spaces ignored), and of the
    IR toolchain's spellings (:data:`METRIC_ALIASES`: ``ndcg_cut_10`` = ``nDCG@10`` = ``ndcg@10`` = MTEB's
    ``ndcg_at_10``, ``P_10``, ``recall_100``, ``map_cut_10``, ``recip_rank``); None when the name is not a kind of :data:`METRICS` with an
    optional K in ``1..MAX_K``."""
    key = str(name).strip().lower()
    cut = None if "@" in key else _TREC_CUT.match(key)
    m = _METRIC.match(f"{cut.group(1)}@{cut.group(2)}" if cut else key)
    if not m:
        return None
    kind = METRIC_ALIASES.get(m.group(1), m.group(1))
    if kind not in METRICS:
        return None
    k = None if m.group(2) is None else int(m.group(2))
    return None if k is not None and not 1 <= k <= MAX_K else (kind, k)


def canonical_metric(name: str) -> str:
    """A metric name in the engine's one spelling (``"ndcg_cut_10"`` -> ``"ndcg@10"``, ``"recip_rank"`` -> ``"mrr"``);
    a name :func:`metric_parts` does not read comes back stripped and lowered, for its reader to refuse."""
    parts = metric_parts(name)
    if parts is None:
        return str(name).strip().lower()
    return parts[0] if parts[1] is None else f"{parts[0]}@{parts[1]}"


def metric_label(name: str) -> str:
    """``"recall@1"`` -> ``"Recall@1"``, ``"map"`` -> ``"mAP"``, ``"neighbour_recall@10"`` -> ``"neighbour recall@10"``;
    anything else as it is."""
    kind, at, k = name.lower().partition("@")
    return METRICS[kind].label + at + k if kind in METRICS and (at or kind == "map") else name


# ---------------------------------------------------------------------------------------------- views
@dataclass(frozen=True)
class ViewKind(Kind):
    """A feature view: ``raw``, the stored output a derived view is computed from ("" for a stored one), and
    ``compared``: a checkpoint comparison evaluates it (the raw logits and softmax are read only through PSP/LSP)."""

    raw: str = ""
    compared: bool = False


VIEW_KINDS = _named(
    ViewKind("encoder", "encoder", "the feature vectors (models with different feature sizes are not comparable)",
             compared=True),
    ViewKind("logits", "logits", "the classifier's logits, as stored"),
    ViewKind("softmax", "softmax", "the classifier's class probabilities, as stored"),
    ViewKind("psp", "PSP", "class-probability vectors, centred and normalised (compares any two models through shared "
             "classes)", raw="softmax", compared=True),
    ViewKind("lsp", "LSP", "logit vectors, centred and normalised", raw="logits", compared=True),
)
RAW_VIEWS = tuple(k for k, v in VIEW_KINDS.items() if not v.raw)  # what the worker extracts and stores
DERIVED_VIEWS = {k: v.raw for k, v in VIEW_KINDS.items() if v.raw}  # derived view -> the raw output it is computed from
COMPARED_VIEWS = tuple(k for k, v in VIEW_KINDS.items() if v.compared)  # a checkpoint comparison's views


# ---------------------------------------------------------------------------------------------- adapter kinds
PAPER_004, POSTHOC_FAMILY = "paper 004", "post-hoc"


@dataclass(frozen=True)
class AdapterKind(Kind):
    """An adapter kind: its family (:data:`PAPER_004`, trained on stored features by an ``adapters`` job, or
    :data:`POSTHOC_FAMILY`, a map fitted on paired embeddings) and whether it trains paper 004's backward adapter B."""

    family: str = PAPER_004
    backward: bool = False


ADAPTERS = _named(
    AdapterKind("perp", "B⊥ + F", "paper 004: a strictly orthogonal backward adapter B⊥ and a forward F", backward=True),
    AdapterKind("lambda", "B_λ + F", "paper 004: an affine backward adapter B_λ with the λ-orthogonality regulariser, "
                "and a forward F", backward=True),
    AdapterKind("fct", "FCT (F only)", "FCT's forward transformation alone, old -> new (paper 004's baseline)"),
    AdapterKind("procrustes", "procrustes", "the orthogonal map new -> old minimising the squared error (closed form)",
                POSTHOC_FAMILY),
    AdapterKind("affine", "affine", "ridge regression new -> old, with a bias", POSTHOC_FAMILY),
    AdapterKind("cluster", "cluster", "one Procrustes map per k-means cluster of the old vectors", POSTHOC_FAMILY),
    AdapterKind("mlp", "mlp", "a low-rank residual MLP on top of the Procrustes map", POSTHOC_FAMILY),
)
PAPER_ADAPTERS = tuple(k for k, a in ADAPTERS.items() if a.family == PAPER_004)  # what an ``adapters`` job fits
POSTHOC_ADAPTERS = tuple(k for k, a in ADAPTERS.items() if a.family == POSTHOC_FAMILY)


def adapter_label(kind: str) -> str:
    """An adapter kind as pages name it: paper 004's by their formula (``B⊥ + F``), post-hoc ones by their name."""
    return ADAPTERS[kind].label if kind in ADAPTERS else kind


def listed(names: tuple[str, ...] | list[str], last: str = "or") -> str:
    """``"a, b or c"``: names as a sentence lists them."""
    return f"{', '.join(names[:-1])} {last} {names[-1]}" if len(names) > 1 else "".join(names)


# ---------------------------------------------------------------------------------------------- source kinds
# A source text is ``[KIND:]LOCATION[#key=value&...]`` (engine.sources.text); help: the location each kind reads
SOURCES = _named(
    Kind("npz", "NumPy .npz", ".npz (arrays ids, vectors [, labels])"),
    Kind("npy", "NumPy .npy", ".npy ((n, d) vectors; ids = row numbers)"),
    Kind("parquet", "Parquet / Arrow", ".parquet / .arrow (file, folder or fsspec URL)"),
    Kind("lance", "LanceDB", "a LanceDB folder (lance:FOLDER#table=NAME)"),
    Kind("qdrant", "Qdrant", "a Qdrant local folder or server (qdrant:...#collection=NAME)"),
    Kind("sql", "SQL", "a SQLAlchemy URL (sql:...#table=NAME or #query=SELECT ...)"),
)
SOURCE_HELP = (f"A path inside the data roots or a URL: {listed([s.help for s in SOURCES.values()])}. "
               "Columns: #id=...&vector=...&label=...")

# Relevance judgements (engine.sources.qrels): ``[KIND:]LOCATION[#query=COL&item=COL&grade=COL]``, one judgement a row
# (a point's payload for Qdrant); a file's format is told from the file when not named, a store is named or recognised
# as a source is; the stores are source kinds, read for their rows, never their vectors
QRELS = _named(
    Kind("trec", "TREC", "a TREC qrels file ('qid 0 docid grade')"),
    Kind("beir", "BEIR", "a BEIR .tsv / .csv with a header (query-id, corpus-id, score)"),
    Kind("tsv", "delimited", "a .tsv / .csv / .txt read as TREC or BEIR by its first line"),
    Kind("parquet", SOURCES["parquet"].label, "Parquet / Arrow (file, folder or fsspec URL)"),
    Kind("sql", SOURCES["sql"].label, "a SQL table or view (sql:URL#table=NAME)"),
    Kind("lance", SOURCES["lance"].label, "a LanceDB table (lance:FOLDER#table=NAME)"),
    Kind("qdrant", SOURCES["qdrant"].label, "a Qdrant collection with a judgement in each point's payload "
         "(qdrant:FOLDER-or-URL#collection=NAME)"),
)
QRELS_HELP = (f"Judgements query id -> item id -> grade: {listed([k.help for k in QRELS.values()])}. A file's format is "
              "told from it or named (trec:, beir:); ids are kept as text; columns (payload fields) by their usual names "
              "or #query=COL&item=COL&grade=COL; without a grade column every pair listed is relevant")


# ---------------------------------------------------------------------------------------------- analysis kinds
ANALYSES = _named(
    Kind("projection", "feature map", "old and new features in one 2-D map"),
    Kind("backfill", "backfilling curves", "the new model's queries against the old gallery while it is re-embedded"),
    Kind("geometry", "feature geometry", "NC1-NC4, angles, drift, Definition 1 and stationarity over the steps"),
    Kind("upgrade", "upgrade verdict", "the upgrade verdict of step_b over step_a, with its migration plan"),
    Kind("text_upgrade", "text upgrade summary", "every pair of a text comparison's models: matrices, paired verdicts "
         "per metric and adapters"),
)


# ---------------------------------------------------------------------------------------------- job kinds
@dataclass(frozen=True)
class JobKind(Kind):
    """A job kind: its worker lane and claim priority. run_app.py starts a worker that takes every kind and one for the
    short lane only, so a map, a backfilling curve, an upgrade verdict, an adapter fit or a checkpoint comparison never
    waits behind training; a worker takes the queued job of the lowest priority number first, the oldest among
    equals (the short lane's worker takes a map before a comparison of whole image sets, and a free general worker
    any check before a training run)."""

    lane: str = "short"
    priority: int = 0


JOBS = _named(
    JobKind("run", "training run", "train and evaluate an experiment (a config or a named preset)", "main", 2),
    JobKind("analysis", "analysis", "a map, a backfilling curve, an upgrade verdict or a text summary of stored results"),
    JobKind("adapters", "adapter fit", "paper 004's mapping adapters between two stored models"),
    JobKind("checkpoints", "checkpoint comparison", "compare checkpoint files on a dataset", priority=1),
    JobKind("sources_check", "upgrade check on sources", "the upgrade check on embeddings read from sources",
            priority=1),
)
