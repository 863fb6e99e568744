"""Shared by several test modules; moved from tests/test_app_synthetic.py."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.linalg import expm

from engine.core.config import RunConfig
from engine.jobs.analysis import run_analysis
from engine.metrics import summarize
from storage import (
    add_model_version,
    create_experiment,
    create_study,
    get_engine,
    init_db,
    save_feature_set,
    save_matrix,
    session_scope,
    set_experiment_status,
)

ORDERINGS = ["random", "distance_mse", "distance_cosine"]


def hand_matrix(steps: int, *, good: bool) -> np.ndarray:
    """A lower-triangular Recall@1 matrix: self-tests rise with t; cross-tests beat them only if ``good``.

    For ``good`` every cross-test passes (AC = 1); otherwise every cross-test fails (AC = 0).
    """
    C = np.full((steps, steps), np.nan)
    for t in range(steps):
        for k in range(t + 1):
            C[t, k] = 0.50 + 0.04 * k if t == k else 0.50 + 0.04 * k + (0.02 if good else -0.05) * (t - k)
    return C


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def fill_study(
    db_url: str,
    *,
    steps: int = 3,
    initial_classes: int = 4,
    increment: int = 2,
    per_class: int = 15,
    dim: int = 16,
    methods: Sequence[str] = ("independent", "bct"),
    views: Sequence[str] = ("encoder", "logits", "softmax"),
    analyses: bool = True,
    versions_for: Sequence[str] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Write a finished study (closed-set: query = gallery images) and return its ids and matrices.

    ``versions_for`` limits the methods that get model versions and feature sets (default: all);
    every method gets its matrices.
    """
    db = get_engine(db_url)
    init_db(db)
    rng = np.random.default_rng(seed)
    total = initial_classes + increment * (steps - 1)
    labels = np.repeat(np.arange(total), per_class)
    centres = rng.normal(size=(total, dim)) * 0.7
    latent = centres[labels] + rng.normal(size=(len(labels), dim))  # the images: shared by every model
    cfg = RunConfig(name="synthetic", methods=tuple(methods))
    out: dict[str, Any] = {"experiments": {}, "matrices": {}, "steps": steps, "n": len(labels)}
    with session_scope(db) as s:
        study = create_study(s, name="synthetic", kind="compare", config=cfg.to_dict())
        out["study_id"] = study.id
        for mi, method in enumerate(methods):
            good = mi % 2 == 1  # independent fails ECC, bct passes
            exp = create_experiment(s, name=f"synthetic/{method}", method=method,
                                    config=cfg.for_method(method).to_dict(), config_hash=f"synthetic-{method}",
                                    study_id=study.id)
            out["experiments"][method] = exp.id
            a = rng.normal(size=(dim, dim)) / np.sqrt(dim)
            skew = a - a.T
            for t in range(1, steps + 1) if versions_for is None or method in versions_for else ():
                seen = initial_classes + increment * (t - 1)
                # each step turns the feature space a little (compatible) or a lot (not compatible)
                rot = expm((0.04 if good else 0.5) * (t - 1) * skew)
                noise = (0.9 - 0.08 * t) * rng.normal(size=(len(labels), dim))  # later models see the images better
                enc = ((latent + noise) @ rot.T).astype(np.float32)
                logits = (4.0 * np.eye(total)[labels][:, :seen] + rng.normal(size=(len(labels), seen))).astype(np.float32)
                mv = add_model_version(s, exp.id, t, architecture="small_cnn", method=method, classes=list(range(seen)),
                                       num_outputs=seen, feature_dim=dim,
                                       class_names=[f"class-{c}" for c in range(seen)])
                arrays = {"encoder": enc, "logits": logits, "softmax": _softmax(logits)}
                for split in ("query", "gallery"):
                    for view in views:
                        save_feature_set(s, mv.id, split, view, arrays[view], labels)
            C = hand_matrix(steps, good=good)
            out["matrices"][method] = C
            counts = np.where(np.isnan(C), 0, len(labels)).astype(np.int64)
            for metric, values in (("recall@1", C), ("map", C - 0.1)):
                summary = summarize(values)
                summary["comparable"] = np.tril(np.ones((steps, steps), bool)).tolist()
                save_matrix(s, exp.id, metric=metric, gallery_kind="instance", view="encoder", values=values,
                            valid_queries=counts, no_positive=np.zeros_like(counts), summary=summary)
            set_experiment_status(s, exp.id, "done")
    if analyses:
        first = out["experiments"][methods[0]]
        pair = {"step_a": steps - 1, "step_b": steps, "view": "encoder"}
        run_analysis(db, first, "projection", {**pair, "split": "gallery", "method": "pca", "max_points": 2000})
        run_analysis(db, first, "backfill", {**pair, "orderings": ORDERINGS, "metrics": ["recall@1", "map"]})
        run_analysis(db, first, "geometry", {"view": "encoder", "split": "gallery"})
    return out

