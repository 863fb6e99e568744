"""Strict run configuration: one frozen dataclass per section, built from TOML or a dict.

Unknown keys are rejected with the list of known ones, so a typo never silently falls back to a
default. The config is stored with every experiment (``to_dict``) so that each number in the
database can be reproduced with ``python -m engine run CONFIG.toml``.

A run with several ``methods`` is a *study*: every method runs on the same data, scenario and
seed, and the results are stored side by side.
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints


INIT_SEEDS = ("auto", "same", "per_step")


@dataclass(frozen=True)
class DatasetConfig:
    name: str = "shapes"  # digits | shapes | cifar10 | cifar100 | imagefolder
    root: str = "data"
    num_classes: int | None = None  # shapes: number of classes generated (None = what the scenario needs)
    train_per_class: int = 60  # built-in datasets: images per class for training / query draws
    test_per_class: int = 20  # built-in datasets: images per class for the test / gallery draws
    image_size: int | None = None  # imagefolder: resize to this size
    download: bool = False  # cifar: download when the network allows it
    augment: bool = True  # random crop + flip for 32x32 RGB training data


@dataclass(frozen=True)
class EvalConfig:
    protocol: str = "closed-set"  # closed-set (test split as query and gallery, own image excluded) | open-set
    open_set_classes: int = 10  # open-set on built-in data: held-out classes evaluated
    open_set_dataset: str | None = None  # open-set on real data: e.g. "cifar10" (its train = queries, test = gallery)
    eval_classes: str = "all"  # all test classes, or only those the gallery model was trained on ("seen")
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


@dataclass(frozen=True)
class ModelConfig:
    backbone: str = "small_cnn"
    width: int | None = None  # small_cnn channel width / output size
    feature_dim: int | None = None  # projection to this size (None: backbone output; d-Simplex: K - 1)
    dsimplex_classes: int | None = None  # K pre-allocated classes for fixed heads (None: total classes)
    # models trained from scratch: "auto" = what the method's paper prescribes (Method.init_seed: the same
    # initial weights at every step for CoReS, paper 002 Sec. 5.1 / Tab. 9 "SAME"; a new seed per step, i.e.
    # independently trained models, for every other method); "same" or "per_step" force one for all methods
    init_seed: str = "auto"


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


@dataclass(frozen=True)
class RunConfig:
    name: str = "experiment"
    methods: tuple[str, ...] = ("independent",)
    method_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed: int = 0
    seeds: tuple[int, ...] = ()  # several seeds (data draws, order, initialisation) per method; () = just `seed`
    device: str = "auto"
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


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Build and validate a RunConfig; unknown keys and wrong types raise ValueError."""
    cfg = _build(RunConfig, data)
    if cfg.model.init_seed not in INIT_SEEDS:
        raise ValueError(f"model.init_seed must be one of {', '.join(INIT_SEEDS)}, got {cfg.model.init_seed!r}")
    if not cfg.methods:
        raise ValueError("config needs at least one method in 'methods'")
    if len(set(cfg.seeds)) != len(cfg.seeds):
        raise ValueError(f"seeds must not repeat, got {list(cfg.seeds)}")
    stray = sorted(set(cfg.method_params) - set(cfg.methods))
    if stray:
        raise ValueError(f"method_params given for {', '.join(stray)}, which is not in methods {list(cfg.methods)}")
    return cfg


def load_config(path: str | Path) -> RunConfig:
    """Read a TOML config file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from None
    try:
        return config_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def dump_toml(cfg: RunConfig) -> str:
    """A TOML rendering of ``cfg`` (None values are left out: they mean 'default')."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
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
