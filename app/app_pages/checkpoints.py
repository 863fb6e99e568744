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
"Check a text-embedding upgrade" (the text-upgrade preset, ``app.checkpoint_form.TEXT_UPGRADE``) fills the offline
MiniLM sequence on WordNet, queued as the same ``checkpoints`` job; the worker stores the texts with the features,
and the Feature geometry page shows them where it shows images. Under it, "Text-embedding upgrade results" shows a
stored text comparison's ``text_upgrade`` summary (``app.text_upgrade_view``), queued once when the comparison this
session launched is done.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import streamlit as st
from streamlit.errors import StreamlitAPIException

from app import queries as q
from app.checkpoint_form import (
    BUILTIN,
    CLOSED,
    NO_ARCH,
    OPEN,
    PREFIX,
    PRETRAINED,
    SOURCES,
    TEXT_PRETRAINED,
    UPLOAD_TYPES,
    VIEW_HELP,
    _k,
    add_model,
    architectures,
    build_spec,
    move,
    order,
    pretrained_sequence,
    remove_model,
    WORDNET_GALLERY,
    WORDNET_QUERIES,
    WORDNET_TASKS,
    start_sequence,
    text_upgrade_sequence,
    upload_limit_mb,
)
from app.text_upgrade_view import text_results_exist, text_upgrade_section
from app.widgets import QUEUED_HINT_S, launch as launch_job, plain, queue_caption, status_badge
from engine.core.contract import checkpoints_payload
from engine.core.kinds import TIE_RULES, TIES_HELP
from engine.read.requests import TEXT_ARCH, human_bytes, server_max_bytes, source_name, text_corpus

url = q.db_url()
start_sequence()
TEXT_ENCODER_LABEL = "text encoder (folder or zip: tokenizer.json + safetensors or ONNX)"

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
st.button("Check a text-embedding upgrade: MiniLM L3 → L6 → L6 int8 on WordNet", on_click=text_upgrade_sequence,
          icon=":material/text_fields:", key=PREFIX + "use_text",
          help="The text-upgrade preset: three sentence-embedding models from their PyPI weight packages (nothing is "
               "downloaded), compared on WordNet's example sentences (queries) against its definitions (gallery); "
               "500 queries and 2,000 definitions by default, a few minutes on two CPU cores")
if text_results_exist(url):  # app/text_upgrade_view.py: the stored text_upgrade summary of a text comparison
    with st.expander("Text-embedding upgrade results", expanded=True, icon=":material/fact_check:"):
        text_upgrade_section(url)
        links([("app_pages/compatibility.py", "Compatibility", ":material/grid_on:"),
               ("app_pages/upgrade.py", "Upgrade check", ":material/verified:"),
               ("app_pages/geometry.py", "Feature geometry", ":material/scatter_plot:")])

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
                                 "read from the content; or a text encoder's folder or zip (architecture: text "
                                 "encoder). It must lie inside a data root (./data by default)")
        elif source == "Upload":
            c[0].file_uploader(f"Checkpoint file (up to {upload_limit_mb()} MB)", type=UPLOAD_TYPES,
                               key=_k(model_id, "upload"),
                               help="Larger files: copy them to the server and give the path instead")
        else:
            c[0].selectbox("Pretrained weights", (*PRETRAINED, *TEXT_PRETRAINED), key=_k(model_id, "pretrained"),
                           help="efficientnet_lite*: ImageNet image models; minilm_*: sentence-embedding text models "
                                "(compared on a text corpus: choose WordNet below)")
        c[1].text_input("Name (optional)", key=_k(model_id, "label"), placeholder="the file name",
                        help="How the model is named in the matrices")
        if source == "Pretrained" and st.session_state[_k(model_id, "pretrained")] in TEXT_PRETRAINED:
            static = st.session_state[_k(model_id, "pretrained")] == "minilm_l6_static"
            st.caption("A 384-d sentence encoder: tokenizer, pooling and normalisation come with the weights (no "
                       "classifier head: encoder view only)." + (" A static model: distilled from minilm_l6 by model2vec "
                       "on first use (under a minute; needs `pip install -r requirements-text-static.txt`), then "
                       "thousands of texts a second." if static else ""))
        elif source == "Pretrained":
            st.caption("Architecture, 1000 ImageNet classes and preprocessing come with the weights.")
        else:
            c = st.columns([3, 1])
            arch = c[0].selectbox("Architecture", arch_options, key=_k(model_id, "arch"),
                                  format_func=lambda a: TEXT_ENCODER_LABEL if a == TEXT_ARCH else a,
                                  help="Needed for a plain state_dict; TorchScript archives and Compatibility Lab "
                                       "checkpoints carry their own. A text encoder: a folder or zip with "
                                       "tokenizer.json and model.safetensors + config.json (a BERT) or model.onnx, "
                                       "read as data (sizes checked, no code run)")
            if arch == TEXT_ARCH:
                c[1].caption("No classes: compared on a text corpus (WordNet below), encoder view only.")
                st.caption("Its tokenizer, pooling and normalisation come from the folder (modules.json; mean pooling "
                           "and L2 normalisation when it declares none).")
                continue
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

st.subheader("Images or texts, and views")
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
                                                        "fashion": "Fashion-MNIST (Debian package)",
                                                        "wordnet": "WordNet sentences (text, Debian package)"}.get(d, d))
        if dataset == "imagefolder":
            c[1].text_input("Image folder on the server", key=PREFIX + "root", placeholder="/data/pets",
                            help="One sub-folder of images per class: FOLDER/<class>/<image>")
        elif dataset.startswith("cifar"):
            c[1].text_input("Root folder", key=PREFIX + "root", help="Where the CIFAR files are (nothing is downloaded)")
        elif dataset == "fashion":
            c[1].caption("Fashion-MNIST's test split: 10,000 real 28x28 product photos of 10 classes, from Debian's "
                         "dataset-fashion-mnist (nothing is downloaded).")
        elif dataset == "wordnet":
            c[1].caption("WordNet 3.0 (Debian's wordnet-base): example sentences are the queries, definitions the "
                         "gallery. qrels: a query's one relevant item is its own synset's definition; class: "
                         "definitions of the same supersense (45 of them). For text models only.")
            w = st.columns(4)
            w[0].radio("Task", WORDNET_TASKS, key=PREFIX + "wn_task", horizontal=True)
            w[1].selectbox("Queries (sentences)", WORDNET_QUERIES, key=PREFIX + "wn_queries",
                           format_func=lambda n: f"{n:,}")
            w[2].selectbox("Gallery (definitions)", WORDNET_GALLERY, key=PREFIX + "wn_gallery",
                           format_func=lambda n: f"{n:,}", help="The queries' own definitions plus others drawn at random")
            w[3].number_input("Sample seed", min_value=0, step=1, key=PREFIX + "wn_seed")
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
        c[2].radio("ECC on a tie", TIE_RULES, key=PREFIX + "ties", horizontal=True, help=TIES_HELP)
        c = st.columns(3)
        c[0].text_input("Largest checkpoint", key=PREFIX + "max_size", placeholder=human_bytes(server_max_bytes()),
                        help="e.g. 500MB; empty: the server's limit, which this field can only lower")
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
    if "job_id" in result and text_corpus(spec) is not None:
        st.rerun()  # the results section above was drawn before this launch: redraw it, following the new job

result = st.session_state.get(PREFIX + "result")
if result:
    for problem in result.get("problems", []):
        st.error(plain(problem), icon=":material/error:")
    if "job_id" in result:
        text = text_corpus(result["spec"]) is not None
        st.success(f"Queued job #{result['job_id']}: the worker compares {len(result['spec']['models'])} checkpoints. "
                   + ("When it is done, its summary (verdicts, every metric, adapters) is computed and shown above, "
                      "under **Text-embedding upgrade results**; the matrices and the neighbours are on the "
                      "**Compatibility** and **Feature geometry** pages; **Overview** shows its progress." if text else
                      "When it is done, the results appear in the **Compatibility**, **Feature geometry** and "
                      "**Backfilling** pages; **Overview** shows its progress."), icon=":material/rocket_launch:")
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
        names = " → ".join(source_name(m.get("label"), m.get("path", "?")) for m in models)
        line = f"**#{job['id']}** {plain(names)} — {status_badge(job['status'])} · {q.ago(job['created_at'])}"
        if job["status"] == "queued" and (place := q.queue_places(url).get(job["id"])) is not None:
            line += " · " + queue_caption(place, q.queue_starts_s(url).get(job["id"]))
        if job["status"] == "queued" and (datetime.now(timezone.utc) - job["created_at"]).total_seconds() > QUEUED_HINT_S:
            line += " · still waiting: is the engine worker running? (`python run_app.py` starts it)"
        elif job["status"] == "running":
            line += f" · {100 * job['progress']:.0f}% {plain(job['message'])}"
        elif job["status"] in ("done", "failed") and job["message"]:
            line += f" · {plain(job['message'])}"
        st.markdown(line)


recent_comparisons()
