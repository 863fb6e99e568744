"""The names a config may use, torch-free, so the app and ``engine.core.config`` can check values without the engine.

Each tuple mirrors one engine registry (``tests/test_vocab.py`` checks them against the real ones):
methods and their hyper-parameters' specs (``engine.methods.METHODS``, whose dataclasses check their
values here), datasets (``engine.data.registry.DATASETS``),
backbones (``engine.models.BACKBONES``), optimizers and schedules (``engine.methods.training``), the run and gallery
protocols (``engine.data.protocols``, ``engine.metrics.retrieval``), views (``engine.core.cell.VIEWS``) and
scenario training modes (``engine.data.scenario.TRAINING_MODES``). The upgrade check's :class:`Rule` (margin and tie
rule) is defined here, so job payloads are checked before they are queued; ``engine.metrics.decision`` applies it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from engine.core.kinds import MAX_K, STRICT, TIES, VIEW_KINDS, check_ties, metric_parts



def interval(low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False) -> str:
    """``[0, 1]``, ``(0, inf)``: the interval as people write it."""
    return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open or high == math.inf else ']'}"


@dataclass(frozen=True)
class Param:
    """One method hyper-parameter: its kind, allowed values and default (the method dataclass field's default).

    ``kind``: ``"number"`` (finite, in ``[low, high]``, ``(low, ...`` when ``low_open``; ``None`` too when the
    default is ``None``), ``"choice"`` (one of ``choices``) or ``"flag"`` (true or false).
    """

    kind: str
    default: Any
    choices: tuple[str, ...] = ()
    low: float = -math.inf
    high: float = 1e6  # above this a weight or rate only overflows the loss (float32) once training has begun
    low_open: bool = False

    def allowed(self) -> str:
        """The allowed values in words."""
        if self.kind == "flag":
            return "true or false"
        if self.kind == "choice":
            return f"one of {self.choices}"
        return f"a number in {interval(self.low, self.high, low_open=self.low_open)}" + (" or none" if self.default is None else "")

    def problem(self, value: Any) -> str | None:
        """None when ``value`` is allowed, else what is wrong, the bad value and the allowed ones."""
        if self.kind == "flag":
            return None if isinstance(value, bool) else f"must be true or false, got {value!r}"
        if self.kind == "choice":
            return None if value in self.choices else f"must be one of {self.choices}, got {value!r}"
        if value is None and self.default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"must be a finite number ({self.allowed()}), got {value!r}"
        if value < self.low or (self.low_open and value == self.low):
            return f"must be {'greater than' if self.low_open else 'at least'} {self.low:g} ({self.allowed()}), got {value!r}"
        if value > self.high:
            return f"must be at most {self.high:g} ({self.allowed()}), got {value!r}"
        return None


EXTRACTION_TEMPERATURES = ("none", "training")  # PSP's stored softmax: plain, or at the training temperature
ETF_OBJECTIVES = ("ce", "dr")
NCE_NEGATIVES = ("paper", "repo")
FEATURE_DISTANCES = ("l2", "cosine")
FD_SUBSETS = ("old_classes", "all")
FD_WEIGHT_SCHEDULES = ("constant", "sqrt_new_over_old")
_FINETUNING = {"finetune_lr": Param("number", None, low=0.0, low_open=True), "balanced_replay": Param("flag", True)}
_SIMPLEX = {"temperature": Param("number", 1.0, low=1e-3),  # logits / a tinier one overflow to inf in the loss
            "extraction_temperature": Param("choice", "none", EXTRACTION_TEMPERATURES)}
_BCT = {"lam": Param("number", 1.0, low=0.0)}
_MEAN_ALIGN = {"alpha": Param("number", 1.0, low=0.0), "beta": Param("number", 0.1, low=0.0)}
# method -> its hyper-parameters in the dataclass's field order (tests/test_vocab.py compares them with engine.methods)
METHOD_PARAMS: dict[str, dict[str, Param]] = {
    "independent": {},
    "psp": _SIMPLEX,
    "lsp": _SIMPLEX,
    "bct": _BCT,
    "bct_er": {**_BCT, **_FINETUNING},
    "cores": {},
    "dsimplex_fd": {**_FINETUNING, "weight": Param("number", 10.0, low=0.0),
                    "distance": Param("choice", "cosine", FEATURE_DISTANCES),
                    "distill_on": Param("choice", "old_classes", FD_SUBSETS),
                    "weight_schedule": Param("choice", "sqrt_new_over_old", FD_WEIGHT_SCHEDULES)},
    "dsimplex_hoc": {**_FINETUNING, "lam": Param("number", 0.1, low=0.0, high=1.0),
                     "rho": Param("number", 10.0, low=0.0, low_open=True),
                     "negatives": Param("choice", "repo", NCE_NEGATIVES)},
    "er": _FINETUNING,
    "etf": {"objective": Param("choice", "ce", ETF_OBJECTIVES)},
    "mean_align": _MEAN_ALIGN,
    "mean_align_er": {**_MEAN_ALIGN, **_FINETUNING},
}
METHOD_NAMES = tuple(METHOD_PARAMS)
# names retired because they claimed a paper the code does not implement: old name -> one-line hint
RETIRED_METHODS = {old: f"{old!r} was a class-mean alignment stand-in, not Meng et al. 2021's LCE; it is now {new!r}"
                   for old, new in (("lce", "mean_align"), ("lce_er", "mean_align_er"))}
DATASET_NAMES = ("digits", "shapes", "cifar10", "cifar100", "fashion", "imagefolder")
TEXT_DATASET_NAMES = ("wordnet",)  # text corpora, for comparing text encoders (engine.data.wordnet); not for training
# the classes of the datasets whose count is fixed (shapes generates as many as asked; a folder has its own)
DATASET_CLASSES = {"digits": 10, "cifar10": 10, "cifar100": 100, "fashion": 10}
BACKBONE_NAMES = ("small_cnn", "small_fc_cnn", "resnet18_cifar", "resnet32_cifar", "senet18_cifar", "resnet18", "resnet34",
                  "resnet50", "resnet101", "resnet152", "alexnet", "vgg16", "regnet_x_3_2gf", "regnet_y_400mf", "densenet121",
                  "efficientnet_b0", "efficientnet_b3", "mobilenet_v3_small", "convnext_tiny", "swin_t", "maxvit_t",
                  "vit_b_32", "vit_b_16", "vit_l_16")
OPTIMIZERS = ("sgd", "adam")
LR_SCHEDULES = ("constant", "step", "cosine")
RUN_PROTOCOLS = ("closed-set", "open-set")  # which images are queries and gallery
GALLERY_KINDS = ("instance", "template")  # what a gallery item is (config key eval.gallery; "protocol" is the run's)
EVAL_CLASSES = ("all", "seen")
# what makes a gallery item relevant to a query (engine.metrics.relevance): the same class label, judgements
# (qrels: query id -> relevant item ids, graded or binary), or none (the new model's top-k on the new gallery)
RELEVANCE = ("labels", "qrels", "none")
RELEVANCE_K = 10  # default depth of the top-k lists an upgrade check on sources reads (check-upgrade --k)
# Recall@k when negatives tie a query's best positive (engine.metrics.ties): every Recall@k cell is also read three
# ways, a tied negative ranking before the positive (pessimistic, the engine's rule: its value and verdict apply it to
# exact ties), in random order (expected) or after it (optimistic). Two cosine similarities (unit rows: the score
# scale is 1) count as tied within RANK_TIE_TOLERANCE: about 8 float32 ulps at 1.0, the few ulps by which two BLAS
# paths' products of the same rows differ (engine.metrics.device); a tie float32 cannot resolve is reported as one.
RANK_TIE_READINGS = ("pessimistic", "expected", "optimistic")
RANK_TIE_TOLERANCE = 1e-6


def decision_metric(relevance: str = "labels", k: int = RELEVANCE_K, *, streamed: bool = False) -> str:
    """The metric the upgrade decision is taken on by default, by relevance: mAP with class labels (the full ranking in
    memory; mAP@k on streamed top-k lists), nDCG@k with qrels (BEIR's), neighbour recall@k label-free. Not Recall@k:
    it flatters backfilling (one re-embedded item of the query's class can make a hit while most of the gallery is old),
    so a plan read on it spends less than the upgrade needs; Recall@k stays available with --metric and is shown beside."""
    if relevance not in RELEVANCE:
        raise ValueError(f"unknown relevance {relevance!r}; use one of {', '.join(RELEVANCE)}")
    return {"labels": f"map@{k}" if streamed else "map", "qrels": f"ndcg@{k}", "none": f"neighbour_recall@{k}"}[relevance]
VIEWS = tuple(VIEW_KINDS)
TRAINING_MODES = ("cumulative", "finetune")
# models trained from scratch: "auto" = the same initial weights at every step only where the method's paper
# prescribes it (CoReS, paper 002 Sec. 5.1 / Tab. 9), a new seed per step otherwise; "same" / "per_step" force one
INIT_SEEDS = ("auto", "same", "per_step")
# how the d-Simplex fixed classifier is scaled (engine.models.heads.DSIMPLEX_NORMALIZATIONS): unit rows (iamcl2r and
# CL2R code), unit Frobenius norm after centring (paper 001 App. D), Frobenius norm before centring (CoReS code)
DSIMPLEX_NORMALIZATIONS = ("row", "frobenius", "frobenius_uncentred")
DSIMPLEX_METHODS = ("cores", "dsimplex_fd", "dsimplex_hoc")  # methods whose head is the d-Simplex (Method.head)
# which epoch's weights a step keeps: the last, or the best classification accuracy on a held-out validation slice
CHECKPOINT_SELECTIONS = ("last", "best_val")
DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")  # engine.models.device.pick_device
DEVICE_CHOICES = ("auto", "cpu", "cuda")  # what the forms offer (cuda:N is typed in a config)



@dataclass(frozen=True)
class Rule:
    """How check-upgrade judges the compatibility interval (engine.metrics.decision.decide): a margin in points (> 0: a
    non-inferiority test) and the ECC tie rule (:data:`engine.core.kinds.TIES`)."""

    margin: float = 0.0
    ties: str = STRICT

    def __post_init__(self) -> None:
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) or not 0 <= self.margin < 100:
            raise ValueError(f"the margin is in points and must lie in [0, 100), got {self.margin!r}")
        check_ties(self.ties)

    @property
    def threshold(self) -> float:
        """The mean difference (a fraction) the cross-test must clear."""
        return -self.margin / 100

    @property
    def name(self) -> str:
        """The rule in words, as the output names it."""
        op = TIES[self.ties].label
        if self.margin > 0:
            return f"non-inferiority margin {self.margin:g} points (cross-test {op} self-test - {self.margin:g} points)"
        if self.ties == STRICT:
            return "strict ECC (cross-test > self-test, the papers' rule)"
        return "ECC with ties passing (cross-test >= self-test)"


MAX_RESAMPLES = 100_000  # bootstrap resamples: 100x the default, a 0.1-point Monte Carlo error; more only costs time


def check_resamples(value: object, what: str = "resamples") -> int:
    """A bootstrap's resamples: an integer in 1..:data:`MAX_RESAMPLES`; one line otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RESAMPLES:
        raise ValueError(f"{what} must be an integer from 1 to {MAX_RESAMPLES:,}, got {value!r}")
    return value
VERIFICATION = "verification"  # paper 002's pair-verification accuracy (engine.metrics.verification)


def parse_metric(name: str, *, pairs: bool = True) -> tuple[str, int | None]:
    """Split a metric name into ``("recall", k)``, ``("map", None)``, ``("map", k)`` or ``("verification", None)``.

    ``pairs=False`` accepts only the ranking metrics (for callers that have no image pairs).
    """
    key = str(name).strip().lower()
    if pairs and key == VERIFICATION:
        return VERIFICATION, None
    parts = metric_parts(key)
    if parts is None or parts[0] not in ("recall", "map") or parts == ("recall", None):
        extra = ", 'map@K' or 'verification'" if pairs else " or 'map@K'"
        raise ValueError(f"unknown metric {name!r}; use 'recall@K' (1 <= K <= {MAX_K:,}), 'map'{extra}")
    return parts
