"""The method registry, the validating factory, the declared requirements and the presets."""
import dataclasses

import pytest

from engine.core.cell import VIEWS
from engine.methods import METHODS, BCT, DSimplexHOC, build_method, method_hparam_names
from engine.methods.base import INIT_FROM, Method
from engine.core.presets import PRESETS, TRAINING_KEYS, method_hparams, training_settings
from engine.models import HEADS

# what each method needs from the loop: (head, needs_old_model, uses_replay, init_from)
EXPECTED = {
    "independent": ("linear", False, False, "scratch"),
    "psp": ("linear", False, False, "scratch"),
    "lsp": ("linear", False, False, "scratch"),
    "bct": ("linear", True, False, "scratch"),
    "bct_er": ("linear", True, True, "previous"),
    "cores": ("dsimplex", False, False, "scratch"),
    "dsimplex_fd": ("dsimplex", True, True, "previous"),
    "dsimplex_hoc": ("dsimplex", True, True, "previous"),
    "er": ("linear", False, True, "previous"),
    "etf": ("etf", False, False, "scratch"),
    "mean_align": ("linear", True, False, "scratch"),
    "mean_align_er": ("linear", True, True, "previous"),
}


def test_registry_is_a_plain_dict_of_named_method_classes():
    assert type(METHODS) is dict and set(METHODS) == set(EXPECTED)
    for key, cls in METHODS.items():
        assert issubclass(cls, Method) and dataclasses.is_dataclass(cls)
        assert cls.name == key
        assert (cls.head, cls.needs_old_model, cls.uses_replay, cls.init_from) == EXPECTED[key]
        assert cls.head in HEADS and cls.init_from in INIT_FROM
        assert cls.default_views and set(cls.default_views) <= set(VIEWS)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_build_with_defaults_round_trips_and_is_frozen(name):
    method = build_method(name)
    assert isinstance(method, METHODS[name])
    assert build_method(name, **method.hparams()) == method
    assert tuple(method.hparams()) == method_hparam_names(name)
    for field in dataclasses.fields(method):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(method, field.name, getattr(method, field.name))


def test_defaults_and_hparam_names():
    assert build_method("dsimplex_hoc").hparams() == {
        "finetune_lr": None, "balanced_replay": True, "lam": 0.1, "rho": 10.0, "negatives": "repo"}
    assert build_method("bct").hparams() == {"lam": 1.0}
    assert build_method("psp").hparams() == {"temperature": 1.0, "extraction_temperature": "none"}
    assert build_method("etf").hparams() == {"objective": "ce"}
    assert build_method("mean_align").hparams() == {"alpha": 1.0, "beta": 0.1}
    assert build_method("dsimplex_fd").hparams() == {
        "finetune_lr": None,
        "balanced_replay": True,
        "weight": 10.0,
        "distance": "cosine",
        "distill_on": "old_classes",
        "weight_schedule": "sqrt_new_over_old",
    }
    assert method_hparam_names("cores") == ()
    assert build_method("dsimplex_hoc", rho=5.0, negatives="repo") == DSimplexHOC(rho=5.0, negatives="repo")


def test_unknown_method_and_unknown_hparams_are_rejected_with_a_clear_message():
    with pytest.raises(ValueError, match=r"unknown method 'hoc'; known methods: bct, bct_er, cores"):
        build_method("hoc")
    message = r"'dsimplex_hoc' has no hyper-parameter\(s\) lambda_, mu_; it takes: finetune_lr, balanced_replay, lam, rho, negatives"
    with pytest.raises(ValueError, match=message):
        build_method("dsimplex_hoc", mu_=10, lambda_=0.1)
    with pytest.raises(ValueError, match="'cores' has no hyper-parameter.*it takes: no hyper-parameters"):
        build_method("cores", lam=0.5)


@pytest.mark.parametrize(
    "name, hparams, message",
    [
        ("dsimplex_hoc", {"lam": 1.5}, "lam must be at most 1"),
        ("dsimplex_hoc", {"lam": -0.1}, "lam must be at least 0"),
        ("dsimplex_hoc", {"rho": 0.0}, "rho must be greater than 0"),
        ("dsimplex_hoc", {"negatives": "supcon"}, "negatives must be one of"),
        ("dsimplex_hoc", {"rho": "10"}, "rho must be a finite number"),
        ("dsimplex_hoc", {"rho": float("nan")}, "rho must be a finite number"),
        ("bct", {"lam": True}, "lam must be a finite number"),
        ("psp", {"temperature": -12.0}, "temperature must be at least 0.001"),
        ("lsp", {"temperature": 0}, "lsp: temperature must be at least 0.001"),
        ("psp", {"extraction_temperature": "12"}, "psp: extraction_temperature must be one of"),
        ("etf", {"objective": "mse"}, "objective must be one of"),
        ("dsimplex_fd", {"distance": "l1"}, "distance must be one of"),
        ("dsimplex_fd", {"distill_on": "replay"}, "distill_on must be one of"),
        ("dsimplex_fd", {"weight_schedule": "pod"}, "weight_schedule must be one of"),
        ("dsimplex_fd", {"weight": -1.0}, "weight must be at least 0"),
        ("mean_align", {"beta": -1.0}, "beta must be at least 0"),
    ],
)
def test_invalid_values_are_rejected(name, hparams, message):
    with pytest.raises(ValueError, match=message):
        build_method(name, **hparams)


def test_every_preset_has_the_same_training_keys_and_valid_method_hparams():
    for preset in PRESETS:
        assert set(PRESETS[preset]) == {"training", "methods"}
        training = training_settings(preset)
        assert tuple(training) == TRAINING_KEYS
        assert training["lr_schedule"] in ("constant", "step", "cosine")
        assert all(isinstance(m, int) and 0 < m < training["epochs"] for m in training["lr_milestones"])
        for name in PRESETS[preset]["methods"]:
            assert name in METHODS
        for name in METHODS:
            build_method(name, **method_hparams(preset, name))
    assert set(PRESETS["quick"]["methods"]) == set(METHODS)
    assert training_settings("quick")["epochs"] <= 2


def test_paper_presets_carry_the_published_values():
    assert method_hparams("cl2r-cifar100", "dsimplex_hoc") == {"lam": 0.1, "rho": 5.0}
    assert method_hparams("cl2r-tinyimagenet", "dsimplex_hoc") == {"lam": 0.1, "rho": 10.0}
    assert method_hparams("cl2r-cub", "dsimplex_hoc") == {"lam": 0.5, "rho": 10.0}
    assert method_hparams("iamcl2r-cifar100r", "dsimplex_hoc") == {"lam": 0.1, "rho": 10.0, "finetune_lr": 0.001}
    assert method_hparams("psp-cifar100", "psp") == {"temperature": 12.0}
    assert training_settings("psp-cifar100") == {
        "epochs": 120,
        "batch_size": 128,
        "optimizer": "sgd",
        "lr": 0.1,
        "momentum": 0.9,
        "weight_decay": 5e-4,
        "lr_schedule": "step",
        "lr_milestones": [80, 100],
        "lr_gamma": 0.1,
        "replay_per_class": 0,
    }
    cores = training_settings("cores-cifar100")
    assert (cores["epochs"], cores["lr"], cores["lr_milestones"]) == (100, 0.1, [70])
    iam = training_settings("iamcl2r-cifar100r")
    assert (iam["lr"], iam["epochs"], iam["replay_per_class"]) == (0.1, 70, 20)  # from scratch; fine-tuning at 0.001
    assert method_hparams("iamcl2r-cifar100r", "er") == {"finetune_lr": 0.001}
    # a method the preset does not list runs at its defaults
    assert method_hparams("psp-cifar100", "bct") == {}
    assert build_method("bct", **method_hparams("psp-cifar100", "bct")) == BCT()


def test_presets_hand_out_copies_and_reject_unknown_names():
    training_settings("quick")["lr_milestones"].append(1)
    method_hparams("quick", "dsimplex_hoc")["rho"] = 99.0
    assert training_settings("quick")["lr_milestones"] == []
    assert method_hparams("quick", "dsimplex_hoc")["rho"] == 10.0
    with pytest.raises(ValueError, match="unknown preset 'paper'"):
        training_settings("paper")
    with pytest.raises(ValueError, match="unknown method 'hoc'"):
        method_hparams("quick", "hoc")


def test_retired_lce_names_are_refused_with_a_hint():
    from engine.core.config import config_from_dict

    for old, new in (("lce", "mean_align"), ("lce_er", "mean_align_er")):
        with pytest.raises(ValueError, match=f"not Meng et al. 2021's LCE; it is now '{new}'"):
            build_method(old)
        with pytest.raises(ValueError, match=f"config key methods is refused: '{old}' was a class-mean alignment"):
            config_from_dict({"methods": [old]})
