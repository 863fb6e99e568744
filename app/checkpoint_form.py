"""The Checkpoints page's form state and checks (Streamlit session state, no torch): the sequence of models
(added, moved, removed), what each model's fields say, and the request built from them
(``engine.checkpoints.request.comparison_spec`` judges it). The page (``app/app_pages/checkpoints.py``) draws it."""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import streamlit as st

from app.queries import db_url
from engine.core.contract import CHECKPOINT_FORMAT
from engine.core.kinds import COMPARED_VIEWS, VIEW_KINDS
from engine.core.vocab import DATASET_NAMES, RUN_PROTOCOLS, TEXT_DATASET_NAMES
from engine.read.requests import (
    ARCH_INPUTS,
    LITE_WEIGHT_PACKAGES,
    TEXT_ARCH,
    TEXT_MODEL_FILES,
    TEXT_UPGRADE as TEXT_UPGRADE_PRESET,
    TORCHSCRIPT_REFUSED,
    WORDNET_TASKS,  # noqa: F401 (the page's choices)
    CheckpointError,
    ModelFolder,
    OutsideRootsError,
    TextModelError,
    check_ceiling,
    check_torch_zip,
    comparison_preset,
    comparison_spec,
    confine,
    human_bytes,
    parse_options,
    parse_size,
    safetensors_metadata,
    server_max_bytes,
    server_trust,
    sniff,
    sqlite_folder,
    torchscript_allowed,
    weights_member,
)

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "ck_"
NO_ARCH = "TorchScript / project checkpoint: no architecture"
SOURCES = ("Server path", "Upload", "Pretrained")
PRETRAINED = tuple(LITE_WEIGHT_PACKAGES)  # efficientnet_lite0, 1, 2
TEXT_PRETRAINED = tuple(TEXT_MODEL_FILES)  # minilm_l3, l6, l6_int8, l6_static: text encoders, compared on a text corpus
UPLOAD_TYPES = ["pt", "pth", "safetensors", "ts", "ptl", "bin", "zip"]
BUILTIN = ("imagefolder", *(name for name in DATASET_NAMES if name != "imagefolder"), *TEXT_DATASET_NAMES)  # a folder first
WORDNET_QUERIES = (200, 500, 1000, 2000, 5000, 10_000)  # example sentences (32,923 synsets have one)
WORDNET_GALLERY = (800, 2000, 4000, 8000, 20_000, 50_000)  # definitions: the queries' own plus others
# The dashboard's "check a text-embedding upgrade" entry: the text-upgrade comparison preset
# (engine.checkpoints.presets) as the form's fields: 3 x 4,500 texts, embedded once per model and corpus (the text cache).
_TEXT_PRESET = comparison_preset(TEXT_UPGRADE_PRESET)
_WORDNET = parse_options(_TEXT_PRESET["dataset"].partition(":")[2])
TEXT_UPGRADE = {"dataset": "wordnet", "wn_task": _WORDNET.task, "wn_queries": _WORDNET.queries,
                "wn_gallery": _WORDNET.gallery, "wn_seed": _WORDNET.seed, "wn_train": _WORDNET.train,
                "protocol": RUN_PROTOCOLS[0], "views": list(_TEXT_PRESET["views"]),
                "metrics": ", ".join(_TEXT_PRESET["metrics"]), "name": _TEXT_PRESET["name"]}
CLOSED, OPEN = RUN_PROTOCOLS
VIEW_HELP = {view: f"{view}: {VIEW_KINDS[view].help}" for view in COMPARED_VIEWS}


def architectures() -> dict[str, dict[str, Any]]:
    """Architecture name -> its preprocessing defaults, by name; then ``text``: a text encoder folder or zip (its
    tokenizer, pooling and normalisation come with it)."""
    archs = {name: {"input_size": a.input_size, "mean": a.mean, "std": a.std} for name, a in sorted(ARCH_INPUTS.items())}
    return {**archs, TEXT_ARCH: {"input_size": None, "mean": None, "std": None}}


# ---------------------------------------------------------------------------------------------- the sequence


def _k(model_id: int, name: str) -> str:
    """The session-state key of a model's field."""
    return f"{PREFIX}{model_id}_{name}"


MODEL_DEFAULTS: dict[str, Any] = {"source": SOURCES[0], "path": "", "pretrained": PRETRAINED[0], "arch": NO_ARCH,
                                  "num_classes": 0, "classes": "", "input_size": 0, "mean": "", "std": "", "label": ""}
FORM_DEFAULTS: dict[str, Any] = {"protocol": CLOSED, "dataset": "imagefolder", "root": "", "query": "",
                                 "gallery_folder": "", "views": list(COMPARED_VIEWS), "gallery": "instance",
                                 "name": "", "metrics": "recall@1, map", "ties": "fail", "max_size": "",
                                 "batch_size": 64, "device": "auto", "wn_task": "qrels", "wn_queries": 500,
                                 "wn_gallery": 2000, "wn_seed": 0, "wn_train": 0}


def _set_fields(values: dict[str, Any]) -> None:
    """Set form fields (a list value copied, so the widget never edits the constant)."""
    for name, value in values.items():
        st.session_state[PREFIX + name] = list(value) if isinstance(value, list) else value


def _defaults(model_ids: list[int]) -> None:
    """Every field's value, also for widgets not shown this run (Streamlit forgets those)."""
    for name, value in FORM_DEFAULTS.items():
        st.session_state.setdefault(PREFIX + name, list(value) if isinstance(value, list) else value)
    for model_id in model_ids:
        for name, value in MODEL_DEFAULTS.items():
            st.session_state.setdefault(_k(model_id, name), value)


def _new_model(source: str = SOURCES[0], pretrained: str | None = None) -> int:
    model_id = st.session_state.get(PREFIX + "next", 0)
    st.session_state[PREFIX + "next"] = model_id + 1
    for name, value in {**MODEL_DEFAULTS, "source": source, "pretrained": pretrained or PRETRAINED[0]}.items():
        st.session_state[_k(model_id, name)] = value
    return model_id


def order() -> list[int]:
    return st.session_state[PREFIX + "order"]


def add_model() -> None:
    order().append(_new_model())


def remove_model(model_id: int) -> None:
    order().remove(model_id)


def move(model_id: int, by: int) -> None:
    ids = order()
    i = ids.index(model_id)
    j = min(max(i + by, 0), len(ids) - 1)
    ids[i], ids[j] = ids[j], ids[i]


def pretrained_sequence() -> None:
    st.session_state[PREFIX + "order"] = [_new_model("Pretrained", name) for name in PRETRAINED]
    if st.session_state.get(PREFIX + "dataset") in TEXT_DATASET_NAMES:  # after the text entry: back to images
        _set_fields({name: FORM_DEFAULTS[name] for name in ("dataset", "views", "metrics", "name", "wn_train")})
    st.session_state.pop(PREFIX + "result", None)


def text_upgrade_sequence() -> None:
    """The text-upgrade preset: MiniLM L3 -> L6 -> L6 int8 on WordNet (qrels), encoder view (:data:`TEXT_UPGRADE`)."""
    st.session_state[PREFIX + "order"] = [_new_model("Pretrained", m["path"].removeprefix("pretrained:"))
                                          for m in _TEXT_PRESET["models"]]
    _set_fields(TEXT_UPGRADE)
    st.session_state.pop(PREFIX + "result", None)


def wordnet_dataset() -> str:
    """The form's WordNet corpus as a dataset text, ``wordnet:task=T,queries=N,gallery=N,seed=S[,train=N]`` (the
    training split only when asked for: without it the text is what it was before the split existed)."""
    s = st.session_state
    train = int(s.get(PREFIX + "wn_train") or 0)
    return (f"wordnet:task={s[PREFIX + 'wn_task']},queries={int(s[PREFIX + 'wn_queries'])},"
            f"gallery={int(s[PREFIX + 'wn_gallery'])},seed={int(s[PREFIX + 'wn_seed'])}"
            + (f",train={train}" if train else ""))


def start_sequence() -> None:
    """On a session's first visit two empty models; every visit: every field's default value."""
    if PREFIX + "order" not in st.session_state:
        st.session_state[PREFIX + "order"] = []
        add_model()
        add_model()
    _defaults(order())


# ---------------------------------------------------------------------------------------------- checks


def safe_filename(name: str) -> str:
    """The last path component of an uploaded file's name, reduced to letters, digits, ``.``, ``_`` and ``-``."""
    base = str(name).replace("\\", "/").rsplit("/", 1)[-1]
    base = re.sub(r"_+(?=\.)", "", re.sub(r"[^A-Za-z0-9._-]+", "_", base)).strip("._-")[-100:]
    return base or "checkpoint"


def upload_dir(url: str) -> Path:
    """Where uploads are kept: beside a SQLite database (with its checkpoints and features; a data root), else in
    the project's ``data/uploads``."""
    return (sqlite_folder(url) or ROOT / "data") / "uploads"


def save_upload(uploaded: Any, folder: Path) -> Path:
    """Write an uploaded checkpoint to ``folder/<sha256 prefix>_<safe name>`` (once per content).

    Each writer fills its own temporary file beside the target and renames it into place, so identical uploads at
    the same moment each succeed and leave one whole file (never a half-written one, never a stray ``.part``).
    """
    data = uploaded.getvalue()
    target = folder / f"{hashlib.sha256(data).hexdigest()[:16]}_{safe_filename(uploaded.name)}"
    if not target.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".part")
        try:
            with os.fdopen(handle, "wb") as f:
                f.write(data)
            os.replace(partial, target)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise
    return target


def class_names(text: str) -> list[str] | None:
    """One name per line, or comma-separated on one line; None when empty."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if len(lines) == 1 and "," in lines[0]:
        lines = [part.strip() for part in lines[0].split(",") if part.strip()]
    return lines or None


def upload_limit_mb() -> int:
    """The upload limit Streamlit enforces (``server.maxUploadSize``, set by ``run_app.py --max-upload-mb``)."""
    return int(st.get_option("server.maxUploadSize"))


def _confined(text: str, what: str) -> tuple[Path | None, str | None]:
    """The path resolved inside the data roots, or None and the one-line problem (it names no folder content)."""
    try:
        return confine(text, what=what), None
    except OutsideRootsError as exc:
        return None, f"{exc}."


def _file_problem(what: str, text: str, arch: str | None, max_bytes: int) -> str | None:
    """Cheap checks on a checkpoint file: inside the data roots, exists, fits the limit, is not TorchScript unless
    allowed, and is given an architecture iff it needs one."""
    path, problem = _confined(text, f"{what}: checkpoint")
    if path is None:
        return problem
    if not path.is_file():
        return f"{what}: {path} {'is not a file' if path.exists() else 'not found on the server'}."
    size = path.stat().st_size
    if size == 0:
        return f"{what}: {path} is empty (0 bytes)."
    if size > max_bytes:
        return (f"{what}: {path} is {human_bytes(size)}, over the {human_bytes(max_bytes)} limit "
                "(raise 'Largest checkpoint' under Advanced, up to the server's limit).")
    try:
        fmt = sniff(path)
    except CheckpointError as exc:
        return f"{what}: {exc}"
    if fmt == "torchscript" and not torchscript_allowed():
        return f"{what}: {path.name} {TORCHSCRIPT_REFUSED}."
    carries = fmt == "torchscript"
    if fmt == "torch" and zipfile.is_zipfile(path):
        try:
            check_torch_zip(path, max_bytes)  # every tensor's shape and strides, before a worker loads it
        except CheckpointError as exc:
            return f"{what}: {exc}"
    if fmt == "safetensors":
        try:
            carries = safetensors_metadata(path, max_bytes).get("format") == CHECKPOINT_FORMAT
        except CheckpointError as exc:
            return f"{what}: {exc}"
    kind = "a TorchScript archive" if fmt == "torchscript" else "a Compatibility Lab checkpoint"
    if carries and arch:
        return f"{what}: {path.name} is {kind}, which carries its own architecture: choose '{NO_ARCH}'."
    if not carries and not arch:
        return f"{what}: {path.name} is a plain state_dict: choose its architecture."
    return None


def _text_model_problem(what: str, text: str, max_bytes: int) -> str | None:
    """Cheap checks on a user's text encoder (a folder or zip): inside the data roots, exists, holds
    ``tokenizer.json`` and its weights within the limit (``engine.data.text_model_files.weights_member``)."""
    path, problem = _confined(text, f"{what}: text model")
    if path is None:
        return problem
    if not path.exists():
        return f"{what}: {path} not found on the server."
    try:
        weights_member(ModelFolder(path, max_bytes=max_bytes))
    except TextModelError as exc:
        return f"{what}: {exc}."
    return None


def model_entry(position: int, model_id: int, max_bytes: int, archs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The spec dict of one model of the form, and the first problem found (None when it looks usable)."""
    s = st.session_state
    what = f"Model {position}"
    source, arch = s[_k(model_id, "source")], s[_k(model_id, "arch")]
    arch = None if arch == NO_ARCH else arch
    label = s[_k(model_id, "label")].strip() or None
    if source == "Pretrained":
        path, arch, label = f"pretrained:{s[_k(model_id, 'pretrained')]}", None, label or s[_k(model_id, "pretrained")]
    elif source == "Upload":
        uploaded = s.get(_k(model_id, "upload"))
        if uploaded is None:
            return {}, f"{what}: choose a checkpoint file to upload (or switch to 'Server path')."
        if uploaded.size > upload_limit_mb() * 1_000_000:
            return {}, (f"{what}: {uploaded.name} is over the {upload_limit_mb()} MB upload limit: copy it to the "
                        "server (inside a data root) and give its path instead.")
        path, label = str(save_upload(uploaded, upload_dir(db_url()))), label or Path(safe_filename(uploaded.name)).stem
    else:
        path = s[_k(model_id, "path")].strip()
        if not path:
            return {}, f"{what}: give the checkpoint's path on the server (or upload it)."
    if arch is not None and arch not in archs:
        return {}, f"{what}: unknown architecture {arch!r}; choose one from the list."
    num_classes = int(s[_k(model_id, "num_classes")]) or None
    classes = class_names(s[_k(model_id, "classes")])
    if classes is not None and num_classes is not None and len(classes) != num_classes:
        return {}, (f"{what}: the class list has {len(classes)} names but {num_classes} classes were declared "
                    "(one name per output, in output order).")
    entry = {"path": path, "arch": arch, "num_classes": num_classes, "classes": classes, "label": label,
             "preprocessing": {"input_size": int(s[_k(model_id, "input_size")]) or None,
                               "mean": s[_k(model_id, "mean")].strip() or None,
                               "std": s[_k(model_id, "std")].strip() or None}}
    if source != "Pretrained":
        problem = (_text_model_problem(what, path, max_bytes) if arch == TEXT_ARCH else
                   _file_problem(what, path, arch, max_bytes))
        if problem:
            return entry, problem
    return entry, None


def _folder_problem(what: str, folder: str) -> str | None:
    if not folder:
        return f"{what}: give the image folder (one sub-folder of images per class)."
    path, problem = _confined(folder, f"{what}: folder")
    if path is None:
        return problem
    if not path.is_dir():
        return f"{what}: folder {folder} not found on the server."
    if not any(p.is_dir() for p in path.iterdir()):
        return f"{what}: {folder} has no class sub-folders (expected FOLDER/<class>/<image>)."
    return None


def build_spec(archs: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """The validated spec (as the job payload carries it), or the problems, each one line."""
    s = st.session_state
    problems: list[str] = []
    try:
        text = s[PREFIX + "max_size"].strip()  # empty: the operator's limit, which the form can only lower
        max_bytes = check_ceiling(parse_size(text)) if text else server_max_bytes()
    except ValueError as exc:
        return None, [f"Largest checkpoint: {exc}."]
    ids = order()
    if not ids:
        return None, ["Add at least one checkpoint (two or more to compare an old and a new model)."]
    models = []
    for position, model_id in enumerate(ids, start=1):
        entry, problem = model_entry(position, model_id, max_bytes, archs)
        models.append(entry)
        if problem:
            problems.append(problem)
    dataset: dict[str, Any] = {}
    if s[PREFIX + "protocol"] == CLOSED:
        name, root = s[PREFIX + "dataset"], s[PREFIX + "root"].strip()
        if name == "imagefolder":
            problem = _folder_problem("Images", root)
            if problem:
                problems.append(problem)
        elif root and name in ("cifar10", "cifar100"):
            problem = _confined(root, "Images: CIFAR root")[1]
            if problem:
                problems.append(problem)
        dataset["dataset"] = f"{name}:{root}" if root and name in ("imagefolder", "cifar10", "cifar100") else name
        if name in TEXT_DATASET_NAMES:
            dataset["dataset"] = wordnet_dataset()
    else:
        for split, key, what in (("query", "query", "Query images"), ("gallery", "gallery_folder", "Gallery images")):
            folder = s[PREFIX + key].strip()
            problem = _folder_problem(what, folder)
            if problem:
                problems.append(problem)
            dataset[f"{split}_dataset"] = f"imagefolder:{folder}"
    if not s[PREFIX + "views"]:
        problems.append("Choose at least one view (encoder, psp or lsp).")
    if problems:
        return None, problems
    spec = {"models": models, **dataset, "views": list(s[PREFIX + "views"]),
            "metrics": [m.strip() for m in s[PREFIX + "metrics"].split(",") if m.strip()],
            "gallery_kind": s[PREFIX + "gallery"], "ties": s[PREFIX + "ties"], "name": s[PREFIX + "name"].strip() or None,
            "max_file_bytes": max_bytes, "batch_size": int(s[PREFIX + "batch_size"]), "device": s[PREFIX + "device"]}
    try:
        return comparison_spec(spec, trust=server_trust()).to_dict(), []
    except ValueError as exc:
        return None, [" ".join(str(exc).split())]
