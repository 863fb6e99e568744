"""The New-experiment form as plain data: presets -> form values -> config dict, and early checks.

No Streamlit here, so the mapping is testable on its own. A preset is a full RunConfig dict from the
torch-free ``engine.core.presets.RUN_PRESETS`` (the demo and every paper preset, the same list the CLI offers).
The form edits a subset of the fields; :func:`form_to_config` writes the edits onto the preset's dict, so
fields the form does not show (backbone width, d-Simplex K, max_per_class, metrics, views...) keep the
preset's values. ``engine.core.config.config_from_dict`` stays the judge of a config; :func:`check_form` adds the
engine's own scenario check before anything is queued.
"""
from __future__ import annotations

import copy
from typing import Any

from engine.core.vocab import DATASET_CLASSES
from engine.core.vocab import DSIMPLEX_METHODS
from engine.core.vocab import DATASET_NAMES as DATASETS  # noqa: F401 (the form's choices: pages read forms.NAME)
from engine.core.vocab import DEVICE_CHOICES as DEVICES  # noqa: F401 (the form's choices: pages read forms.NAME)
from engine.core.vocab import EVAL_CLASSES, INIT_SEEDS, OPTIMIZERS, TRAINING_MODES  # noqa: F401 (the form's choices: pages read forms.NAME)
from engine.core.vocab import GALLERY_KINDS as GALLERIES  # noqa: F401 (the form's choices: pages read forms.NAME)
from engine.core.vocab import LR_SCHEDULES as SCHEDULES  # noqa: F401 (the form's choices: pages read forms.NAME)
from engine.core.vocab import RUN_PROTOCOLS as PROTOCOLS  # noqa: F401 (the form's choices: pages read forms.NAME)

DEMO_PRESET = "quick-demo"

# (section, key) of every form field; "name", "methods", "seed", "device" are top-level keys
FIELDS: dict[str, tuple[str | None, str]] = {
    "name": (None, "name"), "methods": (None, "methods"), "seed": (None, "seed"), "device": (None, "device"),
    "dataset": ("dataset", "name"), "root": ("dataset", "root"), "train_per_class": ("dataset", "train_per_class"),
    "test_per_class": ("dataset", "test_per_class"), "download": ("dataset", "download"),
    "protocol": ("eval", "protocol"), "eval_classes": ("eval", "eval_classes"), "gallery": ("eval", "gallery"),
    "open_set_dataset": ("eval", "open_set_dataset"), "open_set_classes": ("eval", "open_set_classes"),
    "initial_classes": ("scenario", "initial_classes"), "increment": ("scenario", "increment"),
    "num_steps": ("scenario", "num_steps"), "training": ("scenario", "training"),
    "replay_per_class": ("scenario", "replay_per_class"), "replacement_steps": ("scenario", "replacement_steps"),
    "backbone": ("model", "backbone"), "feature_dim": ("model", "feature_dim"), "init_seed": ("model", "init_seed"),
    "epochs": ("training", "epochs"), "lr": ("training", "lr"), "batch_size": ("training", "batch_size"),
    "optimizer": ("training", "optimizer"), "momentum": ("training", "momentum"),
    "weight_decay": ("training", "weight_decay"), "lr_schedule": ("training", "lr_schedule"),
    "lr_milestones": ("training", "lr_milestones"), "lr_gamma": ("training", "lr_gamma"),
}
_LISTS = ("replacement_steps", "lr_milestones")  # shown as "2, 4" text
_ZERO_IS_NONE = ("num_steps", "feature_dim")  # 0 in the form = None (auto) in the config
_EMPTY_IS_NONE = ("open_set_dataset",)

def preset_names() -> list[str]:
    """Every run preset of ``engine.core.presets`` (quick-demo first), as the CLI's ``presets`` lists them."""
    from engine.core.presets import RUN_PRESETS

    return list(RUN_PRESETS)


def preset_config(name: str) -> dict[str, Any]:
    """The full RunConfig dict of a preset (validated)."""
    from engine.core.presets import RUN_PRESETS
    from engine.core.presets import preset_config as run_preset
    from engine.read.requests import fashion_available

    if name not in RUN_PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(preset_names())}")
    return run_preset(name, fashion_present=fashion_available).to_dict()


def config_to_form(config: dict[str, Any]) -> dict[str, Any]:
    """The form's values for a RunConfig dict."""
    values = {}
    for field, (section, key) in FIELDS.items():
        value = config[key] if section is None else config[section][key]
        if field in _LISTS:
            value = ", ".join(str(v) for v in value)
        elif field in _ZERO_IS_NONE:
            value = value or 0
        elif field in _EMPTY_IS_NONE:
            value = value or ""
        elif field == "methods":
            value = list(value)
        values[field] = value
    return values


def _int_list(text: str, what: str) -> list[int]:
    parts = [p.strip() for p in str(text).replace(";", ",").split(",") if p.strip()]
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"{what} must be whole numbers separated by commas, e.g. '2, 4'; got {text!r}") from None


def form_to_config(values: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """``base`` (the preset's RunConfig dict) with the form's values written over it.

    Method hyper-parameters of the preset are kept for the methods still chosen, and its d-Simplex scaling while
    one of them has a d-Simplex head (else the row default, the only one the config accepts then); its further
    evaluation conventions (``eval.also_eval_classes``) less the one the form chose and ``seen`` under open set.
    """
    config = copy.deepcopy(base)
    for field, (section, key) in FIELDS.items():
        value = values[field]
        if field in _LISTS:
            value = _int_list(value, field.replace("_", " "))
        elif field in _ZERO_IS_NONE:
            value = int(value) or None
        elif field in _EMPTY_IS_NONE:
            value = str(value).strip() or None
        elif field == "methods":
            value = list(value)
        elif isinstance(value, str):
            value = value.strip()
        if section is None:
            config[key] = value
        else:
            config[section][key] = value
    config["name"] = config["name"] or "experiment"
    config["method_params"] = {m: p for m, p in base.get("method_params", {}).items() if m in config["methods"]}
    if "model" in config and not set(config["methods"]) & set(DSIMPLEX_METHODS):
        config["model"]["dsimplex_normalization"] = "row"
    ev = config.get("eval", {})
    if ev.get("also_eval_classes"):  # the preset's further conventions, less the one chosen and one the protocol refuses
        ev["also_eval_classes"] = [c for c in ev["also_eval_classes"] if c != ev["eval_classes"]
                                   and not (c == "seen" and ev["protocol"] == "open-set")]
    return config


def _scenario_problem(v: dict[str, Any]) -> str | None:
    """The engine's own scenario check (``build_scenario``) on the class count the dataset will have."""
    from engine.read.requests import build_scenario

    first, step, steps = int(v["initial_classes"]), int(v["increment"]), int(v["num_steps"]) or None
    n = DATASET_CLASSES.get(v["dataset"])
    if n is None:  # shapes generates the classes the scenario uses; a folder's classes are known once loaded
        if steps is None:
            return "shapes needs a number of steps (it generates the classes the scenario uses)." \
                if v["dataset"] == "shapes" else None
        n = first + step * (steps - 1)
    try:
        replaced = _int_list(v["replacement_steps"], "replacement steps")
    except ValueError:
        replaced = []  # reported by check_form
    try:
        build_scenario(num_classes=n, initial_classes=first, increment=step, num_steps=steps, training=v["training"],
                       replay_per_class=int(v["replay_per_class"]), replacement_steps=replaced)
    except ValueError as exc:
        return f"Scenario on {v['dataset']} ({n} classes): {exc}"
    return None


def check_form(values: dict[str, Any]) -> list[str]:
    """Problems a person can fix before queueing (each a sentence); empty when the form looks runnable."""
    v = values
    problems = []
    if not v["methods"]:
        problems.append("Choose at least one method.")
    if v["dataset"] == "imagefolder" and not str(v["root"]).strip():
        problems.append("imagefolder needs a root folder (with one sub-folder per class, or train/ and test/).")
    scenario = _scenario_problem(v)
    if scenario:
        problems.append(scenario)
    steps = int(v["num_steps"])
    if steps == 1:
        problems.append("Compatibility needs at least 2 steps (an old and a new model).")
    if v["eval_classes"] == "seen" and v["protocol"] == "open-set":
        problems.append("eval_classes 'seen' needs the closed-set protocol: open-set classes are never trained on.")
    if v["protocol"] == "open-set" and v["dataset"] != "shapes" and not str(v["open_set_dataset"]).strip():
        problems.append(f"open-set evaluation on {v['dataset']} needs an open-set dataset (e.g. 'cifar10').")
    for what in _LISTS:
        try:
            _int_list(v[what], what.replace("_", " "))
        except ValueError as exc:
            problems.append(str(exc))
    return problems
