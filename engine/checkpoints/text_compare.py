"""Compare a sequence of text encoders on a text corpus (WordNet): embed the query sentences and the gallery texts
once per model, then the same compatibility matrices as for images (``encoder`` view only).

The corpus is ``wordnet[:OPTIONS]`` (:func:`engine.data.wordnet.parse_options`): queries are example sentences,
the gallery definitions. ``task=qrels`` (the default): a query's one relevant item is its own synset's definition,
given to the metrics as labels (query label = the gallery position of its synset, gallery labels = positions), so
Recall@k is the qrels Recall@k and AP is 1 / rank. ``task=class``: relevant are definitions of the same supersense.
PSP/LSP need a classifier head; text encoders have none, so those views are left out with a note.

Models: the offline MiniLM sequence by name (``pretrained:minilm_l3`` ...), or a user's encoder as ``PATH:text``, a
folder or zip with ``tokenizer.json`` and ``model.safetensors`` + ``config.json`` or ``model.onnx``
(:func:`engine.models.text_encoder.load_text_folder`): read as data, inside the data roots when the request is
confined (``engine.checkpoints.request.model_source``), every member's size checked before it is read.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.checkpoints.request import TEXT_ARCH, ComparisonSpec, parse_dataset
from engine.data.folder import check_stop
from engine.data.samples import text_refs
from engine.data.wordnet import parse_options, wordnet_task
from engine.metrics.compatibility import CellFeatures, compatibility_matrices
from engine.metrics.paired import PairedOptions
from engine.data.text_model_files import ModelFolder
from engine.models.device import pick_device
from engine.models.text_encoder import load_text_folder
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


def compare_text(spec: ComparisonSpec, report: Callable[[float, str], None], should_stop: Callable[[], bool] | None):
    """The :class:`engine.checkpoints.compare.Comparison` of text models on the spec's corpus (nothing stored)."""
    from engine.checkpoints.compare import Comparison, model_labels

    options = parse_options(parse_dataset(spec.dataset)[1])
    report(0.0, "reading WordNet")
    task = wordnet_task(queries=options.queries, gallery=options.gallery, seed=options.seed)
    q_labels, g_labels = task.relevance_labels(options.task)
    labels = model_labels(spec.models)
    device = pick_device(spec.device).type  # "cuda" asked for on a machine without one is refused here
    T = len(spec.models)
    n_texts = len(task.query_texts) + len(task.gallery_texts)
    records, outputs = [], []
    for i, source in enumerate(spec.models):
        report(0.05 + 0.85 * i / T, f"loading {labels[i]} ({i + 1}/{T})")
        encoder = (load_text_model(source.pretrained, max_bytes=spec.max_file_bytes, device=device)
                   if source.pretrained else
                   load_text_folder(ModelFolder(source.path, max_bytes=spec.max_file_bytes), name=labels[i],
                                    device=device))
        done = 0

        def step(n: int, i: int = i) -> None:
            nonlocal done
            check_stop(should_stop, "text comparison cancelled; nothing was stored")
            done += n
            report(0.05 + 0.85 * (i + done / n_texts) / T,
                   f"embedding texts with {labels[i]} ({i + 1}/{T}): {done}/{n_texts} texts")

        try:
            per_split = {"query": encoder.encode(task.query_texts, batch_size=spec.batch_size, progress=step),
                         "gallery": encoder.encode(task.gallery_texts, batch_size=spec.batch_size, progress=step)}
        finally:
            encoder.close()
        outputs.append({split: {"encoder": emb, "logits": np.zeros((len(emb), 0), np.float32),
                                "softmax": np.zeros((len(emb), 0), np.float32)} for split, emb in per_split.items()})
        records.append(TextModelRecord(Path(source.path), "text", source.pretrained or TEXT_ARCH, 0, encoder.sha256))

    report(0.9, "computing compatibility matrices")
    split_labels = {"query": q_labels, "gallery": g_labels}

    def cell(t: int, k: int) -> CellFeatures:
        return CellFeatures(outputs[t]["query"]["encoder"], q_labels, outputs[k]["gallery"]["encoder"], g_labels)

    results = {"encoder": compatibility_matrices(cell, num_models=T, metrics=spec.metrics, gallery_kind=spec.gallery_kind,
                                                 same_set=False, paired=PairedOptions())}
    classes = task.class_names if options.task == "class" else tuple(task.gallery_ids)
    cmp = Comparison(spec, records, labels, [() for _ in records], outputs, split_labels, classes, False,
                     np.full((T, T), -1, dtype=np.int64), results)
    cmp.notes = [f"wordnet ({options.task}): {len(task.query_texts)} example-sentence queries, "
                 f"{len(task.gallery_texts)} definitions in the gallery, seed {options.seed}"]
    if {"psp", "lsp"} & set(spec.views):
        cmp.notes.append(NO_HEAD_NOTE)
    cmp.refs = {"query": text_refs("wordnet", task.query_texts),  # stored with the features: the dashboard
                "gallery": text_refs("wordnet", task.gallery_texts)}  # shows texts where it shows images
    return cmp


__all__ = ["NO_HEAD_NOTE", "compare_text"]
