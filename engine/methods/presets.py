"""Named presets: training-loop settings and per-method hyper-parameters, kept apart.

``PRESETS[name]["training"]`` holds what the loop needs (epochs, batch size, optimiser, learning
rate schedule, replay memory size); ``PRESETS[name]["methods"][method]`` the keyword arguments for
``build_method``. A method a preset does not list runs with its class defaults.

- ``quick``: a few minutes on a CPU with a small backbone; not meant to reproduce any number.
- ``psp-*``: paper 000, scenario 1 (independent training on extended classes), Table of A.9.
- ``cores-cifar100``: paper 002 (CoReS), CIFAR-100/10 protocol, §2.4.
- ``cl2r-*``: paper 001, CL2R scenario (train on task 1, then fine-tune with replay), Table I.
- ``iamcl2r-cifar100r``: paper 001 Table V / paper 003, fine-tuning settings of IAM-CL2R.

Where a paper is silent the value and its source are noted next to it ([REPO] = released code).
"""
from __future__ import annotations

import copy
from typing import Any

from engine.methods.registry import METHODS

TRAINING_KEYS = (
    "epochs",
    "batch_size",
    "optimizer",
    "lr",
    "momentum",
    "weight_decay",
    "lr_schedule",
    "lr_milestones",
    "lr_gamma",
    "replay_per_class",
)


def _training(
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    lr_milestones: list[int],
    replay_per_class: int,
    optimizer: str = "sgd",
    momentum: float = 0.9,
    weight_decay: float = 5e-4,
    lr_schedule: str = "step",
    lr_gamma: float = 0.1,
) -> dict[str, Any]:
    """One training-settings dict; ``replay_per_class`` is used only by methods with ``uses_replay``."""
    return {
        "epochs": epochs,
        "batch_size": batch_size,
        "optimizer": optimizer,
        "lr": lr,
        "momentum": momentum,
        "weight_decay": weight_decay,
        "lr_schedule": lr_schedule,
        "lr_milestones": lr_milestones,
        "lr_gamma": lr_gamma,
        "replay_per_class": replay_per_class,
    }


PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        "training": _training(
            epochs=2, batch_size=32, lr=0.05, lr_schedule="constant", lr_milestones=[], replay_per_class=5
        ),
        # every method listed, at its defaults, so a quick run shows exactly what it used
        "methods": {
            "independent": {},
            "psp": {"temperature": 1.0},
            "lsp": {"temperature": 1.0},
            "bct": {"lam": 1.0},
            "bct_er": {"lam": 1.0},
            "cores": {},
            "dsimplex_fd": {
                "weight": 10.0,
                "distance": "cosine",
                "distill_on": "old_classes",
                "weight_schedule": "sqrt_new_over_old",
            },
            "dsimplex_hoc": {"lam": 0.1, "rho": 10.0, "negatives": "repo"},
            "er": {},
            "etf": {"objective": "ce"},
            "lce": {"alpha": 1.0, "beta": 0.1},
            "lce_er": {"alpha": 1.0, "beta": 0.1},
        },
    },
    # paper 000, CIFAR100 / ResNet18: 120 epochs, batch 128, SGD 0.1 /10 at 80 and 100, momentum 0.9,
    # wd 5e-4, "temperature factor of 12" (read as logits / 12, see PSP). No replay in this protocol.
    "psp-cifar100": {
        "training": _training(epochs=120, batch_size=128, lr=0.1, lr_milestones=[80, 100], replay_per_class=0),
        "methods": {"psp": {"temperature": 12.0}, "lsp": {"temperature": 12.0}},
    },
    # paper 000, TinyImageNet200 / ResNet18 at 64x64: 90 epochs, batch 256, SGD 0.1 /10 at 50 and 70.
    "psp-tinyimagenet": {
        "training": _training(epochs=90, batch_size=256, lr=0.1, lr_milestones=[50, 70], replay_per_class=0),
        "methods": {"psp": {"temperature": 12.0}, "lsp": {"temperature": 12.0}},
    },
    # paper 002, CIFAR-100/10 / SENet-18, K = 100: SGD 0.1, momentum 0.9, wd 5e-4, batch 128,
    # 100 epochs per upgrade, lr -> 0.01 after 70. All data available: no replay.
    "cores-cifar100": {
        "training": _training(epochs=100, batch_size=128, lr=0.1, lr_milestones=[70], replay_per_class=0),
        "methods": {"cores": {}},
    },
    # paper 001 Table I, CIFAR100/10 / ResNet32, K = 100: 70 epochs, batch 128, SGD 0.1, decay at 50, 64
    # (factor not stated: /10 as in IAM-CL2R); momentum 0.9, wd 5e-4 [REPO, CL2R code]; ER 20 per class.
    "cl2r-cifar100": {
        "training": _training(epochs=70, batch_size=128, lr=0.1, lr_milestones=[50, 64], replay_per_class=20),
        "methods": {
            "dsimplex_hoc": {"lam": 0.1, "rho": 5.0},
            # base weight 10 scaled by sqrt(new/old classes), cosine on replay samples [REPO, CL2R code]
            "dsimplex_fd": {"weight": 10.0, "weight_schedule": "sqrt_new_over_old"},
        },
    },
    # paper 001 Table I, TinyImageNet200/20 / ResNet18, K = 200: 90 epochs, batch 256, SGD 0.1, decay at 30, 60.
    "cl2r-tinyimagenet": {
        "training": _training(epochs=90, batch_size=256, lr=0.1, lr_milestones=[30, 60], replay_per_class=20),
        "methods": {
            "dsimplex_hoc": {"lam": 0.1, "rho": 10.0},
            "dsimplex_fd": {"weight": 10.0, "weight_schedule": "sqrt_new_over_old"},
        },
    },
    # paper 001 Table I, CUB180/20 / ResNet50, K = 180: 150 epochs, batch 64, SGD 0.01, decay at 60, 90, 120.
    "cl2r-cub": {
        "training": _training(epochs=150, batch_size=64, lr=0.01, lr_milestones=[60, 90, 120], replay_per_class=20),
        "methods": {
            "dsimplex_hoc": {"lam": 0.5, "rho": 10.0},
            "dsimplex_fd": {"weight": 10.0, "weight_schedule": "sqrt_new_over_old"},
        },
    },
    # paper 001 Table V / paper 003, CIFAR100R/10 fine-tuning / ResNet18, K = 1024: 70 epochs, batch 128,
    # SGD 0.001 /10 after 50 and 64 (the iamcl2r code uses cosine annealing to 1e-5 instead);
    # momentum 0.9, wd 5e-4 [REPO]; ER 20 images per class.
    "iamcl2r-cifar100r": {
        "training": _training(epochs=70, batch_size=128, lr=0.001, lr_milestones=[50, 64], replay_per_class=20),
        # finetune_lr 0.001 after the pre-trained step, whose lr is 0.1 in the iamcl2r code [REPO, P1 Table V]
        "methods": {"dsimplex_hoc": {"lam": 0.1, "rho": 10.0, "finetune_lr": 0.001}},
    },
}


def training_settings(preset: str) -> dict[str, Any]:
    """A copy of the training-loop settings of ``preset``."""
    return copy.deepcopy(_preset(preset)["training"])


def method_hparams(preset: str, method: str) -> dict[str, Any]:
    """A copy of ``method``'s hyper-parameters in ``preset``; ``{}`` (class defaults) if it lists none."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known methods: {', '.join(sorted(METHODS))}")
    return copy.deepcopy(_preset(preset)["methods"].get(method, {}))


def _preset(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    return PRESETS[name]
