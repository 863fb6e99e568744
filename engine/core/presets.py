"""Named run configurations (``python -m engine run --preset NAME``): the demo and the papers' setups. Torch-free.

Two tables, both plain dicts:

* ``PRESETS`` (one per paper *setting*): training-loop settings and per-method hyper-parameters,
  ``training_settings(setting)`` / ``method_hparams(setting, method)``; ``quick`` is a CPU smoke setting.
* ``RUN_PRESETS`` (one per run): full :class:`engine.core.config.RunConfig` dicts. The paper presets are built by
  ``_paper`` from a setting plus the data, backbone, split and evaluation of one table of the paper; the
  comment above each cites where its values come from. ``[REPO]`` marks a value taken from released code
  where the paper is silent. ``tests/test_presets_papers.py`` compares every paper preset with the papers.

The CIFAR presets need the dataset on disk (see the README); the built-in ones run offline, and the
Fashion-MNIST ones too once Debian's ``dataset-fashion-mnist`` (or the four IDX files under ``data/``) is there.
``quick-demo`` runs on Fashion-MNIST when it is there and on generated shapes otherwise, with a study
name that says so (:func:`preset_config`). Methods the
papers compare with that this project lacks are listed in ``ABSENT_METHODS`` (shown by the dashboard).
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from engine.core.config import RunConfig, config_from_dict
from engine.core.vocab import METHOD_NAMES

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
    "select",
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
    select: str = "last",
) -> dict[str, Any]:
    """One training-settings dict; ``replay_per_class`` is used only by methods with ``uses_replay``; ``select``: the
    epoch a step keeps (``"last"``, or ``"best_val"`` where the paper's released code selects on validation)."""
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
        "select": select,
    }


# d-Simplex-FD in the CL2R settings: base weight 10 scaled by sqrt(new / old classes), cosine on replay samples
# [REPO, CL2R code]; paper 001 gives no value. (method_hparams hands out copies.)
_CL2R_FD = {"weight": 10.0, "weight_schedule": "sqrt_new_over_old"}

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
            "mean_align": {"alpha": 1.0, "beta": 0.1},
            "mean_align_er": {"alpha": 1.0, "beta": 0.1},
        },
    },
    # paper 000 Sec. 5 / App. (extraction A.9), CIFAR100 / ResNet18: 120 epochs, batch 128, SGD 0.1 /10 at 80 and
    # 100, momentum 0.9, wd 5e-4, "temperature factor of 12" (read as logits / 12, see PSP). No replay.
    "psp-cifar100": {
        "training": _training(epochs=120, batch_size=128, lr=0.1, lr_milestones=[80, 100], replay_per_class=0),
        "methods": {"psp": {"temperature": 12.0}, "lsp": {"temperature": 12.0}},
    },
    # paper 000 (A.9), TinyImageNet200 / ResNet18 at 64x64: 90 epochs, batch 256, SGD 0.1 /10 at 50 and 70.
    "psp-tinyimagenet": {
        "training": _training(epochs=90, batch_size=256, lr=0.1, lr_milestones=[50, 70], replay_per_class=0),
        "methods": {"psp": {"temperature": 12.0}, "lsp": {"temperature": 12.0}},
    },
    # paper 002 Sec. 5.1, CIFAR-100/10 / SENet-18, K = 100: SGD 0.1, momentum 0.9, wd 5e-4, batch 128,
    # 100 epochs per upgrade, lr -> 0.01 after 70. All data available: no replay. Each step keeps its epoch of best
    # validation accuracy [REPO, cores-compatibility src/cores/main.py].
    "cores-cifar100": {
        "training": _training(epochs=100, batch_size=128, lr=0.1, lr_milestones=[70], replay_per_class=0,
                              select="best_val"),
        "methods": {"cores": {}},
    },
    # paper 001 Table I, CIFAR100/10 / ResNet32, K = 100: 70 epochs, batch 128, SGD 0.1, decay at 50, 64
    # (factor not stated: /10 as in IAM-CL2R); momentum 0.9, wd 5e-4 [REPO, CL2R code]; ER 20 per class (Sec. 6).
    # HOC (lambda, rho) = (0.1, 5) for CIFAR100/10 (Sec. 6).
    "cl2r-cifar100": {
        "training": _training(epochs=70, batch_size=128, lr=0.1, lr_milestones=[50, 64], replay_per_class=20),
        "methods": {
            "dsimplex_hoc": {"lam": 0.1, "rho": 5.0},
            "dsimplex_fd": _CL2R_FD,
        },
    },
    # paper 001 Table I, TinyImageNet200/20 / ResNet18, K = 200: 90 epochs, batch 256, SGD 0.1, decay at 30, 60;
    # HOC (0.1, 10).
    "cl2r-tinyimagenet": {
        "training": _training(epochs=90, batch_size=256, lr=0.1, lr_milestones=[30, 60], replay_per_class=20),
        "methods": {
            "dsimplex_hoc": {"lam": 0.1, "rho": 10.0},
            "dsimplex_fd": _CL2R_FD,
        },
    },
    # paper 001 Table I, CUB180/20 / ResNet50, K = 180: 150 epochs, batch 64, SGD 0.01, decay at 60, 90, 120;
    # HOC (0.5, 10).
    "cl2r-cub": {
        "training": _training(epochs=150, batch_size=64, lr=0.01, lr_milestones=[60, 90, 120], replay_per_class=20),
        "methods": {
            "dsimplex_hoc": {"lam": 0.5, "rho": 10.0},
            "dsimplex_fd": _CL2R_FD,
        },
    },
    # paper 001 Table V / paper 003 Sec. 4.1, CIFAR100R/10 / ResNet18, K = 1024: 70 epochs, batch 128, /10 after 50
    # and 64 (the iamcl2r code uses cosine annealing to 1e-5 instead); momentum 0.9, wd 5e-4 [REPO]; ER 20 images
    # per class; HOC (0.1, 10) (paper 001 Sec. 6). Learning rates of Table V: 0.1 for the steps trained from scratch
    # (its "pre-training" lr: task 1 and the replacement steps here, which have no ImageNet32 models) and
    # finetune_lr 0.001 for every step that fine-tunes the previous model.
    "iamcl2r-cifar100r": {
        "training": _training(epochs=70, batch_size=128, lr=0.1, lr_milestones=[50, 64], replay_per_class=20),
        "methods": {
            "dsimplex_hoc": {"lam": 0.1, "rho": 10.0, "finetune_lr": 0.001},
            **{m: {"finetune_lr": 0.001} for m in ("er", "bct_er", "dsimplex_fd")},
        },
    },
}


def training_settings(preset: str) -> dict[str, Any]:
    """A copy of the training-loop settings of ``preset``."""
    return copy.deepcopy(_setting(preset)["training"])


def method_hparams(preset: str, method: str) -> dict[str, Any]:
    """A copy of ``method``'s hyper-parameters in ``preset``; ``{}`` (class defaults) if it lists none."""
    if method not in METHOD_NAMES:
        raise ValueError(f"unknown method {method!r}; known methods: {', '.join(sorted(METHOD_NAMES))}")
    return copy.deepcopy(_setting(preset)["methods"].get(method, {}))


def _setting(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    return PRESETS[name]


def _paper(setting: str, name: str, methods: list[str], **sections: Any) -> dict[str, Any]:
    """A RunConfig dict: the training settings and hyper-parameters of ``setting`` with the given data sections."""
    t = training_settings(setting)
    replay = t.pop("replay_per_class")
    scenario = dict(sections.pop("scenario"))
    if scenario.get("training") == "finetune":
        scenario["replay_per_class"] = replay
    params = {m: method_hparams(setting, m) for m in methods if method_hparams(setting, m)}
    return dict(name=name, methods=methods, method_params=params, training=t, scenario=scenario, **sections)


# paper 000 Sec. 5 (A.9), Tables 1a / 1b: T equal steps of C/T classes, each model trained on every class seen so far.
# Methods of Table 1 we implement (ETF-CE as `etf`); LCE and AdvBCT are absent (ABSENT_METHODS). M = Recall@1 on
# the test set; the paper leaves open whether cells use all test classes or the seen ones: "all" fits its baseline AA.
_PSP_METHODS = ["independent", "psp", "lsp", "bct", "cores", "etf"]
_PSP_STEPS = (2, 5, 20, 50)
# paper 001 Sec. 6 / Table II: 10 initial CIFAR-100 classes, then +90 / +15 / +6 / +3 for 2 / 7 / 16 / 31 tasks;
# 1:N search on CIFAR-10 (train split = queries, test split = gallery) against class-mean templates [REPO].
_CL2R_TASKS = {2: 90, 7: 15, 16: 6, 31: 3}
_CL2R_METHODS = ["er", "bct_er", "dsimplex_fd", "dsimplex_hoc"]  # Table II rows we implement
# paper 001 Table I: (root, image size, backbone, K, initial classes, increment for 7 tasks) of the image-folder sets
_CL2R_FOLDERS = {"tinyimagenet": ("data/tiny-imagenet-200", 64, "resnet18", 200, 50, 25),
                 "cub": ("data/CUB180", 224, "resnet50", 180, 60, 20)}
_CL2R_EVAL = dict(protocol="open-set", open_set_dataset="cifar10", gallery="template", metrics=["recall@1"])
# paper 002 Sec. 5.1 / Tables 1-2, Figs. 6-7: 1 / 2 / 4 / 9 upgrades of 50 / 33 / 20 / 10 % of the classes
# (33 %: 34 + 33 + 33 so that every class is used); open-set pair verification on CIFAR-10 (M), Recall@1 alongside.
_CORES_SPLITS = {1: (50, 50), 2: (34, 33), 4: (20, 20), 9: (10, 10)}
# paper 001 Table V / paper 003 Sec. 4.1: 10 classes then 6 x 15 (7 tasks) or 30 x 3 (31 tasks); replacements at
# tasks 3, 5 / 11, 21. Without ImageNet32 models the first model is trained from scratch on task 1 and the
# replacement steps are retrained here (see engine.data.scenario).
_IAM_TASKS = {7: (15, [3, 5]), 31: (3, [11, 21])}
# papers 001/003: d-Simplex prototypes of unit norm [REPO, iamcl2r src/iamcl2r/models/__init__.py and CL2R
# src/cl2r/model.py: dsimplex]; both keep the last epoch (save_best = False in their params.py)
_ROW = dict(dsimplex_normalization="row")

_DEMO_METHODS = ["independent", "bct", "cores", "dsimplex_hoc", "psp", "lsp"]
# HOC's lambda = 0.5 departs from the paper's 0.1 (P1 §6, CIFAR/TinyImageNet; 0.5 is its CUB value): with
# 10 epochs, 0.1 leaves too little cross-entropy to learn the new classes. Negatives "repo" (iamcl2r HocLoss).
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
    # 100 test images of each class, three seeds (mean +/- std), Recall@1 and paper 002's pair verification;
    # about 3 minutes on an idle 2-core CPU (bench/bench_training.py). 30 epochs were tried and reproduce no more
    # of the papers' orderings (README, "What reproduces"). DEMO_FALLBACK replaces it when the files are absent.
    "quick-demo": dict(
        name="quick-demo", methods=_DEMO_METHODS, method_params=_DEMO_PARAMS, seeds=[0, 1, 2],
        dataset=dict(name="fashion", train_per_class=200, test_per_class=100),
        scenario=dict(initial_classes=4, increment=3, num_steps=3),
        model=_DEMO_MODEL, eval=dict(_DEMO_EVAL, metrics=["recall@1", "verification"], also_eval_classes=["all"]),
        training=_DEMO_TRAINING,
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
    # paper 000 Table 1a: CIFAR-100, ResNet18 (32x32 stem), 2 / 5 / 20 / 50 steps of 100 / T classes.
    **{f"psp-cifar100-{t}steps": _paper(
        "psp-cifar100", f"psp-cifar100-{t}steps", _PSP_METHODS,
        dataset=dict(name="cifar100"), model=dict(backbone="resnet18_cifar"),
        scenario=dict(initial_classes=100 // t, increment=100 // t, num_steps=t), eval=dict(protocol="closed-set"))
       for t in _PSP_STEPS},
    # paper 000 Table 1b: TinyImageNet200 at 64x64, ResNet18, 5 steps of 40 classes. Root: train/ and val/ holding
    # one folder per class (the official val/ must be sorted into class folders first).
    "psp-tinyimagenet-5steps": _paper(
        "psp-tinyimagenet", "psp-tinyimagenet-5steps", _PSP_METHODS,
        dataset=dict(name="imagefolder", root="data/tiny-imagenet-200", image_size=64), model=dict(backbone="resnet18"),
        scenario=dict(initial_classes=40, increment=40, num_steps=5), eval=dict(protocol="closed-set")),
    # paper 002 CIFAR-100/10: SENet-18, a d-Simplex with K = 100 (99-d features) divided by its Frobenius norm before
    # centring [REPO, cores-compatibility src/cores/model.py], same initial seed for CoReS (init_seed "auto"), models
    # retrained on all classes so far; ITM = `independent`.
    **{f"cores-cifar100-{u}upgrade{'s' * (u > 1)}": _paper(
        "cores-cifar100", f"cores-cifar100-{u}upgrade{'s' * (u > 1)}", ["independent", "bct", "cores"],
        dataset=dict(name="cifar100"),
        model=dict(backbone="senet18_cifar", dsimplex_classes=100, dsimplex_normalization="frobenius_uncentred"),
        scenario=dict(initial_classes=first, increment=step, num_steps=u + 1),
        eval=dict(protocol="open-set", open_set_dataset="cifar10", metrics=["verification", "recall@1"]))
       for u, (first, step) in _CORES_SPLITS.items()},
    # paper 001 Table I / II, CL2R: CIFAR100/10, ResNet32 (64-d features for the compared methods, a 64 -> 99
    # projection before the d-Simplex with K = 100), task 1 from scratch, then fine-tuning with 20 replay
    # images per class.
    **{f"cl2r-cifar100-{n}tasks": _paper(
        "cl2r-cifar100", f"cl2r-cifar100-{n}tasks", _CL2R_METHODS,
        dataset=dict(name="cifar100"), model=dict(backbone="resnet32_cifar", dsimplex_classes=100, **_ROW),
        scenario=dict(initial_classes=10, increment=step, num_steps=n, training="finetune"), eval=_CL2R_EVAL)
       for n, step in _CL2R_TASKS.items()},
    # paper 001 Tables I / III and I / IV, 7 tasks: TinyImageNet200/20 (ResNet18 at 64x64, K = 200, 50 + 6 x 25) and
    # CUB180/20 (ResNet50 at 224x224, K = 180, 60 + 6 x 20; root: the first 180 CUB class folders). Their open-set
    # test classes (TinyImageNet20, CUB20) are not available: closed-set on the test / val split.
    **{f"cl2r-{data}-7tasks": _paper(
        f"cl2r-{data}", f"cl2r-{data}-7tasks", _CL2R_METHODS,
        dataset=dict(name="imagefolder", root=root, image_size=size), model=dict(backbone=net, dsimplex_classes=k, **_ROW),
        scenario=dict(initial_classes=first, increment=step, num_steps=7, training="finetune"),
        eval=dict(protocol="closed-set", gallery="template", metrics=["recall@1"]))
       for data, (root, size, net, k, first, step) in _CL2R_FOLDERS.items()},
    # paper 001 Table V / VI, paper 003 Table 1: IAM-CL2R on CIFAR100R/10 (the first 300 training images of each
    # CIFAR-100 class [REPO]), ResNet18, K = 1024, 20 replay images per class, two replacements.
    **{f"iamcl2r-cifar100r-{n}tasks": _paper(
        "iamcl2r-cifar100r", f"iamcl2r-cifar100r-{n}tasks", _CL2R_METHODS,
        dataset=dict(name="cifar100", max_per_class=300), model=dict(backbone="resnet18_cifar", dsimplex_classes=1024, **_ROW),
        scenario=dict(initial_classes=10, increment=step, num_steps=n, training="finetune", replacement_steps=steps),
        eval=_CL2R_EVAL)
       for n, (step, steps) in _IAM_TASKS.items()},
}

# Where each preset still differs from its paper or the paper's released code (one line each), shown by
# `python -m engine presets`, the New experiment page and the README. The released code read: cores-compatibility
# (paper 002), iamcl2r (papers 001/003), CL2R (the d-Simplex-FD baseline); paper 000's code is not released.
_NOT_PAPER = "not a paper's setup: "
_SCALING = ("one d-Simplex scaling per study: row (HOC's released code); CoReS's own code divides by the Frobenius "
            "norm (model.dsimplex_normalization = 'frobenius_uncentred')")
_DEMO_LAM = "HOC lambda 0.5 (paper 001's CUB value), not its CIFAR value 0.1 (chosen for the demo's 10 epochs)"
_PSP = (
    "paper 000's code is not released: values from its text (A.9); the bct, cores and etf baselines keep this "
    "tool's defaults (row-scaled d-Simplex, last epoch)",
    "'temperature factor of 12' read as logits / 12 (1/12 is the other reading)",
    "the paper does not say whether cells use all test classes or the seen ones: all",
    "LCE and AdvBCT rows of Table 1 are absent (ABSENT_METHODS)",
)
_CORES = (
    "best_val holds out 10 % of each class's training images (seeded); the released code selects on CIFAR-100's "
    "test images of the step's classes (src/cores/main.py)",
    "best_val and the Frobenius scaling apply to every method of the study; the released code trains CoReS only",
    "class order drawn with scenario.class_order_seed; the released code keeps CIFAR-100's label order 0..99",
    "mixed precision on CUDA (training.amp); the released code trains in float32",
    "CoReS-MS (paper 002 Sec. 4.3, selection on a set i.i.d. with the gallery) is absent (ABSENT_METHODS)",
)
_CL2R = (
    "d-Simplex-FD base weight 10 (the CL2R code's params.py default); its shipped configs set 5",
    "FAN, CVS, LCE and AdvBCT rows of Table II are absent (ABSENT_METHODS)",
)
_CL2R_CIFAR = (
    "lr /10 after epochs 50 and 64 (paper 001 Tab. I); the CL2R code's configs decay after epochs 49 and 64",
    "paper 001's splits (10 initial classes); the CL2R code's shipped configs run 50 + 5 x 10 and 50 + 10 x 5",
)
_CL2R_FOLDER = ("open-set TinyImageNet20 / CUB20 classes are not available: closed-set on the test / val split",)
_IAM = (
    "no ImageNet32 pre-trained models: task 1 and the replacement steps are trained from scratch at lr 0.1",
    "lr /10 after epochs 50 and 64 (paper); the iamcl2r code anneals with cosine from 0.001 to 1e-5",
    "weight decay on every parameter; the iamcl2r code exempts biases and normalisation gains",
    "FAN, CVS, LCE and AdvBCT rows are absent (ABSENT_METHODS)",
)
PRESET_DEVIATIONS: dict[str, tuple[str, ...]] = {
    "quick-demo": (_NOT_PAPER + "a 3-5 minute illustration (Fashion-MNIST 4 + 3 + 3, 200 / 100 images per class, "
                   "10 epochs, small_cnn)", _DEMO_LAM, _SCALING,
                   "cells on the classes the gallery model learned (eval_classes = seen), and on every test class (all, "
                   "the paper 000 presets' convention): both are stored, side by side on the Compatibility page",
                   "pair verification on closed-set test pairs; paper 002 uses open-set CIFAR-10 pairs"),
    **{name: (_NOT_PAPER + "full Fashion-MNIST, 30 epochs, small_cnn", _DEMO_LAM, _SCALING)
       for name in ("fashion-2x5", "fashion-4-3-3", "fashion-5-5")},
    "digits-tiny": (_NOT_PAPER + "a seconds-long smoke run (digits, 2 epochs)",),
    **{name: _PSP for name in RUN_PRESETS if name.startswith("psp-")},
    **{name: _CORES + (("2 upgrades: 34 + 33 + 33 classes; the released code's 100 // 3 gives 33 + 33 + 34",)
                       if name == "cores-cifar100-2upgrades" else ())
       for name in RUN_PRESETS if name.startswith("cores-")},
    **{f"cl2r-cifar100-{n}tasks": _CL2R_CIFAR + _CL2R for n in _CL2R_TASKS},
    **{f"cl2r-{data}-7tasks": _CL2R_FOLDER + _CL2R for data in _CL2R_FOLDERS},
    **{f"iamcl2r-cifar100r-{n}tasks": _IAM for n in _IAM_TASKS},
}


def preset_deviations(name: str) -> tuple[str, ...]:
    """The one-line deviations of run preset ``name`` from its paper and the paper's released code."""
    if name not in RUN_PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(RUN_PRESETS)}")
    return PRESET_DEVIATIONS[name]


# Methods the papers compare with that this project does not implement: name -> (papers, what it is). Shown under
# the dashboard's method picker and in the README, so a missing row of a paper's table is never a silent gap.
ABSENT_METHODS: dict[str, tuple[str, str]] = {
    "LCE": ("000, 001, 003", "Meng et al. 2021; `mean_align` is a simpler class-mean alignment, not this method"),
    "AdvBCT": ("000, 001, 003", "Pan et al. 2023, BCT with an adversarial discriminator"),
    "FAN": ("001, 003", "Iscen et al. 2020, a feature-adaptation network between models"),
    "CVS": ("001, 003", "Wan et al. 2022, distillation coherent with all past models"),
    "FastFill": ("004", "Jaeckle et al. 2023, forward adapter with an uncertainty backfilling order"),
    "LwF / l2 / IFT": ("002", "learning without forgetting, feature-distance loss, incremental fine-tuning"),
    "CoReS-MS": ("002", "CoReS with model selection on a held-out set (Sec. 4.3)"),
}


def absent_methods_note() -> str:
    """One sentence naming the methods the papers compare with that are not implemented here."""
    items = "; ".join(f"{name} (paper {papers})" for name, (papers, _) in ABSENT_METHODS.items())
    return f"Not implemented, though the papers compare with them: {items}."


# quick-demo without Fashion-MNIST: 3 steps of 10 generated shapes classes; the name tells the user why.
DEMO_FALLBACK: dict[str, Any] = dict(
    RUN_PRESETS["quick-demo"], name="quick-demo (shapes: Fashion-MNIST absent; apt-get install dataset-fashion-mnist)",
    dataset=dict(name="shapes", train_per_class=60, test_per_class=20),
    scenario=dict(initial_classes=10, increment=10, num_steps=3),
)


def preset_config(name: str, *, fashion_present: Callable[[str], bool] | None = None) -> RunConfig:
    """The RunConfig of a named preset.

    ``fashion_present(root)`` says whether Fashion-MNIST's files can be read (pass
    ``engine.data.fashion_files.fashion_available``; the core does not look at files): when it says no,
    ``quick-demo`` becomes :data:`DEMO_FALLBACK`. Without it the preset is returned as written.
    """
    if name not in RUN_PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(RUN_PRESETS)}")
    preset = RUN_PRESETS[name]
    if name == "quick-demo" and fashion_present is not None and not fashion_present(preset["dataset"].get("root", "data")):
        preset = DEMO_FALLBACK
    return config_from_dict(copy.deepcopy(preset))
