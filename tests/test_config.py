"""Strict configs: round trips and refusals."""
import tomllib

import pytest

from engine.core.config import config_from_dict, dump_toml, load_config
from engine.core.presets import RUN_PRESETS, preset_config


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


DIGITS = {"dataset": {"name": "digits"}, "scenario": {"initial_classes": 5, "increment": 5}}


def _digits(**sections):
    """DIGITS with each section's keys updated (a hand-checked valid base: 5 + 5 of digits' 10 classes, 2 steps)."""
    data = {k: dict(v) for k, v in DIGITS.items()}
    for section, keys in sections.items():
        if isinstance(keys, dict):
            data.setdefault(section, {}).update(keys)
        else:
            data[section] = keys
    return data


@pytest.mark.parametrize(
    "data, message",
    [
        # method hyper-parameter values, checked against engine.core.vocab.METHOD_PARAMS
        ({"methods": ["dsimplex_hoc"], "method_params": {"dsimplex_hoc": {"negatives": "x"}}},
         r"config key method_params.dsimplex_hoc.negatives must be one of \('paper', 'repo'\), got 'x'"),
        ({"methods": ["bct"], "method_params": {"bct": {"lam": "x"}}},
         r"config key method_params.bct.lam must be a finite number \(a number in \[0, 1e\+06\]\), got 'x'"),
        ({"methods": ["psp"], "method_params": {"psp": {"extraction_temperature": "hot"}}},
         r"method_params.psp.extraction_temperature must be one of \('none', 'training'\), got 'hot'"),
        ({"methods": ["dsimplex_hoc"], "method_params": {"dsimplex_hoc": {"lam": 1.5}}},
         r"method_params.dsimplex_hoc.lam must be at most 1 \(a number in \[0, 1\]\), got 1.5"),
        ({"methods": ["er"], "method_params": {"er": {"finetune_lr": 0}}},
         r"method_params.er.finetune_lr must be greater than 0 \(a number in \(0, 1e\+06\] or none\), got 0"),
        ({"methods": ["er"], "method_params": {"er": {"balanced_replay": 1}}},
         "method_params.er.balanced_replay must be true or false, got 1"),
        ({"methods": ["bct"], "method_params": {"bct": {"lam": True}}}, "method_params.bct.lam must be a finite number"),
        # counts, lists and single keys (RULES)
        ({"seeds": [1, 2, 1]}, "seeds = \\[1, 2, 1\\] lists a seed twice"),
        ({"eval": {"topk": 0}}, "eval.topk must be a finite number in \\[1, inf\\), got 0"),
        ({"eval": {"topk": 6}, "scenario": {"initial_classes": 5}},
         "eval.topk = 6 exceeds the 5 outputs the first model's PSP/LSP keep"),
        ({"eval": {"metrics": ["recall"]}}, "eval.metrics is not valid: unknown metric 'recall'"),
        ({"eval": {"metrics": ["map", "map"]}}, "eval.metrics = \\['map', 'map'\\] lists an entry twice"),
        ({"training": {"epochs": 0}}, "training.epochs must be a finite number in \\[1, 100000\\], got 0"),
        ({"dataset": {"train_per_class": -1}}, "dataset.train_per_class must be a finite number in \\[1, 100000\\]"),
        ({"scenario": {"replacement_steps": [1]}}, "scenario.replacement_steps must be a finite number in \\[2, inf\\)"),
        # keys that only apply to another choice
        ({"dataset": {"name": "imagefolder"}}, "dataset.root must name the image folder for dataset imagefolder"),
        (_digits(dataset={"num_classes": 10}), "dataset.num_classes applies only to dataset shapes; 'digits' would ignore it"),
        (_digits(dataset={"image_size": 64}), "dataset.image_size applies only to dataset imagefolder"),
        (_digits(eval={"open_set_dataset": "cifar10"}),
         "eval.open_set_dataset = 'cifar10' applies only to eval.protocol = 'open-set', got 'closed-set'"),
        ({"training": {"lr_milestones": [5]}}, "lr_milestones = \\[5\\] applies only to lr_schedule = 'step', got 'cosine'"),
        ({"training": {"lr_schedule": "step"}}, "lr_schedule = 'step' needs training.lr_milestones"),
        (_digits(scenario={"replay_per_class": 5}),
         "scenario.replay_per_class = 5 applies only to scenario.training = 'finetune', got 'cumulative'"),
        # the scenario against a dataset whose class count is fixed (digits 10, cifar100 100) or given (shapes)
        (_digits(scenario={"initial_classes": 4, "increment": 4}),
         "\\[scenario\\] does not fit the 10 classes of dataset digits: 10 classes cannot be split into an initial 4"),
        (_digits(scenario={"num_steps": 3}),
         "does not fit the 10 classes of dataset digits: num_steps=3 does not fit: 5 initial classes \\+ 2 x 5 = 15"),
        (_digits(scenario={"initial_classes": 20}), "initial_classes=20 is more than the 10 classes available"),
        ({"dataset": {"name": "cifar100"}, "scenario": {"initial_classes": 50, "increment": 0}},
         "100 classes of dataset cifar100: increment must be at least 1 to add the 50 classes"),
        ({"dataset": {"name": "shapes", "num_classes": 6}, "scenario": {"initial_classes": 4, "increment": 4}},
         "does not fit the 6 classes of dataset shapes"),
        (_digits(model={"dsimplex_classes": 5}), "model.dsimplex_classes = 5 is smaller than the 10 classes of dataset digits"),
        # replacement steps: listed once, inside the scenario's steps when the config tells them
        ({"scenario": {"replacement_steps": [3, 3]}}, "replacement_steps = \\[3, 3\\]: replacement_steps lists a step more than once"),
        (_digits(scenario={"replacement_steps": [3]}),
         "replacement_steps = \\[3\\]: replacement steps \\[3\\] are outside this scenario's steps; choose steps in 2..2"),
        ({"scenario": {"num_steps": 4, "replacement_steps": [5]}}, "choose steps in 2..4"),
    ],
)
def test_bad_values_are_refused_in_one_line_naming_the_key(data, message):
    with pytest.raises(ValueError, match=message) as info:
        config_from_dict(data)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "data",
    [
        DIGITS,
        _digits(scenario={"training": "finetune", "replay_per_class": 5, "replacement_steps": [2]}),
        _digits(training={"lr_schedule": "step", "lr_milestones": [3, 6]}, model={"dsimplex_classes": 10}),
        {"dataset": {"name": "imagefolder", "root": "data", "image_size": 64}},
        {"dataset": {"name": "shapes"}, "scenario": {"num_steps": 3, "replacement_steps": [3]}},
        {"methods": ["er"], "method_params": {"er": {"finetune_lr": None, "balanced_replay": False}}},
        {"methods": ["dsimplex_hoc"], "method_params": {"dsimplex_hoc": {"lam": 1, "rho": 5, "negatives": "paper"}}},
    ],
)
def test_the_edges_of_the_rules_are_accepted(data):
    assert config_from_dict(data).to_dict() == config_from_dict(config_from_dict(data).to_dict()).to_dict()
