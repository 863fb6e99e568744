"""The torch-free vocabulary (engine.core.vocab) names exactly what the engine's registries know."""
import dataclasses
import re

import pytest
import torch

from engine.core import vocab
from engine.core.config import TrainingConfig
from engine.data import protocols, scenario
from engine.data.registry import DATASETS, load_dataset
from engine.core.cell import VIEWS
from engine.methods.registry import METHODS, method_hparam_names
from engine.metrics import retrieval
from engine.models import BACKBONES
from engine.methods.training import lr_factor, make_optimizer


def test_vocabulary_matches_the_registries():
    assert {m: tuple(specs) for m, specs in vocab.METHOD_PARAMS.items()} == {m: method_hparam_names(m) for m in METHODS}
    assert vocab.DATASET_NAMES == tuple(DATASETS)
    for name, classes in vocab.DATASET_CLASSES.items():  # the fixed class counts the config checks scenarios with
        assert f": {classes} classes," in DATASETS[name].summary, name
    assert load_dataset("digits", split="test").num_classes == vocab.DATASET_CLASSES["digits"]
    assert vocab.BACKBONE_NAMES == tuple(BACKBONES)
    assert vocab.VIEWS == VIEWS
    assert vocab.RUN_PROTOCOLS == protocols.PROTOCOLS and vocab.EVAL_CLASSES == protocols.EVAL_CLASSES
    assert vocab.GALLERY_KINDS == retrieval.GALLERY_KINDS
    assert vocab.TRAINING_MODES == scenario.TRAINING_MODES
    net = torch.nn.Linear(2, 2)
    for name in vocab.OPTIMIZERS:  # each named optimizer and schedule is one the training loop builds
        make_optimizer(net, TrainingConfig(optimizer=name))
    for name in vocab.LR_SCHEDULES:
        lr_factor(1, TrainingConfig(lr_schedule=name, lr_milestones=(1,)))
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer(net, TrainingConfig(optimizer="adamw"))
    with pytest.raises(ValueError, match="unknown lr_schedule"):
        lr_factor(1, TrainingConfig(lr_schedule="cosinee"))


@pytest.mark.parametrize("name", list(METHODS))
def test_method_param_specs_match_the_dataclasses_and_are_what_they_check(name):
    """Each spec's default is the dataclass field's default, the default passes, and a value the spec refuses
    is refused by the method with the spec's own words."""
    cls, specs = METHODS[name], vocab.METHOD_PARAMS[name]
    assert {f.name: f.default for f in dataclasses.fields(cls)} == {k: p.default for k, p in specs.items()}
    assert cls().hparams() == {k: p.default for k, p in specs.items()}
    for key, spec in specs.items():
        assert spec.problem(spec.default) is None
        bad = {"flag": "yes", "choice": "nope", "number": "x"}[spec.kind]
        with pytest.raises(ValueError, match=re.escape(f"{name}: {key} {spec.problem(bad)}")):
            cls(**{key: bad})


def test_config_and_vocabulary_stay_torch_free():
    """The app imports engine.core.config to validate forms: reading a config must not load torch."""
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, engine.core.config, engine.core.vocab; print(sorted(m for m in ('torch', 'numba', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.strip() == "[]"


def test_the_device_choices_the_forms_offer_are_devices_a_config_accepts():
    from engine.core.config import config_from_dict

    for device in vocab.DEVICE_CHOICES:
        assert vocab.DEVICE.match(device)
        assert config_from_dict({"device": device}).device == device
