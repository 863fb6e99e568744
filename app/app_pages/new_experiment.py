"""New experiment: a form for a RunConfig (presets fill it), validated by engine.core.config, queued as a "run" job."""
from __future__ import annotations

import streamlit as st

from app import forms
from app import queries as q
from app.widgets import launch as launch_job, plain
from engine.core.config import config_from_dict, dump_toml
from engine.core.contract import run_payload
from engine.core.cluster import requested_cluster
from engine.core.presets import absent_methods_note, preset_deviations
from engine.core.vocab import BACKBONE_NAMES, METHOD_NAMES
from engine.read.requests import config_files_problem

url = q.db_url()
def cluster_line() -> str:
    """Where the workers evaluate a run's matrices, in words (a bad setting: its one-line error)."""
    try:
        spec = requested_cluster(None)
    except ValueError as exc:
        return f"nowhere yet: {exc}"
    return "in the worker's process" if spec.in_process else f"on Dask ({spec})"


PREFIX = "ne_"


@st.cache_data(show_spinner=False)
def choices() -> dict[str, list[str]]:
    """Names from the engine's torch-free vocabulary (checked against the registries by tests/test_vocab.py)."""
    return {"methods": sorted(METHOD_NAMES), "backbones": list(BACKBONE_NAMES), "presets": forms.preset_names()}


@st.cache_data(show_spinner=False)
def preset(name: str) -> dict:
    return forms.preset_config(name)


def fill(name: str) -> None:
    """Put a preset in the form; its full config is the base the form's edits are written onto."""
    base = preset(name)
    st.session_state[PREFIX + "base"] = base
    for field, value in forms.config_to_form(base).items():
        st.session_state[PREFIX + field] = value


def on_preset() -> None:
    fill(st.session_state[PREFIX + "preset_choice"])
    st.session_state.pop(PREFIX + "result", None)


st.title("New experiment")
st.caption("Several methods make a *study*: every method runs on the same data, scenario and seed, and the "
           "Compatibility page shows them side by side. The job runs in the engine worker; follow it on Overview.")
with st.spinner("Loading the method registry…"):  # the first visit imports torch
    names = choices()
if PREFIX + "name" not in st.session_state:  # first visit (or widgets forgotten after another page)
    fill(st.session_state.get(PREFIX + "preset_choice", forms.DEMO_PRESET))

chosen = st.selectbox("Preset", names["presets"], key=PREFIX + "preset_choice", on_change=on_preset,
                      help="Fills the form with a named run configuration (engine.core.presets: the demo and the papers' "
                           "setups, each citing its table). Settings the form does not show keep the preset's values: "
                           "see the TOML after Check.")
with st.expander("Where this preset differs from its paper and the paper's released code"):
    st.markdown("\n".join(f"- {line}" for line in preset_deviations(chosen)))

with st.form("new_experiment", border=True):
    st.text_input("Name", key=PREFIX + "name")
    st.multiselect("Methods", names["methods"], key=PREFIX + "methods",
                   help="One experiment per method, grouped in one study")
    st.caption(absent_methods_note())

    st.markdown("**Data and evaluation**")
    c = st.columns(4)
    c[0].selectbox("Dataset", forms.DATASETS, key=PREFIX + "dataset")
    c[1].text_input("Root folder", key=PREFIX + "root", help="Where cifar10/cifar100 or the image folder live")
    c[2].radio("Protocol", forms.PROTOCOLS, key=PREFIX + "protocol", horizontal=True,
               help="closed-set: the test split is query and gallery (own image excluded); "
                    "open-set: evaluation classes never trained on")
    c[3].radio("Gallery", forms.GALLERIES, key=PREFIX + "gallery", horizontal=True,
               help="instance: every gallery image; template: one class-mean template per class")
    c = st.columns(4)
    c[0].radio("Evaluation classes", forms.EVAL_CLASSES, key=PREFIX + "eval_classes", horizontal=True,
               help="all test classes, or only those the gallery model was trained on")
    c[1].text_input("Open-set dataset", key=PREFIX + "open_set_dataset",
                    help="Real data, open-set: e.g. cifar10 (its train split = queries, test split = gallery)")
    c[2].number_input("Open-set classes (shapes)", min_value=1, step=1, key=PREFIX + "open_set_classes")
    c[3].checkbox("Download CIFAR if missing", key=PREFIX + "download")
    st.caption(f"Matrices are evaluated {cluster_line()} (the workers' `$COMPATLAB_DASK_SCHEDULER`, read as "
               "each run starts: `local:N` or `tcp://HOST:PORT` evaluates on Dask; exact, the same matrices; "
               "instance gallery only).")
    with st.expander("Images per class (shapes)"):
        c = st.columns(2)
        c[0].number_input("Training images per class", min_value=1, step=1, key=PREFIX + "train_per_class")
        c[1].number_input("Test images per class", min_value=1, step=1, key=PREFIX + "test_per_class")

    st.markdown("**Scenario**")
    c = st.columns(6)
    c[0].number_input("Initial classes", min_value=1, step=1, key=PREFIX + "initial_classes")
    c[1].number_input("Increment", min_value=1, step=1, key=PREFIX + "increment")
    c[2].number_input("Steps (0 = all classes)", min_value=0, step=1, key=PREFIX + "num_steps")
    c[3].selectbox("Training", forms.TRAINING_MODES, key=PREFIX + "training",
                   help="cumulative: all data seen so far; finetune: new classes + replay memory")
    c[4].number_input("Replay per class", min_value=0, step=1, key=PREFIX + "replay_per_class")
    c[5].text_input("Replacement steps", key=PREFIX + "replacement_steps", help="e.g. '3, 5': a fresh model at these steps")

    st.markdown("**Model and training**")
    c = st.columns(6)
    c[0].selectbox("Architecture", names["backbones"], key=PREFIX + "backbone")
    c[1].number_input("Feature dim (0 = default)", min_value=0, step=1, key=PREFIX + "feature_dim")
    c[2].number_input("Epochs per step", min_value=1, step=1, key=PREFIX + "epochs")
    c[3].number_input("Learning rate", min_value=0.0, step=0.01, format="%.4f", key=PREFIX + "lr")
    c[4].number_input("Batch size", min_value=1, step=1, key=PREFIX + "batch_size")
    c[5].selectbox("Device", forms.DEVICES, key=PREFIX + "device", help="auto: CUDA when present, CPU otherwise")
    with st.expander("Optimiser and schedule"):
        c = st.columns(6)
        c[0].selectbox("Optimiser", forms.OPTIMIZERS, key=PREFIX + "optimizer")
        c[1].number_input("Momentum", min_value=0.0, max_value=1.0, step=0.05, key=PREFIX + "momentum")
        c[2].number_input("Weight decay", min_value=0.0, step=1e-4, format="%.5f", key=PREFIX + "weight_decay")
        c[3].selectbox("LR schedule", forms.SCHEDULES, key=PREFIX + "lr_schedule")
        c[4].text_input("LR milestones (epochs)", key=PREFIX + "lr_milestones")
        c[5].number_input("LR gamma", min_value=0.0, step=0.05, key=PREFIX + "lr_gamma")
        c = st.columns(6)
        c[0].number_input("Seed", min_value=0, step=1, key=PREFIX + "seed")
        c[1].selectbox("Initialisation", forms.INIT_SEEDS, key=PREFIX + "init_seed",
                       help="models trained from scratch: the same initial weights at every step (CoReS, paper 002 "
                            "Tab. 9 'SAME'), or a new seed per step ('RANDOM')")

    c = st.columns([1, 1, 4])
    check = c[0].form_submit_button("Check")
    launch = c[1].form_submit_button("Launch", type="primary", disabled=q.read_only(url) is not None)

values = {field: st.session_state[PREFIX + field] for field in forms.FIELDS}

if check or launch:
    problems = forms.check_form(values)
    cfg = None
    if not problems:
        try:
            cfg = config_from_dict(forms.form_to_config(values, st.session_state[PREFIX + "base"]))
        except ValueError as exc:
            problems.append(str(exc))
    if cfg is not None and (missing := config_files_problem(cfg.to_dict())):
        problems.append(missing)  # what the CLI refuses too (it finds out by loading the data)
    if problems:
        st.session_state[PREFIX + "result"] = {"problems": problems}
    else:
        result = {"toml": dump_toml(cfg), "name": cfg.name}
        try:
            payload = run_payload(cfg.to_dict(), cluster=requested_cluster(None))
        except ValueError as exc:
            payload, result = None, {"problems": [str(exc)]}
        if launch and payload and (job_id := launch_job(url, "run", payload)) is not None:
            result["job_id"] = job_id
        st.session_state[PREFIX + "result"] = result

result = st.session_state.get(PREFIX + "result")
if result:
    if "problems" in result:
        for problem in result["problems"]:
            st.error(plain(problem))
    else:
        if "job_id" in result:
            st.success(f"Queued job #{result['job_id']}: **{plain(result['name'])}**. Follow its progress on Overview.",
                       icon=":material/rocket_launch:")
            st.page_link("app_pages/overview.py", label="Go to Overview", icon=":material/dashboard:")
        else:
            st.success("The config is valid. Launch it, or download it to run from the command line "
                       "(`python -m engine run CONFIG.toml`).")
        st.download_button("Download config (TOML)", result["toml"], file_name=f"{result['name']}.toml",
                           mime="application/toml", on_click="ignore")
        st.code(result["toml"], language="toml")
