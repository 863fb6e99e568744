"""A claim's study config at a scale, its stored runs (found by config hash) and the run jobs for the missing seeds.

One run job per seed (``{"config": ...}`` with that seed alone): the experiments it stores have exactly the config
hash a many-seed study's would, so a rerun finds every finished seed again and queues only the rest.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import Engine

from engine.core.config import RunConfig, config_from_dict
from engine.reproduce.claims import SCALES, Claim
from engine.results.record import config_hash
from storage import enqueue_job, find_experiment_by_hash, find_identical_job, init_db, session_scope

# Per scale: images per class (train / test), backbone, width, epochs, default seeds. `reduced`: the numbers
# (10 seeds, 4,000 queries = 400 test images x 10 classes, 2,000+ images per cell) on a backbone that fits its training
# images, as the papers' theories assume (issue 38: small_fc_cnn reaches 99.7-100 % training accuracy on 4-10 classes
# in 30 epochs, small_cnn of width 32 67-80 %); `paper`: all of Fashion-MNIST. `smoke`: seconds, the layout only.
SCALE_SETTINGS: dict[str, dict[str, Any]] = {
    "smoke": dict(train_per_class=16, test_per_class=8, backbone="small_cnn", width=8, epochs=1, seeds=2),
    "reduced": dict(train_per_class=600, test_per_class=400, backbone="small_fc_cnn", width=128, epochs=30, seeds=10),
    "paper": dict(train_per_class=6000, test_per_class=1000, backbone="small_fc_cnn", width=128, epochs=30, seeds=10),
}


def study_config(claim: Claim, scale: str, seeds: int | None = None, *, device: str = "auto") -> RunConfig:
    """The study config of ``claim`` at ``scale`` with ``seeds`` seeds (0 .. N-1; default the scale's)."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; use one of {', '.join(SCALES)}")
    s = SCALE_SETTINGS[scale]
    n = s["seeds"] if seeds is None else seeds
    if n < 1:
        raise ValueError(f"--seeds must be at least 1, got {n}")
    metric = claim.our_convention["metric"]
    data: dict[str, Any] = dict(
        name=f"reproduce {claim.name} ({scale})", methods=list(claim.methods), method_params=claim.method_params,
        seeds=list(range(n)), device=device,
        dataset=dict(name="fashion", train_per_class=s["train_per_class"], test_per_class=s["test_per_class"]),
        scenario=dict(claim.scenario),
        model=dict(backbone=s["backbone"], width=s["width"], **claim.model),
        eval=dict(protocol="open-set" if claim.scenario.get("held_out_classes") else "closed-set",
                  eval_classes=claim.our_convention["eval_classes"],
                  gallery="template" if claim.our_convention["gallery"] == "template" else "instance", metrics=[metric]),
        training=dict(epochs=s["epochs"], batch_size=64, lr=0.05, lr_schedule="cosine", **claim.training),
    )
    return config_from_dict(data)


def seed_config(cfg: RunConfig, seed: int) -> RunConfig:
    """The one-seed study config of ``seed`` (what a run job carries)."""
    return dataclasses.replace(cfg, seed=seed, seeds=())


def experiment_hash(cfg: RunConfig, seed: int, method: str) -> str:
    """The config hash the pipeline stores ``method``'s experiment of ``seed`` under."""
    return config_hash(seed_config(cfg, seed).for_method(method).to_dict())


def stored_runs(db: Engine, cfg: RunConfig) -> dict[tuple[int, str], int]:
    """``{(seed, method): experiment id}`` of the finished experiments of ``cfg``."""
    init_db(db)
    out = {}
    with session_scope(db) as s:
        for seed in cfg.seeds:
            for method in cfg.methods:
                exp = find_experiment_by_hash(s, experiment_hash(cfg, seed, method))
                if exp is not None and exp.status == "done":
                    out[(seed, method)] = exp.id
    return out


def missing_seeds(db: Engine, cfg: RunConfig) -> list[int]:
    """The seeds with at least one method not finished."""
    done = stored_runs(db, cfg)
    return [seed for seed in cfg.seeds if any((seed, m) not in done for m in cfg.methods)]


def enqueue_missing(db: Engine, cfg: RunConfig) -> tuple[list[int], list[int]]:
    """Queue a run job for every missing seed that no queued or running job covers; return (new ids, already queued)."""
    new, queued = [], []
    with session_scope(db) as s:
        for seed in missing_seeds(db, cfg):
            payload = {"config": seed_config(cfg, seed).to_dict()}
            same = find_identical_job(s, "run", payload)
            if same is not None and same.status in ("queued", "running"):
                queued.append(same.id)
            else:
                new.append(enqueue_job(s, "run", payload))
    return new, queued
