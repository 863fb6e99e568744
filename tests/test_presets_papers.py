"""Every paper preset against the papers' values, written out here from the extractions
(/work/shared/papers/seed_extract_000_004.md A.9-A.10, seed_extract_001_003.md 1.4, 2.4, 3.4)."""
from __future__ import annotations

import pytest

from engine.models import BACKBONES
from engine.core.presets import ABSENT_METHODS, RUN_PRESETS, absent_methods_note, preset_config

OWN = {"quick-demo", "digits-tiny", "fashion-2x5", "fashion-4-3-3", "fashion-5-5"}  # not paper presets

# setting -> training values printed in the paper: epochs, batch, lr, lr decay epochs (x0.1), momentum, wd, replay
TRAINING = {
    # paper 000 A.9: CIFAR100 120 ep, batch 128, SGD 0.1 /10 at 80, 100, mom 0.9, wd 5e-4; TinyImageNet 90, 256, 50/70
    "psp-cifar100": (120, 128, 0.1, [80, 100], 0.9, 5e-4, 0),
    "psp-tinyimagenet": (90, 256, 0.1, [50, 70], 0.9, 5e-4, 0),
    # paper 002 Sec. 5.1: SGD 0.1, mom 0.9, wd 5e-4, batch 128, 100 epochs, lr -> 0.01 after 70; all data, no replay
    "cores-cifar100": (100, 128, 0.1, [70], 0.9, 5e-4, 0),
    # paper 001 Table I (momentum / wd from the released code): 70 / 128 / 0.1 / 50, 64; 90 / 256 / 0.1 / 30, 60;
    # 150 / 64 / 0.01 / 60, 90, 120; ER 20 images per class
    "cl2r-cifar100": (70, 128, 0.1, [50, 64], 0.9, 5e-4, 20),
    "cl2r-tinyimagenet": (90, 256, 0.1, [30, 60], 0.9, 5e-4, 20),
    "cl2r-cub": (150, 64, 0.01, [60, 90, 120], 0.9, 5e-4, 20),
    # paper 001 Table V: 70 epochs, batch 128, /10 after 50, 64; ER 20 per class; lr 0.1 from scratch (its
    # pre-training lr), 0.001 when fine-tuning (finetune_lr, below)
    "iamcl2r-cifar100r": (70, 128, 0.1, [50, 64], 0.9, 5e-4, 20),
}

# preset -> (setting, dataset, backbone, feature dim of the compared methods, d-Simplex K, initial classes, increment,
#            steps, training mode, replacement steps, protocol, open-set dataset)
SPLITS = {
    # paper 000 Table 1a: CIFAR100, ResNet18 (512-d), T = 2, 5, 20, 50 steps of 100/T classes, cumulative
    **{f"psp-cifar100-{t}steps": ("psp-cifar100", "cifar100", "resnet18_cifar", 512, None, 100 // t, 100 // t, t,
                                  "cumulative", [], "closed-set", None) for t in (2, 5, 20, 50)},
    # paper 000 Table 1b: TinyImageNet200, ResNet18, 5 steps of 40
    "psp-tinyimagenet-5steps": ("psp-tinyimagenet", "imagefolder", "resnet18", 512, None, 40, 40, 5, "cumulative", [],
                                "closed-set", None),
    # paper 002 Sec. 5.1: SENet-18, K = 100; 1 upgrade 50 -> 100 %, 2 upgrades 33/66/100 %, 4 of 20 %, 9 of 10 %;
    # open-set verification pairs from CIFAR-10
    "cores-cifar100-1upgrade": ("cores-cifar100", "cifar100", "senet18_cifar", 512, 100, 50, 50, 2, "cumulative", [],
                                "open-set", "cifar10"),
    "cores-cifar100-2upgrades": ("cores-cifar100", "cifar100", "senet18_cifar", 512, 100, 34, 33, 3, "cumulative", [],
                                 "open-set", "cifar10"),
    "cores-cifar100-4upgrades": ("cores-cifar100", "cifar100", "senet18_cifar", 512, 100, 20, 20, 5, "cumulative", [],
                                 "open-set", "cifar10"),
    "cores-cifar100-9upgrades": ("cores-cifar100", "cifar100", "senet18_cifar", 512, 100, 10, 10, 10, "cumulative", [],
                                 "open-set", "cifar10"),
    # paper 001 Table I / II: CIFAR100/10, RN32 (64-d compared, 99-d d-Simplex), 10 initial, +90/+15/+6/+3
    **{f"cl2r-cifar100-{n}tasks": ("cl2r-cifar100", "cifar100", "resnet32_cifar", 64, 100, 10, inc, n, "finetune", [],
                                   "open-set", "cifar10") for n, inc in ((2, 90), (7, 15), (16, 6), (31, 3))},
    # paper 001 Table I / III: TinyImageNet200/20, RN18 (512-d), K = 200, 50 initial + 25 (7 tasks)
    "cl2r-tinyimagenet-7tasks": ("cl2r-tinyimagenet", "imagefolder", "resnet18", 512, 200, 50, 25, 7, "finetune", [],
                                 "closed-set", None),
    # paper 001 Table I / IV: CUB180/20, RN50 (2048-d), K = 180, 60 initial + 20 (7 tasks)
    "cl2r-cub-7tasks": ("cl2r-cub", "imagefolder", "resnet50", 2048, 180, 60, 20, 7, "finetune", [], "closed-set", None),
    # paper 001 Table V / paper 003 Sec. 4.1: ResNet18 (512-d), K = 1024, 10 + 6 x 15 (replaced at 3, 5) and
    # 10 + 30 x 3 (replaced at 11, 21), CIFAR-10 1:N search
    "iamcl2r-cifar100r-7tasks": ("iamcl2r-cifar100r", "cifar100", "resnet18_cifar", 512, 1024, 10, 15, 7, "finetune",
                                 [3, 5], "open-set", "cifar10"),
    "iamcl2r-cifar100r-31tasks": ("iamcl2r-cifar100r", "cifar100", "resnet18_cifar", 512, 1024, 10, 3, 31, "finetune",
                                  [11, 21], "open-set", "cifar10"),
}

# setting -> method hyper-parameters printed in the papers
_FD = {"weight": 10.0, "weight_schedule": "sqrt_new_over_old"}
HPARAMS = {
    "psp-cifar100": {"psp": {"temperature": 12.0}, "lsp": {"temperature": 12.0}},  # paper 000 A.9 "temperature 12"
    "psp-tinyimagenet": {"psp": {"temperature": 12.0}, "lsp": {"temperature": 12.0}},
    "cores-cifar100": {},
    # paper 001 Sec. 6; d-Simplex-FD's weight is not in the paper: the CL2R code's 10 x sqrt(new / old classes)
    "cl2r-cifar100": {"dsimplex_hoc": {"lam": 0.1, "rho": 5.0}, "dsimplex_fd": _FD},
    "cl2r-tinyimagenet": {"dsimplex_hoc": {"lam": 0.1, "rho": 10.0}, "dsimplex_fd": _FD},
    "cl2r-cub": {"dsimplex_hoc": {"lam": 0.5, "rho": 10.0}, "dsimplex_fd": _FD},
    "iamcl2r-cifar100r": {"dsimplex_hoc": {"lam": 0.1, "rho": 10.0, "finetune_lr": 0.001},
                          **{m: {"finetune_lr": 0.001} for m in ("er", "bct_er", "dsimplex_fd")}},
}

# setting -> the methods of the paper's table that this project implements (the rest are in ABSENT_METHODS)
METHODS = {
    "psp-cifar100": {"independent", "psp", "lsp", "bct", "cores", "etf"},  # Table 1 (+ LCE, AdvBCT absent)
    "psp-tinyimagenet": {"independent", "psp", "lsp", "bct", "cores", "etf"},
    "cores-cifar100": {"independent", "bct", "cores"},  # Table 1: ITM, BCT, CoReS (+ l2, IFT, LwF absent)
    "cl2r-cifar100": {"er", "bct_er", "dsimplex_fd", "dsimplex_hoc"},  # Table II (+ FAN, LCE-ER, AdvBCT-ER, CVS)
    "cl2r-tinyimagenet": {"er", "bct_er", "dsimplex_fd", "dsimplex_hoc"},
    "cl2r-cub": {"er", "bct_er", "dsimplex_fd", "dsimplex_hoc"},
    "iamcl2r-cifar100r": {"er", "bct_er", "dsimplex_fd", "dsimplex_hoc"},  # Table VI
}


def test_every_paper_preset_has_a_row_here():
    assert set(RUN_PRESETS) - OWN == set(SPLITS)


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_paper_preset_matches_the_papers(name):
    setting, dataset, backbone, dim, k, first, inc, steps, mode, replaced, protocol, open_set = SPLITS[name]
    cfg = preset_config(name)
    epochs, batch, lr, milestones, momentum, wd, replay = TRAINING[setting]
    t = cfg.training
    assert (t.epochs, t.batch_size, t.optimizer, t.lr, t.lr_schedule, list(t.lr_milestones), t.lr_gamma) == (
        epochs, batch, "sgd", lr, "step", milestones, 0.1)
    assert (t.momentum, t.weight_decay) == (momentum, wd)
    s = cfg.scenario
    assert (s.initial_classes, s.increment, s.num_steps, s.training) == (first, inc, steps, mode)
    assert s.replay_per_class == (replay if mode == "finetune" else 0)
    assert list(s.replacement_steps) == replaced
    assert cfg.dataset.name == dataset and cfg.model.backbone == backbone
    assert BACKBONES[backbone].feature_dim == dim and cfg.model.feature_dim is None
    assert cfg.model.dsimplex_classes == k
    assert (cfg.eval.protocol, cfg.eval.open_set_dataset) == (protocol, open_set)
    assert set(cfg.methods) == METHODS[setting]
    assert cfg.method_params == {m: p for m, p in HPARAMS[setting].items() if m in cfg.methods}


def test_cl2r_and_iamcl2r_evaluate_as_the_released_code():
    # 1:N search top-1 against class-mean gallery templates (seed_extract_001_003 0.5) on CIFAR-10
    for name in [n for n in SPLITS if n.startswith(("cl2r-cifar100", "iamcl2r"))]:
        cfg = preset_config(name)
        assert (cfg.eval.gallery, cfg.eval.metrics) == ("template", ("recall@1",))


def test_cifar100r_keeps_300_images_per_class_and_cores_uses_verification():
    # paper 003 Sec. 4.1: CIFAR100R has 300 images per class; paper 002 Sec. 5.1: M = pair-verification accuracy
    assert all(preset_config(n).dataset.max_per_class == 300 for n in SPLITS if n.startswith("iamcl2r"))
    assert all(preset_config(n).dataset.max_per_class is None for n in SPLITS if not n.startswith("iamcl2r"))
    assert all(preset_config(n).eval.metrics[0] == "verification" for n in SPLITS if n.startswith("cores"))
    assert all(preset_config(n).model.init_seed == "auto" for n in SPLITS)  # CoReS: same seed, others: new seeds


def test_absent_methods_are_named_with_their_papers():
    assert {"LCE", "AdvBCT", "FAN", "CVS", "FastFill"} <= set(ABSENT_METHODS)
    note = absent_methods_note()
    assert "AdvBCT (paper 000, 001, 003)" in note and "FastFill (paper 004)" in note
