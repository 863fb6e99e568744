"""The New-experiment form's data mapping (app.forms): presets round-trip, edits land, checks speak plainly."""
from __future__ import annotations

import pytest

from app import forms
from engine.core.config import config_from_dict


@pytest.mark.parametrize("name", forms.preset_names())
def test_every_preset_round_trips_through_the_form(name):
    config = forms.preset_config(name)
    values = forms.config_to_form(config)
    assert forms.form_to_config(values, config) == config
    assert config_from_dict(config).to_dict() == config


def test_paper_presets_are_runnable_as_far_as_the_form_can_tell():
    for name in forms.preset_names():
        values = forms.config_to_form(forms.preset_config(name))
        assert forms.check_form(values) == [], name


def test_form_edits_are_written_onto_the_preset():
    base = forms.preset_config("quick-demo")
    values = {**forms.config_to_form(base), "methods": ["bct", "dsimplex_hoc"], "num_steps": 0,
              "replacement_steps": "2; 3", "open_set_dataset": "  "}
    config = forms.form_to_config(values, base)
    assert config["scenario"]["num_steps"] is None and config["scenario"]["replacement_steps"] == [2, 3]
    assert config["eval"]["open_set_dataset"] is None
    assert config["method_params"] == {"dsimplex_hoc": {"lam": 0.5}}
    assert config["model"]["width"] == base["model"]["width"]


@pytest.mark.parametrize("changes, message", [
    ({"methods": []}, "at least one method"),
    ({"dataset": "digits", "initial_classes": 4, "increment": 3, "num_steps": 2}, "7 classes"),
    ({"dataset": "digits", "initial_classes": 5, "increment": 5, "num_steps": 2, "replay_per_class": 5},
     "finetune"),  # the engine's scenario check, whatever its exact wording
    ({"num_steps": 1}, "at least 2 steps"),
    ({"protocol": "open-set"}, "needs the closed-set protocol"),
    ({"dataset": "cifar10", "protocol": "open-set", "eval_classes": "all", "initial_classes": 5, "increment": 5,
      "num_steps": 2}, "needs an open-set dataset"),
    ({"lr_milestones": "ten"}, "whole numbers"),
])
def test_check_form_explains_problems(changes, message):
    values = {**forms.config_to_form(forms.preset_config("quick-demo")), **changes}
    assert any(message in p for p in forms.check_form(values)), forms.check_form(values)
