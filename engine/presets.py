"""Named run configurations (``python -m engine run --preset NAME``): the demo and the papers' setups.

Each preset is a plain dict turned into a strict :class:`engine.config.RunConfig`; training
settings and method hyper-parameters of the paper presets come from :mod:`engine.methods.presets`.
The CIFAR presets need the dataset on disk (see the README); the built-in ones run offline.
"""
from __future__ import annotations

import copy
from typing import Any

from engine.config import RunConfig, config_from_dict
from engine.methods.presets import method_hparams, training_settings


def _paper(preset: str, methods: list[str], **sections: Any) -> dict[str, Any]:
    t = training_settings(preset)
    replay = t.pop("replay_per_class")
    scenario = dict(sections.pop("scenario"))
    if scenario.get("training") == "finetune":
        scenario["replay_per_class"] = replay
    params = {m: method_hparams(preset, m) for m in methods if method_hparams(preset, m)}
    return dict(name=preset, methods=methods, method_params=params, training=t, scenario=scenario, **sections)


RUN_PRESETS: dict[str, dict[str, Any]] = {
    # The newcomer's demo: 3 steps on generated shapes, CPU in a few minutes. Cells are evaluated on the
    # classes the gallery model was trained on, so each self-test is a real (unsaturated) retrieval task.
    "quick-demo": dict(
        name="quick-demo",
        methods=["independent", "bct", "cores", "dsimplex_hoc", "psp", "lsp"],
        # HOC's lambda = 0.5 departs from the paper's 0.1 (P1 §6, CIFAR/TinyImageNet; 0.5 is its CUB value): with
        # 10 epochs, 0.1 leaves too little cross-entropy to learn the new classes. Negatives "repo" (iamcl2r HocLoss).
        method_params={"dsimplex_hoc": {"lam": 0.5}},
        dataset=dict(name="shapes", train_per_class=60, test_per_class=20),
        scenario=dict(initial_classes=10, increment=10, num_steps=3),
        model=dict(backbone="small_cnn", width=32),
        eval=dict(protocol="closed-set", eval_classes="seen"),
        training=dict(epochs=10, batch_size=64, lr=0.05, lr_schedule="cosine"),
    ),
    # A seconds-long run for tests and smoke checks.
    "digits-tiny": dict(
        name="digits-tiny",
        methods=["independent", "cores"],
        dataset=dict(name="digits"),
        scenario=dict(initial_classes=5, increment=5, num_steps=2),
        model=dict(backbone="small_cnn", width=16),
        training=dict(epochs=2, batch_size=64, lr=0.05),
    ),
    # Paper 000, Table 1a: CIFAR-100, ResNet-18, 5 steps of 20 classes, each model trained on all seen data.
    "psp-cifar100": _paper(
        "psp-cifar100", ["independent", "psp", "lsp", "bct", "cores", "etf", "lce"],
        dataset=dict(name="cifar100"), model=dict(backbone="resnet18_cifar"),
        scenario=dict(initial_classes=20, increment=20, num_steps=5), eval=dict(protocol="closed-set")),
    # Paper 002: CIFAR-100/10 retraining with a pre-allocated d-Simplex (K = 100).
    "cores-cifar100": _paper(
        "cores-cifar100", ["independent", "bct", "cores"],
        dataset=dict(name="cifar100"), model=dict(backbone="resnet18_cifar", dsimplex_classes=100),
        scenario=dict(initial_classes=10, increment=10, num_steps=10), eval=dict(protocol="closed-set")),
    # Paper 001, CL2R: CIFAR-100/10 fine-tuning with 20 replay images per class, open-set on CIFAR-10
    # (its train split as queries, test split as gallery), class-mean templates as in the released code.
    "cl2r-cifar100": _paper(
        "cl2r-cifar100", ["er", "bct_er", "lce_er", "dsimplex_fd", "dsimplex_hoc"],
        dataset=dict(name="cifar100"), model=dict(backbone="resnet18_cifar", dsimplex_classes=100),
        scenario=dict(initial_classes=10, increment=10, num_steps=10, training="finetune"),
        eval=dict(protocol="open-set", open_set_dataset="cifar10", gallery="template", metrics=["recall@1"])),
}


def preset_config(name: str) -> RunConfig:
    """The RunConfig of a named preset."""
    if name not in RUN_PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(RUN_PRESETS)}")
    return config_from_dict(copy.deepcopy(RUN_PRESETS[name]))
