"""Strict run configuration: one frozen dataclass per section, built from TOML or a dict.

Unknown keys are rejected with the list of known ones, so a typo never silently falls back to a
default. The config is stored with every experiment (``to_dict``) so that each number in the
database can be reproduced with ``python -m engine run CONFIG.toml``.

A run with several ``methods`` is a *study*: every method runs on the same data, scenario and
seed, and the results are stored side by side.
"""
from __future__ import annotations

import dataclasses
import math
import os
import stat
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from engine.core import vocab
from engine.core.splits import check_held_out, check_replacements, check_split
from engine.core.vocab import INIT_SEEDS


# Keys added after runs were stored, with the value at which a run computes exactly what it computed before the
# key existed. ``neutral_for_hash`` leaves them out at that value, so a finished run is still found by its config's
# hash (engine.results.record.config_hash) and not trained again; any other value is part of the hash as usual.
NEUTRAL_ADDITIONS: dict[tuple[str, str], Any] = {
    ("model", "dsimplex_normalization"): "row",
    ("training", "select"): "last",
    ("training", "val_fraction"): None,
    ("eval", "also_eval_classes"): [],
}


def neutral_for_hash(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without the :data:`NEUTRAL_ADDITIONS` keys that hold their neutral value (a shallow copy)."""
    out = dict(config)
    for (section, key), neutral in NEUTRAL_ADDITIONS.items():
        part = out.get(section)
        if isinstance(part, dict) and key in part and part[key] == neutral:
            out[section] = {k: v for k, v in part.items() if k != key}
    return out


@dataclass(frozen=True)
class DatasetConfig:
    name: str = "shapes"  # digits | shapes | cifar10 | cifar100 | imagefolder
    root: str = "data"
    num_classes: int | None = None  # shapes: number of classes generated (None = what the scenario needs)
    train_per_class: int = 60  # built-in datasets: images per class for training / query draws
    test_per_class: int = 20  # built-in datasets: images per class for the test / gallery draws
    # cifar10/cifar100/imagefolder (and digits): keep only the first training images of each class, in file
    # order (None: all); 300 on cifar100 is paper 003's CIFAR100R. shapes sets its sizes with train_per_class
    max_per_class: int | None = None
    image_size: int | None = None  # imagefolder: resize to this size
    download: bool = False  # cifar: download when the network allows it
    augment: bool = True  # random crop + flip for 32x32 RGB training data


@dataclass(frozen=True)
class EvalConfig:
    protocol: str = "closed-set"  # closed-set (test split as query and gallery, own image excluded) | open-set
    open_set_classes: int = 10  # open-set on built-in data: held-out classes evaluated
    open_set_dataset: str | None = None  # open-set on real data: e.g. "cifar10" (its train = queries, test = gallery)
    eval_classes: str = "all"  # all test classes, or only those the gallery model was trained on ("seen")
    # further conventions whose matrices are computed and stored beside eval_classes' (same views and metrics), e.g.
    # ["all"] with eval_classes = "seen": the same cells with the classes the gallery model never trained on mixed in
    also_eval_classes: tuple[str, ...] = ()
    gallery: str = "instance"  # instance | template (class-mean templates, as the IAM-CL2R code)
    metrics: tuple[str, ...] = ("recall@1", "map")
    topk: int | None = None  # PSP/LSP top-k sparsification (paper 000, Appendix K), e.g. 128
    train_features_per_class: int = 30  # training images per class also embedded by every model (adapter training)
    views: tuple[str, ...] = ("auto",)  # auto: encoder + the method's own views (psp/lsp); or e.g. ["encoder", "psp", "lsp"]


@dataclass(frozen=True)
class ScenarioConfig:
    initial_classes: int = 10
    increment: int = 10
    num_steps: int | None = None  # None: as many as the classes allow
    class_order_seed: int = 0
    training: str = "cumulative"  # cumulative (D^t = D^{t-1} + X^t) | finetune (new classes + replay)
    replay_per_class: int = 0
    replacement_steps: tuple[int, ...] = ()
    # open set on the training dataset itself: the last N classes of the class order are never trained and are the
    # only evaluation classes (needs eval.protocol = "open-set"; engine.data.scenario, engine.run.data_setup)
    held_out_classes: int = 0


@dataclass(frozen=True)
class ModelConfig:
    backbone: str = "small_cnn"
    width: int | None = None  # small_cnn / small_fc_cnn output size (small_cnn: its channel width)
    feature_dim: int | None = None  # projection to this size (None: backbone output; d-Simplex: K - 1)
    dsimplex_classes: int | None = None  # K pre-allocated classes for fixed heads (None: total classes)
    # models trained from scratch: "auto" = what the method's paper prescribes (Method.init_seed: the same
    # initial weights at every step for CoReS, paper 002 Sec. 5.1 / Tab. 9 "SAME"; a new seed per step, i.e.
    # independently trained models, for every other method); "same" or "per_step" force one for all methods
    init_seed: str = "auto"
    # d-Simplex scaling (engine.models.heads.dsimplex_prototypes): "row" (papers 001/003's code), "frobenius"
    # (paper 001 App. D) or "frobenius_uncentred" (paper 002's code); only methods with a d-Simplex head use it
    dsimplex_normalization: str = "row"


@dataclass(frozen=True)
class TrainingConfig:
    epochs: int = 10
    batch_size: int = 64
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_schedule: str = "cosine"  # constant | step | cosine
    lr_milestones: tuple[int, ...] = ()
    lr_gamma: float = 0.1
    amp: bool = True  # mixed precision, only ever used on CUDA
    num_workers: int = 0
    # weights a step keeps: "last" epoch, or "best_val" = the epoch with the best classification accuracy on a
    # seeded held-out share of the step's training images (paper 002's released code selects per epoch)
    select: str = "last"
    val_fraction: float | None = None  # best_val: share of each class's training images held out (None: 0.1)


@dataclass(frozen=True)
class RunConfig:
    name: str = "experiment"
    methods: tuple[str, ...] = ("independent",)
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed: int = 0
    seeds: tuple[int, ...] = ()  # several seeds (data draws, order, initialisation) per method; () = just `seed`
    device: str = "auto"
    # intra-op threads of the training and feature-extraction arithmetic, whatever the machine or the worker's share
    # of the cores: 1 and 2 threads train different models (engine.models.arithmetic says where), so the count is part
    # of the result; more is faster on an idle machine and reproducible wherever the same count is given
    compute_threads: int = 1
    dataset: DatasetConfig = DatasetConfig()
    eval: EvalConfig = EvalConfig()
    scenario: ScenarioConfig = ScenarioConfig()
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()

    def for_method(self, method: str) -> "RunConfig":
        """The single-method config of one experiment of this study."""
        params = {method: self.method_params[method]} if method in self.method_params else {}
        return dataclasses.replace(self, methods=(method,), method_params=params)

    def to_dict(self) -> dict[str, Any]:
        """A JSON/TOML-ready dict that ``from_dict`` turns back into an equal config."""
        return _to_plain(self)


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, tuple):
        return [_to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    return obj


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ValueError(f"config section [{where}] must be a table, got {type(value).__name__}")
        return _build(hint, value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"config key {where} must be a list, got {value!r}")
        inner = get_args(hint)[0]
        return tuple(_coerce(v, inner, where) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"config key {where} must be a table, got {value!r}")
        return {str(k): dict(v) if isinstance(v, dict) else v for k, v in value.items()}
    args = [a for a in get_args(hint) if a is not type(None)]
    if value is None:
        if type(None) in get_args(hint):
            return None
        raise ValueError(f"config key {where} cannot be empty")
    target = args[0] if args else hint
    if target is Any:
        return value
    if target is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if target in (int, float, str, bool) and not (isinstance(value, target) and not (target is int and isinstance(value, bool))):
        raise ValueError(f"config key {where} must be {target.__name__}, got {value!r}")
    return value


def _build(cls: type, data: dict[str, Any], where: str = "") -> Any:
    hints = get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        section = f"[{where}]" if where else "the top level"
        raise ValueError(f"unknown config key(s) {', '.join(unknown)} in {section}; known keys: {', '.join(known)}")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


Rule = Callable[[Any], "str | None"]  # None when the value is allowed, else a description of what is


def _choice(what: str, allowed: tuple[str, ...]) -> Rule:
    return lambda v: None if v in allowed else f"must be one of {', '.join(allowed)}, got {v!r} (unknown {what})"


def _number(low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False) -> Rule:
    """A finite number in the interval; ``None`` passes (it means "default")."""
    text = vocab.interval(low, high, low_open=low_open, high_open=high_open)

    def rule(v: Any) -> str | None:
        if v is None:
            return None
        ok = math.isfinite(v) and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
        return None if ok else f"must be a finite number in {text}, got {v!r}"
    return rule


def _method(v: str) -> str | None:
    if v in vocab.RETIRED_METHODS:
        return f"is refused: {vocab.RETIRED_METHODS[v]}"
    return _choice("method", vocab.METHOD_NAMES)(v)


def _device(v: str) -> str | None:
    return None if vocab.DEVICE.match(v) else f"must be one of auto, cpu, cuda, cuda:N, got {v!r} (unknown device)"


def _metric(v: str) -> str | None:
    try:
        vocab.parse_metric(v)
    except ValueError as exc:
        return f"is not valid: {exc}"
    return None


def _view(v: str) -> str | None:
    return None if v in vocab.VIEWS or v == "auto" else f"must be one of auto, {', '.join(vocab.VIEWS)}, got {v!r} (unknown view)"


def _open_set_dataset(v: str | None) -> str | None:
    return None if v is None else _choice("open-set dataset", vocab.DATASET_NAMES)(v)


def _text(v: str) -> str | None:
    return None if v.strip() else f"must be a non-empty text, got {v!r}"


MAX_RUN_NAME = 160  # leaves room for "/method/seed N" in the experiment names (storage.MAX_NAME)


def _name(v: str) -> str | None:
    """A run's name: what every page, export and the bundle's study.toml show (``storage.name_problem``)."""
    if not v.strip():
        return f"must be a non-empty text, got {v!r}"
    from storage import name_problem  # the one name rule; imported here so that reading this module loads no numpy

    return name_problem(v, what="", limit=MAX_RUN_NAME)


_POSITIVE = _number(1)
MAX_COMPUTE_THREADS = 1024
MAX_CLASSES = 100_000
MAX_GENERATED_IMAGES = 250_000  # shapes: classes x (train_per_class + test_per_class), about 3 GB as float32
_COUNT = _number(0)
# key -> rule; a list or tuple value is checked item by item.
RULES: dict[str, Rule] = {
    "name": _name, "methods": _method, "seed": _number(0, 2**32 - 1),
    "seeds": _number(0, 2**32 - 1), "device": _device, "compute_threads": _number(1, MAX_COMPUTE_THREADS),
    "dataset.name": _choice("dataset", vocab.DATASET_NAMES), "dataset.root": _text,
    "dataset.num_classes": _number(1, MAX_CLASSES), "dataset.train_per_class": _number(1, 100_000),
    "dataset.test_per_class": _number(1, 100_000), "dataset.max_per_class": _number(1, 1_000_000),
    "dataset.image_size": _number(1, 1024),
    "eval.protocol": _choice("protocol", vocab.RUN_PROTOCOLS), "eval.open_set_classes": _number(1, 100_000),
    "eval.open_set_dataset": _open_set_dataset, "eval.eval_classes": _choice("eval_classes", vocab.EVAL_CLASSES),
    "eval.also_eval_classes": _choice("eval_classes", vocab.EVAL_CLASSES),
    "eval.gallery": _choice("gallery kind", vocab.GALLERY_KINDS), "eval.metrics": _metric,
    "eval.topk": _POSITIVE, "eval.train_features_per_class": _number(0, 100_000), "eval.views": _view,
    "scenario.initial_classes": _number(1, MAX_CLASSES), "scenario.increment": _number(0, MAX_CLASSES), "scenario.num_steps": _number(1, 10_000),
    "scenario.class_order_seed": _number(0, 2**32 - 1), "scenario.training": _choice("training mode", vocab.TRAINING_MODES),
    "scenario.replay_per_class": _number(0, 100_000), "scenario.replacement_steps": _number(2),
    "scenario.held_out_classes": _number(0, MAX_CLASSES),
    "model.backbone": _choice("backbone", vocab.BACKBONE_NAMES), "model.width": _number(1, 2048),
    "model.feature_dim": _number(1, 65_536), "model.dsimplex_classes": _number(2, 10_000),
    "model.init_seed": _choice("init_seed", INIT_SEEDS),
    "model.dsimplex_normalization": _choice("d-Simplex normalization", vocab.DSIMPLEX_NORMALIZATIONS),
    "training.epochs": _number(1, 100_000), "training.batch_size": _number(1, 4096),
    "training.optimizer": _choice("optimizer", vocab.OPTIMIZERS), "training.lr": _number(0, 100, low_open=True),
    "training.momentum": _number(0, 1, high_open=True), "training.weight_decay": _number(0, 100),
    "training.lr_schedule": _choice("lr_schedule", vocab.LR_SCHEDULES), "training.lr_milestones": _POSITIVE,
    "training.lr_gamma": _number(0, 100, low_open=True), "training.num_workers": _number(0, 64),
    "training.select": _choice("checkpoint selection", vocab.CHECKPOINT_SELECTIONS),
    "training.val_fraction": _number(0, 0.5, low_open=True),
}


def _check_values(cfg: RunConfig) -> None:
    """Every value of ``RULES`` and the rules that tie keys together; ValueError naming the key, value and allowed ones."""
    plain = cfg.to_dict()
    for key, rule in RULES.items():
        section, _, name = key.rpartition(".")
        value = (plain[section] if section else plain)[name]
        for item in value if isinstance(value, list) else [value]:
            problem = rule(item)
            if problem:
                raise ValueError(f"config key {key} {problem}")
    for key in ("methods", "eval.metrics", "eval.views"):
        section, _, name = key.rpartition(".")
        items = (plain[section] if section else plain)[name]
        if not items:
            raise ValueError(f"config key {key} is empty; give at least one")
        if len(set(items)) != len(items):
            raise ValueError(f"config key {key} = {items!r} lists an entry twice")
    if len(set(cfg.seeds)) != len(cfg.seeds):
        raise ValueError(f"config key seeds = {list(cfg.seeds)!r} lists a seed twice")
    if "auto" in cfg.eval.views and len(cfg.eval.views) > 1:
        raise ValueError(f"config key eval.views = {list(cfg.eval.views)!r}: 'auto' stands alone; allowed: ['auto'] or views")
    _check_held_out(cfg)
    _check_also_eval_classes(cfg.eval)
    if cfg.eval.open_set_dataset is not None and cfg.eval.open_set_dataset == cfg.dataset.name != "shapes":
        raise ValueError(f"config key eval.open_set_dataset = {cfg.eval.open_set_dataset!r} is the training dataset itself; "
                         f"open-set classes must differ from the training classes")
    if cfg.dataset.max_per_class is not None and cfg.dataset.name == "shapes":
        raise ValueError("config key dataset.max_per_class does not apply to shapes, which generates "
                         "dataset.train_per_class / test_per_class images per class; set those instead")
    for key, only in (("num_classes", "shapes"), ("image_size", "imagefolder")):
        if getattr(cfg.dataset, key) is not None and cfg.dataset.name != only:
            raise ValueError(f"config key dataset.{key} applies only to dataset {only}; {cfg.dataset.name!r} would ignore it")
    if cfg.eval.open_set_dataset is not None and cfg.eval.protocol != "open-set":
        raise ValueError(f"config key eval.open_set_dataset = {cfg.eval.open_set_dataset!r} applies only to "
                         f"eval.protocol = 'open-set', got {cfg.eval.protocol!r}")
    _check_training(cfg.training)
    _check_scenario(cfg)
    norm = cfg.model.dsimplex_normalization
    if norm != "row" and not set(cfg.methods) & set(vocab.DSIMPLEX_METHODS):
        raise ValueError(f"config key model.dsimplex_normalization = {norm!r} applies only to the methods with a "
                         f"d-Simplex head ({', '.join(vocab.DSIMPLEX_METHODS)}), none of which is in methods "
                         f"{list(cfg.methods)}; leave it 'row'")


def _check_also_eval_classes(e: EvalConfig) -> None:
    """``eval.eval_classes`` and ``eval.also_eval_classes``: each convention once, ``seen`` only on the closed set."""
    also = list(e.also_eval_classes)
    if e.eval_classes in also or len(set(also)) != len(also):
        raise ValueError(f"config key eval.also_eval_classes = {also!r} repeats a convention (eval.eval_classes = "
                         f"{e.eval_classes!r} is always stored); list each other convention once")
    if "seen" in (e.eval_classes, *also) and e.protocol == "open-set":
        key = "eval_classes" if e.eval_classes == "seen" else "also_eval_classes"
        raise ValueError(f"config key eval.{key} = 'seen' needs the closed-set protocol: open-set classes are never trained on")


def _check_held_out(cfg: RunConfig) -> None:
    """``scenario.held_out_classes`` against the evaluation keys it decides (its open-set classes are the held-out ones)."""
    n, e = cfg.scenario.held_out_classes, cfg.eval
    if not n:
        return
    key = f"config key scenario.held_out_classes = {n}"
    if e.protocol != "open-set":
        raise ValueError(f"{key} evaluates on the held-out classes, an open-set protocol; set eval.protocol = 'open-set' "
                         f"(got {e.protocol!r}) or hold out 0 classes")
    if e.open_set_dataset is not None:
        raise ValueError(f"{key} takes the open-set classes from the training dataset, but eval.open_set_dataset = "
                         f"{e.open_set_dataset!r} names another source; keep one of the two")
    if e.eval_classes == "seen":
        raise ValueError(f"{key} contradicts eval.eval_classes = 'seen': the held-out classes are never trained, so no "
                         f"model has seen them; use eval_classes = 'all'")
    if e.open_set_classes != EvalConfig.open_set_classes:  # the default is what every stored config carries
        raise ValueError(f"config key eval.open_set_classes = {e.open_set_classes} counts the extra shapes classes "
                         f"generated for the open set; with {key[len('config key '):]} the held-out classes are the "
                         f"open-set classes: leave eval.open_set_classes out")


def _check_training(t: TrainingConfig) -> None:
    milestones = list(t.lr_milestones)
    if milestones != sorted(set(milestones)):
        raise ValueError(f"config key training.lr_milestones = {milestones!r} must be strictly increasing")
    if milestones and t.lr_schedule != "step":
        raise ValueError(f"config key training.lr_milestones = {milestones!r} applies only to lr_schedule = 'step', "
                         f"got {t.lr_schedule!r}")
    if t.lr_schedule == "step" and not milestones:
        raise ValueError("config key training.lr_schedule = 'step' needs training.lr_milestones (the epochs where the "
                         "rate is multiplied by lr_gamma); without them use 'constant'")
    if t.val_fraction is not None and t.select != "best_val":
        raise ValueError(f"config key training.val_fraction = {t.val_fraction!r} applies only to training.select = "
                         f"'best_val', got {t.select!r}")


def _check_scenario(cfg: RunConfig) -> None:
    """The scenario against the dataset's class count, where the config alone tells it."""
    s, name = cfg.scenario, cfg.dataset.name
    if s.replay_per_class and s.training != "finetune":
        raise ValueError(f"config key scenario.replay_per_class = {s.replay_per_class} applies only to "
                         f"scenario.training = 'finetune', got {s.training!r}")
    topk = cfg.eval.topk  # PSP/LSP of a cell keep gallery model k's C^k outputs; the first model has the fewest
    if topk is not None and topk > s.initial_classes:
        raise ValueError(f"config key eval.topk = {topk} exceeds the {s.initial_classes} outputs the first model's "
                         f"PSP/LSP keep (scenario.initial_classes); use at most {s.initial_classes}")
    classes = vocab.DATASET_CLASSES.get(name, cfg.dataset.num_classes if name == "shapes" else None)
    if name == "shapes":
        _check_generated(cfg)
    steps = s.num_steps
    if classes is not None:
        held = f" with {s.held_out_classes} held out" if s.held_out_classes else ""
        try:
            trained = classes - check_held_out(classes, s.held_out_classes)
            steps = check_split(trained, s.initial_classes, s.increment, s.num_steps)
        except ValueError as exc:
            raise ValueError(f"config [scenario] does not fit the {classes} classes of dataset {name}{held}: {exc}") from None
        k = cfg.model.dsimplex_classes
        if k is not None and k < trained:
            raise ValueError(f"config key model.dsimplex_classes = {k} is smaller than the {trained} "
                             f"{'trained ' if held else ''}classes of dataset {name}{held}")
    try:
        check_replacements(s.replacement_steps, steps or max(s.replacement_steps, default=2))
    except ValueError as exc:
        raise ValueError(f"config key scenario.replacement_steps = {list(s.replacement_steps)!r}: {exc}") from None


def _check_generated(cfg: RunConfig) -> None:
    """The shapes images a run would generate, bounded before any is drawn."""
    d, s, e = cfg.dataset, cfg.scenario, cfg.eval
    classes = d.num_classes or (s.initial_classes + s.increment * (s.num_steps - 1) + s.held_out_classes if s.num_steps else 0)
    generated_open_set = e.protocol == "open-set" and e.open_set_dataset is None and not s.held_out_classes
    classes += e.open_set_classes if generated_open_set else 0
    if classes > MAX_CLASSES:
        raise ValueError(f"config asks dataset shapes for {classes} classes (scenario and open-set); at most {MAX_CLASSES}")
    images = classes * (d.train_per_class + d.test_per_class)
    if images > MAX_GENERATED_IMAGES:
        raise ValueError(f"config asks dataset shapes for {images} images ({classes} classes x "
                         f"{d.train_per_class + d.test_per_class} per class); at most {MAX_GENERATED_IMAGES}: "
                         f"lower dataset.train_per_class / test_per_class or the classes")


def _check_method_params(cfg: RunConfig) -> None:
    stray = sorted(set(cfg.method_params) - set(cfg.methods))
    if stray:
        raise ValueError(f"method_params given for {', '.join(stray)}, which is not in methods {list(cfg.methods)}")
    for method, params in cfg.method_params.items():
        if not isinstance(params, dict):
            raise ValueError(f"config key method_params.{method} = {params!r} must be a table of hyper-parameters")
        accepted = vocab.METHOD_PARAMS[method]
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise ValueError(f"config key method_params.{method} has unknown hyper-parameter(s) {', '.join(unknown)}; "
                             f"allowed: {', '.join(accepted) or 'none (this method takes no hyper-parameters)'}")
        for key, value in params.items():
            problem = accepted[key].problem(value)
            if problem:
                raise ValueError(f"config key method_params.{method}.{key} {problem}")


def _check_text(value: Any, where: str, depth: int = 0) -> None:
    """No NUL character in any key or text (databases refuse them) and no nesting deeper than a config has (the
    ``name`` itself is checked by ``_name``)."""
    if depth > 8:
        raise ValueError(f"config key {where} is nested too deeply")
    if isinstance(value, str) and "\x00" in value and where != "name":  # the name: _name says why, in full
        raise ValueError(f"config key {where or 'name'} contains a NUL character")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and "\x00" in key:
            raise ValueError(f"config key {where + '.' if where else ''}{key!r} contains a NUL character")
        _check_text(item, f"{where}.{key}" if where else str(key), depth + 1)


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Build and validate a RunConfig; ValueError, one line naming the key, for an unknown key, a wrong type, a value
    outside its registry or range (method hyper-parameters included), keys that contradict each other, or a scenario
    that does not fit a dataset whose class count is fixed.

    What needs the data itself (files present, a folder's or generated dataset's classes) is checked by
    ``engine.run.pipeline.check_study`` before anything is written.
    """
    if not isinstance(data, dict):
        raise ValueError(f"a config must be a table of keys, got {type(data).__name__}")
    _check_text(data, "")
    cfg = _build(RunConfig, data)
    if not cfg.methods:
        raise ValueError("config needs at least one method in 'methods'")
    _check_values(cfg)
    _check_method_params(cfg)
    dataset = data.get("dataset", {})
    if cfg.dataset.name == "imagefolder" and "root" not in dataset:
        raise ValueError("config key dataset.root must name the image folder for dataset imagefolder "
                         "(the default 'data' is where the built-in datasets live); give it, e.g. root = \"data/my-images\"")
    return cfg


MAX_CONFIG_BYTES = 1 << 20  # a config is a few hundred bytes; 1 MB leaves room for long comments


def _read_config_text(path: Path) -> str:
    """The text of a regular file of at most ``MAX_CONFIG_BYTES``, opened without blocking (a FIFO, a device or a
    folder is refused at once, never read) and decoded as UTF-8; ValueError naming the file otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise ValueError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot be opened ({exc.strerror or type(exc).__name__})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise ValueError(f"{path}: is {kind}, not a config file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; a config is a short TOML file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start}); save the config as UTF-8 TOML") from None


def load_config(path: str | Path) -> RunConfig:
    """Read a TOML config file (a regular UTF-8 file of at most ``MAX_CONFIG_BYTES``)."""
    path = Path(path)
    text = _read_config_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:
        raise ValueError(f"{path}: not valid TOML (arrays or tables nested too deeply)") from None
    try:
        return config_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


TOML_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def dump_toml(cfg: RunConfig) -> str:
    """A TOML rendering of ``cfg`` (None values are left out: they mean 'default')."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):  # a TOML basic string: backslash, quote and control characters escaped
            return '"' + "".join(TOML_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 32 or ord(c) == 127 else c)
                                 for c in v) + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items() if x is not None) + "}"
        raise TypeError(v)

    plain = cfg.to_dict()
    sections = [k for k, v in plain.items() if isinstance(v, dict) and k != "method_params"]
    lines = [f"{k} = {value(v)}" for k, v in plain.items() if k not in sections and v is not None]
    for section in sections:
        lines.append(f"\n[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in plain[section].items() if v is not None]
    return "\n".join(lines) + "\n"
