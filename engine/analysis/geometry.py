"""Class geometry of model versions: NC1-NC4, angles between class means, drift, Definition 1, stationarity.

``compute_geometry`` is the ``geometry`` analysis: NC1-NC4 (:mod:`engine.analysis.collapse`) and the angles
between class means for every step, drift and the sampled Definition-1 check between consecutive steps, and
the stationarity probe (:mod:`engine.analysis.stationarity`) of every step. The per-model pieces serve the
``projection`` analysis too (:mod:`engine.analysis.map`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from sqlalchemy import Engine

from engine.analysis.arrays import finite, unit
from engine.analysis.collapse import class_means, collapse_report, probability_simplex_prototypes
from engine.analysis.stationarity import stationarity_probe, turn_angle
from engine.analysis.views import Progress, Version, head_weights, joint_pair, load_view, topk_of
from engine.core.contract import OUTPUT_VIEWS


def class_drift(old: np.ndarray, new: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, cosines)``: cosine between each class's mean under the old and under the new features."""
    classes, mu_old, _ = class_means(old, labels)
    _, mu_new, _ = class_means(new, labels)
    return classes, np.sum(unit(mu_old) * unit(mu_new), axis=1)


def mean_angles(features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Angles in degrees between every pair of centred class means (mu_c - mu_G), upper triangle."""
    _, means, _ = class_means(features, labels)
    centred = unit(means - means.mean(axis=0, keepdims=True))
    i, j = np.triu_indices(len(means), 1)
    cosines = np.clip(np.sum(centred[i] * centred[j], axis=1), -1.0, 1.0)
    return np.degrees(np.arccos(cosines))


def simplex_angle(num_classes: int) -> float:
    """The angle (degrees) between any two vertices of a centred regular simplex: arccos(-1/(C-1))."""
    return math.degrees(math.acos(-1.0 / (num_classes - 1))) if num_classes >= 2 else float("nan")


def definition1(f_old: np.ndarray, f_new: np.ndarray, labels: np.ndarray, *, n_pairs: int, seed: int
                ) -> dict[str, Any]:
    """The sampled Definition-1 check (:func:`engine.metrics.definition1_check`) with JSON-safe floats."""
    from engine.metrics import definition1_check

    out = definition1_check(f_old, f_new, labels, n_pairs=n_pairs, seed=seed)
    return {k: (finite(v) if isinstance(v, float) else v) for k, v in out.items()}


def model_collapse(db: Engine, version: Version, split: str, view: str, *,
                   head: tuple[np.ndarray | None, bool] | None = None, topk: int | None = None) -> dict[str, Any]:
    """NC1-NC4 and the angles between class means of one model on its own view, over the classes it was trained on.

    NC3 compares with the classifier rows (checkpoint) on the encoder view, and with the probability-simplex
    prototypes V^C on output-space views (logits, softmax, PSP, LSP); NC4 uses the stored logits' argmax.
    ``head``: the model's ``head_weights`` when already loaded; ``topk``: the experiment's PSP/LSP top-k.
    """
    features, labels, _ = load_view(db, version, split, view, topk=topk)
    keep = np.isin(labels, version.classes)
    features, labels = features[keep], labels[keep]
    row: dict[str, Any] = {"step": version.step, "model_version_id": version.id, "n": int(len(labels)),
                           "classes": int(len(np.unique(labels))), "notes": []}
    if row["classes"] < 2:
        row["notes"].append(f"{row['classes']} trained class(es) in the {split} split: collapse needs at least 2")
        return row
    weights = None
    if view == "encoder":
        weights, _ = head or head_weights(version)
        if weights is None:
            row["notes"].append("NC3 needs the classifier weights: no checkpoint found")
    elif view in OUTPUT_VIEWS:
        weights = probability_simplex_prototypes(features.shape[1])
    if weights is not None and (weights.shape[1] != features.shape[1] or weights.shape[0] <= labels.max()):
        row["notes"].append(f"NC3 skipped: classifier rows {weights.shape} do not match {features.shape[1]}-d features")
        weights = None
    predictions = None
    try:
        logits = load_view(db, version, split, "logits")[0]
        predictions = np.asarray(logits)[keep].argmax(axis=1)
    except ValueError:
        row["notes"].append("NC4 needs the network's predictions: no logits stored")
    report = collapse_report(features, labels, weights=weights, predictions=predictions)
    row.update({k: finite(v) for k, v in report.items()})
    angles = mean_angles(features, labels)
    row["angles"] = angles.tolist()
    row["angle_mean"], row["angle_std"] = float(angles.mean()), float(angles.std())
    row["simplex_angle"] = simplex_angle(row["classes"])
    return row


def model_stationarity(db: Engine, version: Version, split: str, head: tuple[np.ndarray | None, bool]
                       ) -> tuple[dict[str, Any], np.ndarray | None]:
    """The stationarity probe (:mod:`engine.analysis.stationarity`) of one model on its encoder features of ``split``.

    Prototypes: a fixed head's rows (d-Simplex, ETF), else the learned classifier's weight rows, in class
    order; ``head`` is the model's ``head_weights``. Returns the row and the assigned-prototype centroid.
    """
    weights, fixed = head
    row: dict[str, Any] = {"step": version.step, "classes": len(version.classes), "prototype_cosine": None,
                           "centroid_energy": None, "centroid_turn": None,
                           "prototypes": "fixed" if fixed else "learned classifier rows", "note": None}
    if weights is None:
        row.update(prototypes=None, note="no checkpoint: the classifier's prototypes are unknown")
        return row, None
    try:
        features, labels, _ = load_view(db, version, split, "encoder")
        probe, direction = stationarity_probe(features, labels, weights, list(version.classes))
    except ValueError as exc:  # no encoder features, or classifier rows that do not fit them
        row["note"] = str(exc)
        return row, None
    row.update({k: finite(v) for k, v in probe.items()})
    if direction is None:
        row["note"] = "the prototypes of all assigned classes sum to zero: no centroid direction"
    return row, direction


def compute_geometry(db: Engine, config: dict[str, Any], versions: list[Version], params: dict[str, Any],
                     progress: Progress) -> dict[str, Any]:
    """NC1-NC4 and angles for every step; mean drift and Definition 1 between consecutive steps.

    ``stationarity``: the probe of every step on its encoder features (whatever ``view``), with the angle its
    assigned-prototype centroid turns from the previous step.
    """
    split, view, topk = params["split"], params["view"], topk_of(config)
    models, stationarity = [], []
    direction = None  # the previous step's assigned-prototype centroid
    for i, v in enumerate(versions):
        progress(0.05 + 0.6 * i / max(1, len(versions)), f"collapse of step {v.step}")
        head = head_weights(v)
        row = model_collapse(db, v, split, view, head=head, topk=topk)
        row.pop("angles", None)  # the per-pair angles are shown by the projection analysis
        models.append(row)
        previous = direction
        probe, direction = model_stationarity(db, v, split, head)
        probe["centroid_turn"] = turn_angle(previous, direction)
        stationarity.append(probe)
    pairs = []
    for i, (old, new) in enumerate(zip(versions, versions[1:])):
        progress(0.65 + 0.3 * i / max(1, len(versions) - 1), f"steps {old.step} -> {new.step}")
        pair: dict[str, Any] = {"old_step": old.step, "new_step": new.step}
        f_old, f_new, labels = joint_pair(db, old, new, split, view, topk)
        if f_old.shape[1] != f_new.shape[1]:
            pair["note"] = f"{f_old.shape[1]}-d vs {f_new.shape[1]}-d features: not comparable"
        elif len(np.unique(labels)) >= 2:
            classes, cosines = class_drift(f_old, f_new, labels)
            seen = np.isin(classes, old.classes)
            pair["mean_drift_seen"] = finite(float(cosines[seen].mean())) if seen.any() else None
            pair["mean_drift_all"] = float(cosines.mean())
            pair.update(definition1(f_old, f_new, labels, n_pairs=params["n_pairs"], seed=params["seed"]))
        pairs.append(pair)
    return {"params": params, "models": models, "pairs": pairs, "stationarity": stationarity}
