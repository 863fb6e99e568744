"""Compare a sequence of user checkpoints: load -> embed one image set -> matrices per view -> store.

Protocol (kept simple on purpose):
* ``closed-set`` (``dataset``): one image set is both query and gallery; each query's own image is
  excluded from the gallery by index (``same_set``).
* ``open-set`` (``query_dataset`` + ``gallery_dataset``): two image sets; labels are matched by
  class name (an image folder's sub-folder names), queries whose class the gallery lacks are
  counted as having no positive.
The dataset's classes need not be the models' classes (paper 000, Table 2: ImageNet models
evaluated on CIFAR-100): retrieval is scored with the dataset's labels, the models' class lists only
matter for aligning PSP/LSP outputs (``engine.core.classes``).

Everything is validated and computed first; the result is written in one transaction (a study of
kind ``checkpoints``, one experiment of method ``checkpoints``, a model version per checkpoint,
raw ``encoder``/``logits``/``softmax`` feature sets of query and gallery, a matrix per view and
metric). A failure at any point stores nothing.

Encoder cross-tests between models of different feature sizes are *not comparable* (NaN,
``comparable=False``); the ``psp`` and ``lsp`` views compare such models through their class
outputs.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from engine.core.classes import index_names
from engine.checkpoints.embedding import ImageSource, check_batch_bytes, common_labels, extract, model_batch, probe
from engine.checkpoints.files import LOCAL, Trust
from engine.checkpoints.loading import LoadedModel, load_model
from engine.checkpoints.comparison import Comparison, Progress, embedding_time, model_labels
from engine.checkpoints.request import ComparisonSpec, ModelSource, comparison_spec, is_text_spec
from engine.checkpoints.text_compare import compare_text
from engine.data.folder import check_stop
from engine.core.cell import RAW_VIEWS, apply_recipe, cell_recipe
from engine.metrics.compatibility import CellFeatures, compatibility_matrices
from engine.metrics.paired import PairedOptions
from engine.models.device import pick_device



def _splits(spec: ComparisonSpec, should_stop: Callable[[], bool] | None) -> tuple[dict[str, ImageSource], bool]:
    if spec.dataset is not None:
        source = ImageSource(spec.dataset, should_stop)
        return {"query": source, "gallery": source}, True
    return {"query": ImageSource(spec.query_dataset, should_stop),
            "gallery": ImageSource(spec.gallery_dataset, should_stop)}, False



def _check_alignment(labels: list[str], names: list[tuple[str, ...]], sources: Sequence[ModelSource]) -> np.ndarray:
    T = len(names)
    shared = np.full((T, T), -1, dtype=np.int64)
    for t in range(T):
        for k in range(t + 1):
            n = len(cell_recipe("psp", names[t], names[k]).gallery_columns)  # the classes PSP/LSP compare
            if t == k and n < 2:
                raise ValueError(f"model {t + 1} ({labels[t]}) has {n} output(s): PSP/LSP need at least 2 classes; "
                                 "leave out the psp and lsp views")
            if n < 2:
                unnamed = [f"{labels[i]} has no class list, so its outputs are named 0..{len(names[i]) - 1}"
                           for i in sorted({t, k}) if sources[i].classes is None]
                hint = f" ({'; '.join(unnamed)})" if unnamed else ""
                raise ValueError(
                    f"models {k + 1} ({labels[k]}) and {t + 1} ({labels[t]}) share {n} class(es){hint}: PSP/LSP compare "
                    "class-probability vectors output by output and need at least 2 classes known to both; give each "
                    "model's class list (--classes) or leave out the psp and lsp views")
            shared[t, k] = n
    return shared


def _cells(view: str, cmp_outputs: list[dict[str, dict[str, np.ndarray]]], split_labels: dict[str, np.ndarray],
           names: list[tuple[str, ...]], same_set: bool) -> Callable[[int, int], CellFeatures]:
    """Cells of one view (:func:`engine.core.cell.cell_recipe`): PSP/LSP align model t's outputs to gallery model k's
    classes by name first (see classes.py); every row is evaluated (the dataset's classes need not be the models')."""

    def cell(t: int, k: int) -> CellFeatures:
        recipe = cell_recipe(view, names[t], names[k], same_set=same_set)
        q, ql, _, g, gl = apply_recipe(recipe, cmp_outputs[t]["query"][recipe.raw], split_labels["query"],
                                       cmp_outputs[k]["gallery"][recipe.raw], split_labels["gallery"])
        if not recipe.derived and (q.shape[1] == 0 or g.shape[1] == 0):
            # a model without encoder output: reported as not comparable, the way a size mismatch is
            return CellFeatures(q[:, :0], ql, np.zeros((len(g), 1), np.float32), gl)
        return CellFeatures(q, ql, g, gl)

    return cell


def _notes(cmp: Comparison) -> list[str]:
    notes = []
    dims = [cmp.outputs[i]["gallery"]["encoder"].shape[1] for i in range(len(cmp.models))]
    for i, d in enumerate(dims):
        if d == 0:
            notes.append(f"{cmp.labels[i]} has no encoder output (its TorchScript forward returns logits only and "
                         "exports no embed()): its encoder cells are not comparable")
    if "encoder" in cmp.results:
        T = len(dims)
        differ = [(k, t) for t in range(T) for k in range(t) if dims[t] and dims[k] and dims[t] != dims[k]]
        if differ:
            pairs = ", ".join(f"{cmp.labels[t]} ({dims[t]}-d) vs {cmp.labels[k]} ({dims[k]}-d)" for k, t in differ[:4])
            offer = ("compare them with the psp and lsp views" if {"psp", "lsp"} & set(cmp.results)
                     else "add --view psp or --view lsp to compare them through their class outputs")
            notes.append(f"encoder features of different sizes are not comparable (n/c): {pairs}; {offer}")
    if {"psp", "lsp"} & set(cmp.results):
        T = len(dims)
        for t in range(T):
            for k in range(t):
                if cmp.shared[t, k] < len(cmp.class_names[k]):
                    notes.append(f"psp/lsp: {cmp.labels[t]} knows {cmp.shared[t, k]} of the {len(cmp.class_names[k])} "
                                 f"classes of {cmp.labels[k]}; that cross-test compares the shared classes only")
    return notes


def compare_checkpoints(spec: ComparisonSpec | Mapping[str, Any], *, progress: Progress | None = None,
                        should_stop: Callable[[], bool] | None = None, trust: Trust = LOCAL) -> Comparison:
    """Load and validate every checkpoint, embed the images and compute the matrices; store nothing.

    ``progress(fraction, message)``: 0 while the request, the files, the images and a probe batch per model are
    checked, then after every embedded batch. TorchScript models run in their contained processes, which are stopped
    before this returns.
    """
    spec = comparison_spec(spec, trust=trust)
    report = progress or (lambda f, m: None)
    if is_text_spec(spec):  # text encoders on a text corpus (engine.checkpoints.text_compare)
        return compare_text(spec, report, should_stop)
    report(0.0, "loading checkpoints")
    models: list[LoadedModel] = []
    try:
        for s in spec.models:
            models.append(load_model(s.path, arch=s.arch, num_classes=s.num_classes, max_bytes=spec.max_file_bytes,
                                     trust=s.load_trust(trust)))
        return _compare_loaded(spec, models, report, should_stop)
    finally:
        for model in models:
            if hasattr(model.net, "close"):
                model.net.close()


def _compare_loaded(spec: ComparisonSpec, models: list[LoadedModel], report: Progress,
                    should_stop: Callable[[], bool] | None) -> Comparison:
    labels = model_labels(spec.models)
    splits, same_set = _splits(spec, should_stop)
    sizes = [s.input_size or m.input_size for s, m in zip(spec.models, models)]
    check_batch_bytes(spec.batch_size, sizes)

    def inputs(split: str, i: int, count: int | None = None) -> Iterator[torch.Tensor]:
        """Model i's input batches of one split (``count``: only the first images), made one at a time."""
        total = len(splits[split].images) if count is None else count
        for start in range(0, total, spec.batch_size):
            check_stop(should_stop, "checkpoint comparison cancelled; nothing was stored")
            x = splits[split].batch(slice(start, min(start + spec.batch_size, total)), sizes[i])
            yield model_batch(x, models[i], spec.models[i])

    for i, model in enumerate(models):  # cheap checks on every model before the long extraction
        probe(model, spec.models[i], next(inputs("query", i, count=1)))
    names = [s.classes or index_names(m.num_outputs) for s, m in zip(spec.models, models)]
    T = len(models)
    shared = (_check_alignment(labels, names, spec.models) if {"psp", "lsp"} & set(spec.views)
              else np.full((T, T), -1, dtype=np.int64))

    query_set, gallery_set = splits["query"].images, splits["gallery"].images
    if same_set:
        split_labels = {"query": query_set.labels.numpy(), "gallery": gallery_set.labels.numpy()}
        dataset_classes = gallery_set.class_names
    else:
        q_labels, g_labels, dataset_classes = common_labels(query_set, gallery_set)
        split_labels = {"query": q_labels, "gallery": g_labels}

    device = pick_device(spec.device)
    outputs: list[dict[str, dict[str, np.ndarray]]] = []
    timings: list[dict[str, Any]] = []
    n_images = len(query_set) + (0 if same_set else len(gallery_set))
    for i, model in enumerate(models):
        done = 0

        def counted(split: str) -> Iterator[torch.Tensor]:
            """Model i's batches of one split; progress is reported once each batch has been embedded."""
            nonlocal done
            for x in inputs(split, i):
                yield x
                done += len(x)
                report(0.1 + 0.8 * (i + done / n_images) / T,
                       f"embedding images with {labels[i]} ({i + 1}/{T}): {done}/{n_images} images")

        report(0.1 + 0.8 * i / T, f"embedding images with {labels[i]} ({i + 1}/{T})")
        started = time.perf_counter()
        per_split = {"query": extract(model, counted("query"), device)}
        per_split["gallery"] = per_split["query"] if same_set else extract(model, counted("gallery"), device)
        timings.append(embedding_time(labels[i], "images", n_images, time.perf_counter() - started, device.type))
        outputs.append({split: {v: raw[v] for v in RAW_VIEWS} for split, raw in per_split.items()})

    report(0.9, "computing compatibility matrices")
    results = {view: compatibility_matrices(_cells(view, outputs, split_labels, names, same_set), num_models=T,
                                            metrics=spec.metrics, gallery_kind=spec.gallery_kind, same_set=same_set,
                                            paired=PairedOptions(on_its_own=True))  # check-upgrade's intervals and verdicts per cell
               for view in spec.views}
    cmp = Comparison(spec, models, labels, names, outputs, split_labels, tuple(dataset_classes), same_set, shared, results)
    cmp.notes = _notes(cmp)
    cmp.refs = {split: source.images.refs for split, source in splits.items()}
    cmp.embedding = timings
    return cmp
