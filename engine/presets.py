"""Named run configurations (``python -m engine run --preset NAME``): the demo and the papers' setups.

Each preset is a plain dict turned into a strict :class:`engine.config.RunConfig`; training
settings and method hyper-parameters of the paper presets come from :mod:`engine.methods.presets`.
The CIFAR presets need the dataset on disk (see the README); the built-in ones run offline, and the
Fashion-MNIST ones too once Debian's ``dataset-fashion-mnist`` (or the four IDX files under ``data/``) is there.
``quick-demo`` runs on Fashion-MNIST when it is there and on generated shapes otherwise, with a study
name that says so (:func:`preset_config`).
"""
from __future__ import annotations

import copy
from typing import Any

from engine.config import RunConfig, config_from_dict
from engine.data.fashion import fashion_available
from engine.methods.presets import method_hparams, training_settings


def _paper(preset: str, methods: list[str], **sections: Any) -> dict[str, Any]:
    t = training_settings(preset)
    replay = t.pop("replay_per_class")
    scenario = dict(sections.pop("scenario"))
    if scenario.get("training") == "finetune":
        scenario["replay_per_class"] = replay
    params = {m: method_hparams(preset, m) for m in methods if method_hparams(preset, m)}
    return dict(name=preset, methods=methods, method_params=params, training=t, scenario=scenario, **sections)


_DEMO_METHODS = ["independent", "bct", "cores", "dsimplex_hoc", "psp", "lsp"]
# HOC's lambda = 0.5 (paper 001's CUB value): with 10 epochs, 0.1 leaves too little cross-entropy to learn new classes
_DEMO_PARAMS = {"dsimplex_hoc": {"lam": 0.5}}
_DEMO_MODEL = dict(backbone="small_cnn", width=32)
# Cells are evaluated on the classes the gallery model was trained on, so each self-test is a real retrieval task.
_DEMO_EVAL = dict(protocol="closed-set", eval_classes="seen")
_DEMO_TRAINING = dict(epochs=10, batch_size=64, lr=0.05, lr_schedule="cosine")


def _fashion(name: str, initial: int, increment: int, steps: int) -> dict[str, Any]:
    """A class-incremental Fashion-MNIST scenario on all 70,000 images (the first per-class images when lowered)."""
    return dict(name=name, methods=list(_DEMO_METHODS), method_params=copy.deepcopy(_DEMO_PARAMS),
                dataset=dict(name="fashion", train_per_class=6000, test_per_class=1000),
                scenario=dict(initial_classes=initial, increment=increment, num_steps=steps),
                model=dict(_DEMO_MODEL), eval=dict(_DEMO_EVAL), training=dict(_DEMO_TRAINING, epochs=30, batch_size=128))


RUN_PRESETS: dict[str, dict[str, Any]] = {
    # The newcomer's demo: 3 steps (4 + 3 + 3 classes) of real Fashion-MNIST photos, the first 200 train /
    # 100 test images of each class, CPU in a few minutes; DEMO_FALLBACK replaces it when the files are absent.
    "quick-demo": dict(
        name="quick-demo", methods=_DEMO_METHODS, method_params=_DEMO_PARAMS,
        dataset=dict(name="fashion", train_per_class=200, test_per_class=100),
        scenario=dict(initial_classes=4, increment=3, num_steps=3),
        model=_DEMO_MODEL, eval=_DEMO_EVAL, training=_DEMO_TRAINING,
    ),
    # Fashion-MNIST class-incremental splits (Debian's dataset-fashion-mnist): 2+2+2+2+2, 4+3+3 and 5+5
    # classes, full data, 30 epochs: sized for a GPU (lower dataset.train_per_class for a CPU).
    "fashion-2x5": _fashion("fashion-2x5", 2, 2, 5),
    "fashion-4-3-3": _fashion("fashion-4-3-3", 4, 3, 3),
    "fashion-5-5": _fashion("fashion-5-5", 5, 5, 2),
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


# quick-demo without Fashion-MNIST: 3 steps of 10 generated shapes classes; the name tells the user why.
DEMO_FALLBACK: dict[str, Any] = dict(
    RUN_PRESETS["quick-demo"], name="quick-demo (shapes: Fashion-MNIST absent; apt-get install dataset-fashion-mnist)",
    dataset=dict(name="shapes", train_per_class=60, test_per_class=20),
    scenario=dict(initial_classes=10, increment=10, num_steps=3),
)


def preset_config(name: str) -> RunConfig:
    """The RunConfig of a named preset (``quick-demo``: :data:`DEMO_FALLBACK` when Fashion-MNIST cannot be read)."""
    if name not in RUN_PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(RUN_PRESETS)}")
    preset = RUN_PRESETS[name]
    if name == "quick-demo" and not fashion_available(preset["dataset"].get("root", "data")):
        preset = DEMO_FALLBACK
    return config_from_dict(copy.deepcopy(preset))
