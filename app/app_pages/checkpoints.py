"""Checkpoints: "here are my old and my new model — are they compatible?" (bring your own checkpoints).

The page builds a comparison spec (``engine.checkpoints.request.comparison_spec``): a sequence of
checkpoints, oldest first, each from a server-side path, an upload or the offline pretrained weights,
with its architecture, classes and preprocessing; one image set (closed-set) or a query and a gallery
set (open-set); the views. It checks what it can without loading a model (paths lie inside the data
roots, files exist, fit the size limit, carry an architecture or are given one, are not TorchScript
unless the operator allowed it, class lists match the declared class count), lets the engine's
validator judge the spec (with the dashboard's trust: ``server_trust()``), and queues a
``checkpoints`` job. The upload limit shown is Streamlit's ``server.maxUploadSize``, which
``run_app.py --max-upload-mb`` sets. The worker loads and embeds;
nothing heavy runs here: the engine modules the page uses are torch-free (``tests/test_app_imports.py``).
"""
from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
import streamlit as st
from streamlit.errors import StreamlitAPIException

from app import queries as q
from app.widgets import QUEUED_HINT_S, launch as launch_job, plain, status_badge
from engine.checkpoints.arch_table import ARCH_INPUTS
from engine.checkpoints.files import (
    TORCHSCRIPT_REFUSED,
    CheckpointError,
    human_bytes,
    parse_size,
    safetensors_metadata,
    server_trust,
    sniff,
)
from engine.checkpoints.pretrained import LITE_WEIGHT_PACKAGES
from engine.checkpoints.request import comparison_spec
from engine.contract import CHECKPOINT_FORMAT, checkpoints_payload
from engine.data.roots import OutsideRootsError, confine, torchscript_allowed

url = q.db_url()
PREFIX = "ck_"
NO_ARCH = "TorchScript / project checkpoint: no architecture"
SOURCES = ("Server path", "Upload", "Pretrained")
PRETRAINED = tuple(LITE_WEIGHT_PACKAGES)  # efficientnet_lite0, 1, 2
UPLOAD_TYPES = ["pt", "pth", "safetensors", "ts", "ptl", "bin", "zip"]
UPLOAD_DIR = ROOT / "data" / "uploads"
BUILTIN = ("imagefolder", "digits", "shapes", "fashion", "cifar10", "cifar100")
CLOSED, OPEN = "closed-set", "open-set"
VIEW_HELP = {"encoder": "encoder: the feature vectors (models with different feature sizes are not comparable)",
             "psp": "psp: class-probability vectors, centred and normalised (compares any two models through shared classes)",
             "lsp": "lsp: logit vectors, centred and normalised"}


def architectures() -> dict[str, dict[str, Any]]:
    """Architecture name -> its preprocessing defaults, by name."""
    return {name: {"input_size": a.input_size, "mean": a.mean, "std": a.std} for name, a in sorted(ARCH_INPUTS.items())}


# ---------------------------------------------------------------------------------------------- the sequence


def _k(model_id: int, name: str) -> str:
    return f"{PREFIX}{model_id}_{name}"


MODEL_DEFAULTS: dict[str, Any] = {"source": SOURCES[0], "path": "", "pretrained": PRETRAINED[0], "arch": NO_ARCH,
                                  "num_classes": 0, "classes": "", "input_size": 0, "mean": "", "std": "", "label": ""}
FORM_DEFAULTS: dict[str, Any] = {"protocol": CLOSED, "dataset": "imagefolder", "root": "", "query": "",
                                 "gallery_folder": "", "views": ["encoder", "psp", "lsp"], "gallery": "instance",
                                 "name": "", "metrics": "recall@1, map", "ties": "fail", "max_size": "2GB",
                                 "batch_size": 64, "device": "auto"}


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
    st.session_state.pop(PREFIX + "result", None)


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


def save_upload(uploaded: Any) -> Path:
    """Write an uploaded checkpoint to ``data/uploads/<sha256 prefix>_<safe name>`` (once per content)."""
    data = uploaded.getvalue()
    target = UPLOAD_DIR / f"{hashlib.sha256(data).hexdigest()[:16]}_{safe_filename(uploaded.name)}"
    if not target.is_file():
        UPLOAD_DIR.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        partial.write_bytes(data)
        partial.replace(target)
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


def _file_problem(what: str, text: str, arch: str | None, max_bytes: int) -> str | None:
    """Cheap checks on a checkpoint file: inside the data roots, exists, fits the limit, is not TorchScript unless
    allowed, and is given an architecture iff it needs one."""
    try:
        path = confine(text, what=f"{what}: checkpoint")
    except OutsideRootsError as exc:
        return f"{exc}."
    if not path.is_file():
        return f"{what}: {path} {'is not a file' if path.exists() else 'not found on the server'}."
    size = path.stat().st_size
    if size == 0:
        return f"{what}: {path} is empty (0 bytes)."
    if size > max_bytes:
        return (f"{what}: {path} is {human_bytes(size)}, over the {human_bytes(max_bytes)} limit "
                "(raise 'Largest checkpoint' under Advanced).")
    try:
        fmt = sniff(path)
    except CheckpointError as exc:
        return f"{what}: {exc}"
    if fmt == "torchscript" and not torchscript_allowed():
        return f"{what}: {path.name} {TORCHSCRIPT_REFUSED}."
    carries = fmt == "torchscript"
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
        path, label = str(save_upload(uploaded)), label or Path(safe_filename(uploaded.name)).stem
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
        problem = _file_problem(what, path, arch, max_bytes)
        if problem:
            return entry, problem
    return entry, None


def _folder_problem(what: str, folder: str) -> str | None:
    if not folder:
        return f"{what}: give the image folder (one sub-folder of images per class)."
    try:
        path = confine(folder, what=f"{what}: folder")
    except OutsideRootsError as exc:
        return f"{exc}."
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
        max_bytes = parse_size(s[PREFIX + "max_size"])
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
            try:
                confine(root, what="Images: CIFAR root")
            except OutsideRootsError as exc:
                problems.append(f"{exc}.")
        dataset["dataset"] = f"{name}:{root}" if root and name in ("imagefolder", "cifar10", "cifar100") else name
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
            "protocol": s[PREFIX + "gallery"], "ties": s[PREFIX + "ties"], "name": s[PREFIX + "name"].strip() or None,
            "max_file_bytes": max_bytes, "batch_size": int(s[PREFIX + "batch_size"]), "device": s[PREFIX + "device"]}
    try:
        return comparison_spec(spec, trust=server_trust()).to_dict(), []
    except ValueError as exc:
        return None, [" ".join(str(exc).split())]


# ---------------------------------------------------------------------------------------------- the page


def links(pages: list[tuple[str, str, str]]) -> None:
    """Links to other pages (``(file, label, icon)``) under the router; a hint when this page runs on its own."""
    columns = st.columns(len(pages) + 1)
    for column, (page, label, icon) in zip(columns, pages):
        try:
            column.page_link(page, label=label, icon=icon)
        except StreamlitAPIException:  # not registered: `streamlit run app/app_pages/checkpoints.py`
            st.caption("Open the dashboard (`streamlit run app/main.py`) to reach these pages.")
            return


st.title("Checkpoints")
st.caption("Are my old and my new model compatible? List the checkpoints **oldest first**, choose the images to "
           "compare them on, and launch: the engine worker loads each model, embeds the images and stores the "
           "compatibility matrices. Nothing is computed in this page.")
archs = architectures()
arch_options = [NO_ARCH, *archs]

st.subheader(f"Models ({len(order())}, oldest first)")
st.button("Try the offline pretrained sequence: EfficientNet-Lite 0 → 1 → 2", on_click=pretrained_sequence,
          icon=":material/auto_awesome:", key=PREFIX + "use_pretrained",
          help="Replaces the models below with three ImageNet models from their PyPI weight packages "
               "(nothing is downloaded)")

ids = order()
for position, model_id in enumerate(ids, start=1):
    with st.container(border=True):
        head = st.columns([7, 1, 1, 1], vertical_alignment="center", gap="small")
        role = " — oldest" if position == 1 else (" — newest" if position == len(ids) and len(ids) > 1 else "")
        head[0].markdown(f"**Model {position}**{role}")
        head[1].button(":material/arrow_upward:", key=_k(model_id, "up"), on_click=move, args=(model_id, -1),
                       disabled=position == 1, help="Move up (earlier in the sequence)", width="stretch")
        head[2].button(":material/arrow_downward:", key=_k(model_id, "down"), on_click=move, args=(model_id, 1),
                       disabled=position == len(ids), help="Move down (later in the sequence)", width="stretch")
        head[3].button(":material/delete:", key=_k(model_id, "remove"), on_click=remove_model, args=(model_id,),
                       help="Remove this model", width="stretch")
        source = st.radio("Checkpoint from", SOURCES, key=_k(model_id, "source"), horizontal=True,
                          help="Server path: a file the worker can read (best for large files). Upload: saved under "
                               "data/uploads/. Pretrained: offline ImageNet weights (1000 classes).")
        c = st.columns([3, 2])
        if source == "Server path":
            c[0].text_input("Path on the server", key=_k(model_id, "path"), placeholder=f"data/models/{'old' if position == 1 else 'new'}_model.pt",
                            help=".pt/.pth (torch.save state_dict), .safetensors or a Compatibility Lab step "
                                 "checkpoint (a TorchScript archive only if the operator allowed it); the format is "
                                 "read from the content. The file must lie inside a data root (./data by default)")
        elif source == "Upload":
            c[0].file_uploader(f"Checkpoint file (up to {upload_limit_mb()} MB)", type=UPLOAD_TYPES,
                               key=_k(model_id, "upload"),
                               help="Larger files: copy them to the server and give the path instead")
        else:
            c[0].selectbox("Pretrained weights", PRETRAINED, key=_k(model_id, "pretrained"))
        c[1].text_input("Name (optional)", key=_k(model_id, "label"), placeholder="the file name",
                        help="How the model is named in the matrices")
        if source == "Pretrained":
            st.caption("Architecture, 1000 ImageNet classes and preprocessing come with the weights.")
        else:
            c = st.columns([3, 1])
            arch = c[0].selectbox("Architecture", arch_options, key=_k(model_id, "arch"),
                                  help="Needed for a plain state_dict; TorchScript archives and Compatibility Lab "
                                       "checkpoints carry their own")
            c[1].number_input("Classes (0 = from the file)", min_value=0, step=1,
                              key=_k(model_id, "num_classes"))
        with st.expander("Class list and preprocessing"):
            st.text_area("Class names, in output order (optional)", key=_k(model_id, "classes"), height=90,
                         placeholder="cat\ndog\nbird   — or —   cat, dog, bird",
                         help="One name per line, or comma-separated. PSP/LSP compare models class by class, so "
                              "give them when the models' classes differ in order or content; without a list, "
                              "output i is class i")
            defaults = archs.get(st.session_state.get(_k(model_id, "arch"), NO_ARCH)) if source != "Pretrained" else None
            if defaults:
                mean = ", ".join(f"{v:g}" for v in defaults["mean"]) if defaults["mean"] else "none"
                size = f"{defaults['input_size']} px" if defaults["input_size"] else "the dataset's size (32 px for a folder)"
                st.caption(f"Defaults for this architecture: {size}, mean {mean}.")
            c = st.columns(3)
            c[0].number_input("Input size in px (0 = default)", min_value=0, step=1, key=_k(model_id, "input_size"))
            c[1].text_input("Normalisation mean", key=_k(model_id, "mean"), placeholder="0.485, 0.456, 0.406",
                            help="One value per channel; empty: the architecture's default (none for TorchScript "
                                 "and project models, which get images in [0, 1])")
            c[2].text_input("Normalisation std", key=_k(model_id, "std"), placeholder="0.229, 0.224, 0.225")

st.button("Add a model", on_click=add_model, icon=":material/add:", key=PREFIX + "add")

st.subheader("Images and views")
with st.container(border=True):
    protocol = st.radio("Protocol", (CLOSED, OPEN), key=PREFIX + "protocol", horizontal=True,
                        format_func=lambda p: {CLOSED: "closed-set: one image set is query and gallery",
                                               OPEN: "open-set: separate query and gallery folders"}[p],
                        help="closed-set: each image queries all the others (its own image excluded). open-set: "
                             "labels are matched by class (sub-folder) name")
    if protocol == CLOSED:
        c = st.columns([1, 3])
        dataset = c[0].selectbox("Images", BUILTIN, key=PREFIX + "dataset",
                                 format_func=lambda d: {"imagefolder": "an image folder", "digits": "digits (built in)",
                                                        "shapes": "shapes (built in)",
                                                        "fashion": "Fashion-MNIST (Debian package)"}.get(d, d))
        if dataset == "imagefolder":
            c[1].text_input("Image folder on the server", key=PREFIX + "root", placeholder="/data/pets",
                            help="One sub-folder of images per class: FOLDER/<class>/<image>")
        elif dataset.startswith("cifar"):
            c[1].text_input("Root folder", key=PREFIX + "root", help="Where the CIFAR files are (nothing is downloaded)")
        elif dataset == "fashion":
            c[1].caption("Fashion-MNIST's test split: 10,000 real 28x28 product photos of 10 classes, from Debian's "
                         "dataset-fashion-mnist (nothing is downloaded).")
        else:
            c[1].caption("Built-in images (test split): a quick check with no data to prepare.")
    else:
        c = st.columns(2)
        c[0].text_input("Query images (folder)", key=PREFIX + "query", placeholder="/data/new_photos",
                        help="One sub-folder of images per class")
        c[1].text_input("Gallery images (folder)", key=PREFIX + "gallery_folder", placeholder="/data/catalogue",
                        help="One sub-folder per class; query classes the gallery lacks count as having no positive")
    c = st.columns([3, 1])
    c[0].multiselect("Views", list(VIEW_HELP), key=PREFIX + "views",
                     help=" · ".join(VIEW_HELP.values()))
    c[1].radio("Gallery", ("instance", "template"), key=PREFIX + "gallery", horizontal=True,
               help="instance: every gallery image; template: one class-mean template per class")
    with st.expander("Advanced"):
        c = st.columns(3)
        c[0].text_input("Experiment name", key=PREFIX + "name", placeholder="checkpoints: old -> new")
        c[1].text_input("Metrics", key=PREFIX + "metrics", help="recall@K, map or map@K, comma-separated")
        c[2].radio("ECC on a tie", ("fail", "pass"), key=PREFIX + "ties", horizontal=True)
        c = st.columns(3)
        c[0].text_input("Largest checkpoint", key=PREFIX + "max_size", help="e.g. 2GB or 500MB")
        c[1].number_input("Batch size", min_value=1, step=1, key=PREFIX + "batch_size")
        c[2].selectbox("Device", ("auto", "cpu", "cuda"), key=PREFIX + "device", help="auto: CUDA when present")

c = st.columns([1, 1, 4])
check = c[0].button("Check", key=PREFIX + "check", width="stretch")
launch = c[1].button("Launch", type="primary", key=PREFIX + "launch", width="stretch", disabled=q.read_only(url) is not None)

if check or launch:
    spec, problems = build_spec(archs)
    result: dict[str, Any] = {"problems": problems} if problems else {"spec": spec}
    if spec is not None and launch and (job_id := launch_job(url, "checkpoints", checkpoints_payload(spec))) is not None:
        result["job_id"] = job_id
    st.session_state[PREFIX + "result"] = result

result = st.session_state.get(PREFIX + "result")
if result:
    for problem in result.get("problems", []):
        st.error(plain(problem), icon=":material/error:")
    if "job_id" in result:
        st.success(f"Queued job #{result['job_id']}: the worker compares {len(result['spec']['models'])} checkpoints. "
                   "When it is done, the results appear in the **Compatibility**, **Feature geometry** and "
                   "**Backfilling** pages; **Overview** shows its progress.", icon=":material/rocket_launch:")
        links([("app_pages/overview.py", "Overview", ":material/dashboard:"),
               ("app_pages/compatibility.py", "Compatibility", ":material/grid_on:"),
               ("app_pages/geometry.py", "Feature geometry", ":material/scatter_plot:"),
               ("app_pages/backfilling.py", "Backfilling", ":material/stacked_line_chart:")])
    elif "spec" in result:
        st.success("The comparison looks valid: the files exist and the spec passes the engine's checks "
                   "(the worker still loads each model and reports what does not fit). Launch it when ready.",
                   icon=":material/check_circle:")
    if "spec" in result:
        with st.expander("Comparison spec (the job's payload)"):
            st.json(result["spec"])


@st.fragment(run_every=2)
def recent_comparisons() -> None:
    """The newest checkpoint comparisons and their state (refreshed every 2 s)."""
    mine = [j for j in q.jobs(url) if j["kind"] == "checkpoints"][:5]
    if not mine:
        return
    st.subheader("Recent comparisons")
    for job in mine:
        models = job["payload"].get("spec", {}).get("models", [])
        names = " → ".join(m.get("label") or Path(m.get("path", "?")).stem for m in models)
        line = f"**#{job['id']}** {plain(names)} — {status_badge(job['status'])} · {q.ago(job['created_at'])}"
        if job["status"] == "queued" and (datetime.now(timezone.utc) - job["created_at"]).total_seconds() > QUEUED_HINT_S:
            line += " · still waiting: is the engine worker running? (`python run_app.py` starts it)"
        elif job["status"] == "running":
            line += f" · {100 * job['progress']:.0f}% {plain(job['message'])}"
        elif job["status"] in ("done", "failed") and job["message"]:
            line += f" · {plain(job['message'])}"
        st.markdown(line)


recent_comparisons()
