"""Compare a sequence of text encoders on a text corpus (WordNet): embed the query sentences and the gallery texts
once per model, then the same compatibility matrices as for images (``encoder`` view only).

The corpus is ``wordnet[:OPTIONS]`` (:func:`engine.data.wordnet.parse_options`): queries are example sentences,
the gallery definitions. ``task=qrels`` (the default): a query's one relevant item is its own synset's definition,
given to the metrics as labels (query label = the gallery position of its synset, gallery labels = positions), so
Recall@k is the qrels Recall@k and AP is 1 / rank. ``task=class``: relevant are definitions of the same supersense.
PSP/LSP need a classifier head; text encoders have none, so those views are left out with a note. With ``train=N``
the corpus's training split (two texts per synset, labelled by supersense) is embedded too and stored as split
``train`` (view ``encoder``) for paper 004's adapters (``python -m engine adapt``); the matrices use the queries and
the gallery only.

Each (model, split) is embedded once: the embeddings are kept in the text embedding cache
(:mod:`engine.checkpoints.text_cache`, keyed by the encoder and the exact texts), so a second comparison with the same
model and corpus reads them back (the progress message says "cached"); ``text_cache: false`` in the spec
(``compare-checkpoints --no-cache``) embeds everything and keeps nothing.

Models: the offline MiniLM sequence by name (``pretrained:minilm_l3`` ...), or a user's encoder as ``PATH:text``, a
folder or zip with ``tokenizer.json`` and ``model.safetensors`` + ``config.json`` or ``model.onnx``
(:func:`engine.models.text_encoder.load_text_folder`): read as data, inside the data roots when the request is
confined (``engine.checkpoints.request.model_source``), every member's size checked before it is read.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.checkpoints.comparison import Comparison, embedding_time, model_labels
from engine.checkpoints.request import TEXT_ARCH, ComparisonSpec, ModelSource, parse_dataset
from engine.checkpoints.text_cache import TextEmbeddingCache, cached_encode
from engine.data.folder import check_stop
from engine.data.samples import text_refs
from engine.data.wordnet import parse_options, wordnet_task
from engine.metrics.compatibility import CellFeatures, compatibility_matrices
from engine.metrics.paired import PairedOptions
from engine.data.text_model_files import ModelFolder
from engine.models.device import pick_device
from engine.models.text_encoder import TextEncoder, load_text_folder
from engine.models.text_models import load_text_model

NO_HEAD_NOTE = ("psp/lsp do not apply to text encoders: they compare class outputs and a sentence encoder has no "
                "classifier head; only the encoder view is computed")


@dataclass
class TextModelRecord:
    """What a comparison keeps of a text model (the fields the image path's ``LoadedModel`` gives the store)."""

    path: Path
    kind: str
    architecture: str
    num_outputs: int
    sha256: str
    net: object = None
    pooling: str | None = None  # recorded in the encoder view's fingerprint


def load_text_source(source: ModelSource, *, name: str, max_bytes: int, device: str) -> TextEncoder:
    """The text encoder a model of a spec names: an offline one (``pretrained:minilm_l3``) or ``PATH:text``."""
    if source.pretrained:
        return load_text_model(source.pretrained, max_bytes=max_bytes, device=device)
    return load_text_folder(ModelFolder(source.path, max_bytes=max_bytes), name=name, device=device)


def compare_text(spec: ComparisonSpec, report: Callable[[float, str], None], should_stop: Callable[[], bool] | None):
    """The :class:`engine.checkpoints.comparison.Comparison` of text models on the spec's corpus (nothing stored)."""
    options = parse_options(parse_dataset(spec.dataset)[1])
    report(0.0, "reading WordNet")
    task = wordnet_task(queries=options.queries, gallery=options.gallery, seed=options.seed, train=options.train)
    q_labels, g_labels = task.relevance_labels(options.task)
    labels = model_labels(spec.models)
    device = pick_device(spec.device).type  # "cuda" asked for on a machine without one is refused here
    cache = TextEmbeddingCache() if spec.text_cache else None
    T = len(spec.models)
    texts = {"query": task.query_texts, "gallery": task.gallery_texts}
    if task.train_texts:
        texts["train"] = task.train_texts
    n_texts = sum(map(len, texts.values()))
    records, outputs, timings = [], [], []
    for i, source in enumerate(spec.models):
        report(0.05 + 0.85 * i / T, f"loading {labels[i]} ({i + 1}/{T})")
        encoder = load_text_source(source, name=labels[i], max_bytes=spec.max_file_bytes, device=device)
        done = 0

        def step(n: int, i: int = i, cached: str = "") -> None:
            """``n`` more texts embedded (``cached``: the split whose ``n`` texts were read from the cache)."""
            nonlocal done
            check_stop(should_stop, "text comparison cancelled; nothing was stored")
            done += n
            said = f"{n} {cached} texts cached" if cached else f"{done}/{n_texts} texts"
            report(0.05 + 0.85 * (i + done / n_texts) / T, f"embedding texts with {labels[i]} ({i + 1}/{T}): {said}")

        per_split = {}
        timed = {"items": 0, "seconds": 0.0, "cached": 0}
        try:
            for split, split_texts in texts.items():
                started = time.perf_counter()
                per_split[split], cached = cached_encode(encoder, split_texts, cache=cache,
                                                         batch_size=spec.batch_size, progress=step)
                if cached:
                    timed["cached"] += len(split_texts)
                    step(len(split_texts), cached=split)
                else:
                    timed["items"] += len(split_texts)
                    timed["seconds"] += time.perf_counter() - started
        finally:
            encoder.close()
        timings.append(embedding_time(labels[i], "texts", device=device, **timed))
        outputs.append({split: {"encoder": emb, "logits": np.zeros((len(emb), 0), np.float32),
                                "softmax": np.zeros((len(emb), 0), np.float32)} for split, emb in per_split.items()})
        records.append(TextModelRecord(Path(source.path), "text", source.pretrained or TEXT_ARCH, 0, encoder.sha256,
                                       pooling=encoder.pooling.mode))

    report(0.9, "computing compatibility matrices")
    split_labels = {"query": q_labels, "gallery": g_labels}
    if "train" in texts:
        split_labels["train"] = task.train_labels  # supersenses, whatever the task: what the adapters learn from

    def cell(t: int, k: int) -> CellFeatures:
        return CellFeatures(outputs[t]["query"]["encoder"], q_labels, outputs[k]["gallery"]["encoder"], g_labels)

    results = {"encoder": compatibility_matrices(cell, num_models=T, metrics=spec.metrics, gallery_kind=spec.gallery_kind,
                                                 same_set=False, paired=PairedOptions())}
    classes = task.class_names if options.task == "class" else tuple(task.gallery_ids)
    cmp = Comparison(spec, records, labels, [() for _ in records], outputs, split_labels, classes, False,
                     np.full((T, T), -1, dtype=np.int64), results)
    cmp.notes = [f"wordnet ({options.task}): {len(task.query_texts)} example-sentence queries, "
                 f"{len(task.gallery_texts)} definitions in the gallery, seed {options.seed}"
                 + (f"; a training split of {options.train} other synsets (an example and a definition each, "
                    "labelled by supersense)" if options.train else "")]
    if {"psp", "lsp"} & set(spec.views):
        cmp.notes.append(NO_HEAD_NOTE)
    cmp.refs = {split: text_refs("wordnet", split_texts)  # stored with the features: the dashboard shows texts
                for split, split_texts in texts.items()}  # where it shows images
    cmp.embedding = timings
    return cmp


__all__ = ["NO_HEAD_NOTE", "compare_text", "load_text_source"]
