"""The names a config may use, torch-free, so the app and ``engine.config`` can check values without the engine.

Each tuple mirrors one engine registry (``tests/test_vocab.py`` checks them against the real ones):
methods and their hyper-parameters (``engine.methods.METHODS``), datasets (``engine.data.registry.DATASETS``),
backbones (``engine.models.BACKBONES``), optimizers and schedules (``engine.training``), the run and gallery
protocols (``engine.data.protocols``, ``engine.metrics.retrieval``), views (``engine.features.VIEWS``) and
scenario training modes (``engine.data.scenario.TRAINING_MODES``).
"""
from __future__ import annotations

import re

METHOD_PARAMS: dict[str, tuple[str, ...]] = {
    "independent": (),
    "psp": ("temperature", "extraction_temperature"),
    "lsp": ("temperature", "extraction_temperature"),
    "bct": ("lam",),
    "bct_er": ("lam", "finetune_lr", "balanced_replay"),
    "cores": (),
    "dsimplex_fd": ("finetune_lr", "balanced_replay", "weight", "distance", "distill_on", "weight_schedule"),
    "dsimplex_hoc": ("finetune_lr", "balanced_replay", "lam", "rho", "negatives"),
    "er": ("finetune_lr", "balanced_replay"),
    "etf": ("objective",),
    "mean_align": ("alpha", "beta"),
    "mean_align_er": ("alpha", "beta", "finetune_lr", "balanced_replay"),
}
METHOD_NAMES = tuple(METHOD_PARAMS)
# names retired because they claimed a paper the code does not implement: old name -> one-line hint
RETIRED_METHODS = {old: f"{old!r} was a class-mean alignment stand-in, not Meng et al. 2021's LCE; it is now {new!r}"
                   for old, new in (("lce", "mean_align"), ("lce_er", "mean_align_er"))}
DATASET_NAMES = ("digits", "shapes", "cifar10", "cifar100", "fashion", "imagefolder")
BACKBONE_NAMES = ("small_cnn", "resnet18_cifar", "resnet32_cifar", "senet18_cifar", "resnet18", "resnet34", "resnet50",
                  "resnet101", "resnet152", "alexnet", "vgg16", "regnet_x_3_2gf", "regnet_y_400mf", "densenet121",
                  "efficientnet_b0", "efficientnet_b3", "mobilenet_v3_small", "convnext_tiny", "swin_t", "maxvit_t",
                  "vit_b_32", "vit_b_16", "vit_l_16")
OPTIMIZERS = ("sgd", "adam")
LR_SCHEDULES = ("constant", "step", "cosine")
RUN_PROTOCOLS = ("closed-set", "open-set")  # which images are queries and gallery
GALLERY_PROTOCOLS = ("instance", "template")  # what a gallery item is
EVAL_CLASSES = ("all", "seen")
VIEWS = ("encoder", "logits", "softmax", "psp", "lsp")
TRAINING_MODES = ("cumulative", "finetune")
# models trained from scratch: "auto" = the same initial weights at every step only where the method's paper
# prescribes it (CoReS, paper 002 Sec. 5.1 / Tab. 9), a new seed per step otherwise; "same" / "per_step" force one
INIT_SEEDS = ("auto", "same", "per_step")
DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")  # engine.device.pick_device

_METRIC = re.compile(r"^(recall|map)(?:@(\d+))?$")
VERIFICATION = "verification"  # paper 002's pair-verification accuracy (engine.metrics.verification)


def parse_metric(name: str, *, pairs: bool = True) -> tuple[str, int | None]:
    """Split a metric name into ``("recall", k)``, ``("map", None)``, ``("map", k)`` or ``("verification", None)``.

    ``pairs=False`` accepts only the ranking metrics (for callers that have no image pairs).
    """
    key = str(name).strip().lower()
    if pairs and key == VERIFICATION:
        return VERIFICATION, None
    m = _METRIC.match(key)
    if not m or (m.group(1) == "recall" and m.group(2) is None) or (m.group(2) is not None and int(m.group(2)) < 1):
        extra = ", 'map@K' or 'verification'" if pairs else " or 'map@K'"
        raise ValueError(f"unknown metric {name!r}; use 'recall@K' (K >= 1), 'map'{extra}")
    return m.group(1), int(m.group(2)) if m.group(2) else None
