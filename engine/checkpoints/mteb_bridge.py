"""The MTEB bridge (issue 43): MTEB's own retrieval evaluator scores the cross-tests of a sequence of text models.

MTEB v2 tells an encoder which side of a retrieval task it embeds (``prompt_type``: ``query`` or ``document``).
:class:`CrossTestEncoder` embeds the queries with one model and the documents with another, so one MTEB run of a
retrieval task scores a cross-test: the new model's queries searched against the corpus the old model embedded.
:func:`mteb_cross_tests` runs every cell of the compatibility matrix that way (query model ``t`` against corpus model
``k <= t``: self-tests on the diagonal, cross-tests below it) on a local task (:func:`local_retrieval_task`, a folder
in BEIR's layout or an MTEB hub snapshot's, read by ``engine.sources.beir_folder``), and the papers' AC / AA / ACA
are read off the matrix of one of its scores.

Conventions, chosen where MTEB leaves them to the model:
- similarity: cosine (MTEB's ``cos_sim``), what the product's checks use for text models;
- a task that does not say query or document (``prompt_type`` None: STS, classification, clustering) is refused: a
  cross-test needs the two sides told apart;
- MTEB's scores are point estimates, rounded by MTEB to 5 decimals (no interval: ``check-upgrade`` gives one on the
  same vectors); nothing is written to MTEB's result cache (``cache=None``).
Embeddings go through the product's text embedding cache (``engine.checkpoints.text_cache``) keyed by the model and
the exact texts, so the old corpus is embedded once for all the cells that search it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.adapters.posthoc import NEW_TO_OLD, PosthocMap, map_direction
from engine.checkpoints.text_cache import TextEmbeddingCache, cached_encode
from engine.core.kinds import metric_parts
from engine.metrics.summary import average_accuracy, average_compatibility, average_compatibility_accuracy, ecc_pass
from engine.sources.beir_folder import RetrievalFolder

MTEB_KINDS = ("ndcg", "map", "recall", "precision", "mrr")  # the K-cut scores MTEB's retrieval evaluator reports
MTEB_KS = (1, 3, 5, 10, 20, 100, 1000)  # the K it reports them at (AbsTaskRetrieval.k_values)


def mteb_score_key(metric: str) -> str:
    """MTEB's key of a metric in any spelling ``engine.core.kinds.metric_parts`` reads (``nDCG@10``, ``ndcg_cut_10``
    -> ``ndcg_at_10``); ``ValueError`` for one MTEB does not report."""
    parts = metric_parts(metric)
    if parts is None or parts[0] not in MTEB_KINDS or parts[1] not in MTEB_KS:
        raise ValueError(f"MTEB reports {', '.join(k + '@K' for k in MTEB_KINDS)} at K in "
                         f"{', '.join(map(str, MTEB_KS))}; not {metric!r}")
    return f"{parts[0]}_at_{parts[1]}"


class CrossTestEncoder:
    """An MTEB encoder (``mteb.models.EncoderProtocol``) embedding queries with ``queries`` and documents with
    ``corpus`` (``engine.models.text_encoder.TextEncoder`` or any object with ``encode(texts, batch_size=)``, ``name``,
    ``dim``). ``query_map``: a post-hoc adapter applied to the query vectors (new -> old space); ``corpus_map``: a
    corpus transform applied to the documents' (old -> new space). ``cache``: the text embedding cache (None: none)."""

    def __init__(self, queries: Any, corpus: Any, *, cache: TextEmbeddingCache | None = None, batch_size: int = 64,
                 query_map: PosthocMap | None = None, corpus_map: PosthocMap | None = None) -> None:
        dims = []
        for encoder, m, side in ((queries, query_map, "queries"), (corpus, corpus_map, "corpus")):
            if m is not None and int(encoder.dim) != m.new_dim:
                raise ValueError(f"the adapter maps {m.new_dim}-d vectors and {encoder.name} (the {side}) gives "
                                 f"{encoder.dim}-d")
            dims.append(int(encoder.dim) if m is None else m.old_dim)
        if dims[0] != dims[1]:
            raise ValueError(f"{queries.name} gives {dims[0]}-d vectors and {corpus.name} {dims[1]}-d: a "
                             "cross-test searches one space (fit an adapter between them first)")
        self.queries, self.corpus, self.cache, self.batch_size = queries, corpus, cache, batch_size
        self.maps = {"query": query_map, "document": corpus_map}
        adapted = "-adapted" if query_map is not None else ""
        transformed = "-transformed" if corpus_map is not None else ""
        self.mteb_model_meta = _model_meta(f"compatlab/{queries.name}{adapted}-queries--{corpus.name}{transformed}-corpus",
                                           dims[0])

    def encode(self, inputs: Any, *, task_metadata: Any, hf_split: str, hf_subset: str, prompt_type: Any = None,
               **kwargs: Any) -> np.ndarray:
        """(N, dim) float32: the texts of ``inputs`` (MTEB's batches) embedded by the model of their side."""
        from mteb.types import PromptType

        if prompt_type not in (PromptType.query, PromptType.document):
            raise ValueError(f"MTEB asked for embeddings of task {task_metadata.name} ({task_metadata.type}) without "
                             "saying queries or documents; the cross-test runs on retrieval tasks")
        encoder = self.queries if prompt_type == PromptType.query else self.corpus
        texts = [text for batch in inputs for text in batch["text"]]
        vectors, _ = cached_encode(encoder, texts, cache=self.cache, batch_size=self.batch_size)
        mapped = self.maps[str(prompt_type.value)]
        return np.asarray(vectors if mapped is None else mapped.apply(vectors), np.float32)

    def similarity(self, embeddings1: Any, embeddings2: Any) -> Any:
        """Cosine similarity of every pair (MTEB's ``cos_sim``)."""
        from mteb.similarity_functions import cos_sim

        return cos_sim(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> Any:
        """Cosine similarity of each row with its counterpart."""
        from mteb.similarity_functions import pairwise_cos_sim

        return pairwise_cos_sim(embeddings1, embeddings2)


def _model_meta(name: str, dim: int) -> Any:
    """The ``mteb.models.ModelMeta`` MTEB files a result under; nothing in it is looked up on a hub."""
    from mteb.models.model_meta import ModelMeta

    return ModelMeta(loader=None, name=name, revision="local", release_date=None, languages=None, n_parameters=None,
                     memory_usage_mb=None, max_tokens=None, embed_dim=dim, license=None, open_weights=None,
                     public_training_code=None, public_training_data=None, framework=["PyTorch"],
                     similarity_fn_name="cosine", use_instructions=False, training_datasets=None)


def local_retrieval_task(data: RetrievalFolder, *, language: str = "eng-Latn", main_score: str = "ndcg@10") -> Any:
    """An ``mteb.AbsTaskRetrieval`` holding ``data`` (nothing downloaded): one subset ``default``, one split."""
    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
    from mteb.abstasks.task_metadata import TaskMetadata

    metadata = TaskMetadata(
        name=data.name, description=f"the local retrieval task folder {data.name} (split {data.split})",
        reference=None, dataset={"path": f"local/{data.name}", "revision": "local"}, type="Retrieval",
        category="t2t", modalities=["text"], eval_splits=[data.split], eval_langs=[language],
        main_score=mteb_score_key(main_score), date=None, domains=None, task_subtypes=None, license=None,
        annotations_creators=None, dialect=None, sample_creation=None, bibtex_citation="")

    class LocalRetrieval(AbsTaskRetrieval):
        def load_data(self, **kwargs: Any) -> None:
            corpus = {"id": data.corpus_ids, "text": data.corpus_texts}
            if any(data.corpus_titles):
                corpus["title"] = data.corpus_titles
            self.dataset = {"default": {data.split: RetrievalSplitData(
                corpus=Dataset.from_dict(corpus), queries=Dataset.from_dict({"id": data.query_ids,
                                                                             "text": data.query_texts}),
                relevant_docs=data.qrels, top_ranked=None)}}
            self.data_loaded = True

    LocalRetrieval.metadata = metadata
    disable_progress_bar()  # MTEB maps the corpus through datasets, which draws a bar per call on stderr
    return LocalRetrieval()


@dataclass(frozen=True)
class MtebMatrix:
    """MTEB's scores of every cell: ``scores[t][k]`` is the dict MTEB reports for model ``t``'s queries on model
    ``k``'s corpus (None above the diagonal, not run)."""

    labels: list[str]
    task: str
    split: str
    scores: list[list[dict[str, float] | None]]

    def matrix(self, metric: str = "ndcg@10") -> np.ndarray:
        """T x T of one score (NaN above the diagonal)."""
        key = mteb_score_key(metric)
        return np.array([[np.nan if s is None else float(s[key]) for s in row] for row in self.scores])

    def passes(self, metric: str = "ndcg@10") -> np.ndarray:
        """ECC of every cross-test of :meth:`matrix` (``engine.metrics.summary.ecc_pass``: 1 pass, 0 fail, NaN
        elsewhere), on MTEB's point estimates."""
        return ecc_pass(self.matrix(metric))

    def summary(self, metric: str = "ndcg@10") -> dict[str, float]:
        """The papers' AC, AA and ACA of :meth:`matrix` (ECC: a cross-test beats the old model's self-test)."""
        C = self.matrix(metric)
        return {"AC": average_compatibility(C), "AA": average_accuracy(C), "ACA": average_compatibility_accuracy(C)}


def _run(task: Any, model: CrossTestEncoder) -> dict[str, float]:
    """MTEB's scores of ``task`` (its one split) with ``model``; nothing written to MTEB's result cache."""
    import mteb

    result = mteb.evaluate(model, task, cache=None, show_progress_bar=False, overwrite_strategy="always")
    (found,) = result.task_results
    return {key: float(v) for key, v in found.scores[task.metadata.eval_splits[0]][0].items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def mteb_cross_tests(task: Any, encoders: Sequence[Any], labels: Sequence[str], *,
                     cache: TextEmbeddingCache | None = None, batch_size: int = 64,
                     report: Callable[[str], None] | None = None) -> MtebMatrix:
    """Run ``task`` (an MTEB retrieval task) once per cell ``(t, k)``, ``k <= t``: model ``t``'s queries on model
    ``k``'s corpus (``encoders`` oldest first). MTEB's evaluator does the search and the scoring."""
    T = len(encoders)
    scores: list[list[dict[str, float] | None]] = [[None] * T for _ in range(T)]
    for t in range(T):
        for k in range(t + 1):
            if report is not None:
                report(f"MTEB {task.metadata.name}: {labels[t]} queries on the {labels[k]} corpus")
            scores[t][k] = _run(task, CrossTestEncoder(encoders[t], encoders[k], cache=cache, batch_size=batch_size))
    return MtebMatrix(list(labels), task.metadata.name, task.metadata.eval_splits[0], scores)


def adapter_models_check(adapter: PosthocMap, folder: Path, old: Any, new: Any) -> str | None:
    """Refuse (``ValueError``, one line) an adapter whose recorded input model is not the one it would map (the new
    model for a query-side adapter, the old for a corpus transform); a warning when its record cannot tell."""
    from engine.adapters.artifact import load_fingerprints
    from engine.core.fingerprint import MISMATCH, UNKNOWN, Fingerprint, compare

    source = new if map_direction(adapter) == NEW_TO_OLD else old
    spaces = load_fingerprints(folder)
    if spaces is None:
        return f"{folder} records no fingerprint; {source.name} is checked on its dimension alone"
    got = Fingerprint(int(source.dim), sha256=getattr(source, "sha256", "") or None)
    verdict, reason = compare(spaces["input"], got, ignore=("normalisation",))
    if verdict == MISMATCH:
        raise ValueError(f"{source.name} is not the model the adapter in {folder} maps ({reason})")
    return f"{reason}: {source.name} is checked against the adapter on its dimension alone" if verdict == UNKNOWN else None


def mteb_adapted_cell(task: Any, new: Any, old: Any, adapter: PosthocMap, *, cache: TextEmbeddingCache | None = None,
                      batch_size: int = 64) -> dict[str, float]:
    """MTEB's scores of the remedy ``adapter`` makes of the cross-test: a query-side adapter maps ``new``'s queries into
    ``old``'s space (adapted -> old), a corpus transform maps ``old``'s corpus into ``new``'s (new -> transformed)."""
    if map_direction(adapter) == NEW_TO_OLD:
        model = CrossTestEncoder(new, old, query_map=adapter, cache=cache, batch_size=batch_size)
    else:
        model = CrossTestEncoder(new, old, corpus_map=adapter, cache=cache, batch_size=batch_size)
    return _run(task, model)


__all__ = ["CrossTestEncoder", "MTEB_KINDS", "MTEB_KS", "MtebMatrix", "adapter_models_check", "local_retrieval_task",
           "mteb_adapted_cell", "mteb_cross_tests", "mteb_score_key"]
