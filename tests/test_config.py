"""Strict configs: round trips and refusals."""
import tomllib

import pytest

from engine.config import config_from_dict, dump_toml, load_config
from engine.presets import RUN_PRESETS, preset_config


@pytest.mark.parametrize("name", list(RUN_PRESETS))
def test_every_preset_round_trips_through_toml_and_dict(name):
    cfg = preset_config(name)
    assert config_from_dict(tomllib.loads(dump_toml(cfg))) == cfg
    assert config_from_dict(cfg.to_dict()) == cfg


def test_file_round_trip_and_single_method_configs(tmp_path):
    cfg = config_from_dict({"methods": ["bct", "cores"], "method_params": {"bct": {"lam": 0.5}}, "training": {"lr": 1}})
    path = tmp_path / "c.toml"
    path.write_text(dump_toml(cfg))
    assert load_config(path) == cfg and cfg.training.lr == 1.0
    one = cfg.for_method("bct")
    assert one.methods == ("bct",) and one.method_params == {"bct": {"lam": 0.5}}
    assert cfg.for_method("cores").method_params == {}


@pytest.mark.parametrize(
    "data, message",
    [
        ({"epochs": 3}, "unknown config key\\(s\\) epochs in the top level"),
        ({"training": {"epoch": 3}}, "unknown config key\\(s\\) epoch in \\[training\\]; known keys: epochs"),
        ({"training": {"epochs": "3"}}, "training.epochs must be int"),
        ({"training": {"amp": 1}}, "training.amp must be bool"),
        ({"scenario": {"replacement_steps": 2}}, "scenario.replacement_steps must be a list"),
        ({"methods": []}, "at least one method"),
        ({"methods": ["bct"], "method_params": {"cores": {}}}, "method_params given for cores"),
        ({"dataset": 3}, "\\[dataset\\] must be a table"),
    ],
)
def test_bad_configs_are_refused_with_the_key_named(data, message):
    with pytest.raises(ValueError, match=message):
        config_from_dict(data)


def test_bad_toml_file_names_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("name = ")
    with pytest.raises(ValueError, match="bad.toml: not valid TOML"):
        load_config(p)
    with pytest.raises(ValueError, match="config file not found"):
        load_config(tmp_path / "missing.toml")
