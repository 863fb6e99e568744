"""Analyses the worker computes for the dashboard, stored with ``storage.save_analysis``.

Kinds (``run_analysis(db, experiment_id, kind, params)``):

* ``projection``: old (step a) and new (step b) features of one split and view, subsampled (seeded,
  the same images for both models) and embedded together in 2-D (UMAP, or PCA as the fast option),
  with the class means and, for fixed-prototype heads on the encoder view, the prototypes; per-class
  drift (cosine between the old and new class mean), the angles between centred class means, NC1-NC4
  per model (:mod:`engine.collapse`) and the sampled Definition-1 check.
* ``backfill``: partial-backfilling curves (:mod:`engine.backfill`) of the new model's queries against
  the old gallery being re-embedded by the new model, for several orderings, with M-tilde and the
  fraction needed to reach the new model's self-test.
* ``geometry``: NC1-NC4 and the angles between class means for every step, and drift / Definition 1
  between consecutive steps; the stationarity probe (:mod:`engine.stationarity`) of every step.

Feature views: the engine stores the raw views ``encoder``, ``logits`` and ``softmax`` per model
version and split. ``psp`` / ``lsp`` are derived from ``softmax`` / ``logits`` by
:func:`engine.features.output_view`, the derivation the compatibility matrices use, with the
experiment's ``eval.topk``. When two models are compared in one space (map, drift, Definition 1,
backfilling, neighbours), both keep the classes of the *gallery* (old) model, aligned by class name
(:func:`engine.checkpoints.classes.aligned_columns`: the first C^k outputs for a training run's nested
models), as the compatibility matrix's cross-test does; NC1-NC4 and angles use each model's own classes.

Parameters, keys, view names and point kinds live in :mod:`engine.contract` (the dashboard reads them
there); the computations import their engine modules when they run.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine

from engine.checkpoints.classes import aligned_columns, index_names
from engine.collapse import class_means, collapse_report
from engine.features import Columns, output_view
from engine.contract import ANALYSIS_DEFAULTS as DEFAULTS
from engine.contract import ANALYSIS_KINDS as KINDS
from engine.contract import (
    CLASS_MEAN,
    DERIVED_VIEWS,
    OUTPUT_VIEWS,
    PROJECTION_COLUMNS,
    PROTOTYPE,
    REACH_SHARES,
    SAMPLE,
    analysis_key,
    available_views,
    normalize_params,
    same_set_of,
)
from storage import list_feature_views, list_model_versions, load_feature_set, save_analysis, session_scope
from storage.models import Experiment, ModelVersion

Progress = Callable[[float, str], None]

# ---------------------------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class Version:
    """What the analyses need of a model version (plain values, usable after the session closes)."""

    id: int
    step: int
    classes: tuple[int, ...]
    class_names: tuple[str, ...] | None
    checkpoint_path: str | None

    @classmethod
    def of(cls, mv: ModelVersion) -> "Version":
        return cls(mv.id, mv.step, tuple(mv.classes), None if mv.class_names is None else tuple(mv.class_names),
                   mv.checkpoint_path)

    def name(self, label: int) -> str:
        if self.class_names is not None and 0 <= label < len(self.class_names):
            return self.class_names[label]
        return f"class {label}"


def _load_experiment(db: Engine, experiment_id: int) -> tuple[dict[str, Any], list[Version]]:
    with session_scope(db) as s:
        exp = s.get(Experiment, experiment_id)
        if exp is None:
            raise ValueError(f"experiment {experiment_id} does not exist")
        return dict(exp.config), [Version.of(mv) for mv in list_model_versions(s, experiment_id)]


def _version(versions: list[Version], step: int) -> Version:
    for v in versions:
        if v.step == step:
            return v
    raise ValueError(f"the experiment has no model of step {step}; stored steps: {[v.step for v in versions] or 'none'}")


def topk_of(config: dict[str, Any]) -> int | None:
    """The PSP/LSP top-k of an experiment's stored config (``eval.topk``; None: keep every class)."""
    return config.get("eval", {}).get("topk")


def load_view(db: Engine, version: Version, split: str, view: str, *, columns: Columns | None = None,
              topk: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(features, labels, image_ids)`` of one view; PSP/LSP keep ``columns`` of the outputs (default: the model's
    own classes) with top-``topk`` (:func:`engine.features.output_view`)."""
    with session_scope(db) as s:
        stored = list_feature_views(s, version.id, split)
        raw = view if view in stored else DERIVED_VIEWS.get(view)
        if raw is None or raw not in stored:
            raise ValueError(f"model of step {version.step} has no {split!r} features for view {view!r}; "
                             f"views available: {', '.join(available_views(stored)) or 'none'}")
        features, labels, image_ids = load_feature_set(s, version.id, split, raw)
    if raw != view:
        features = output_view({raw: features}, view, columns=len(version.classes) if columns is None else columns,
                               topk=topk)
    return np.asarray(features), np.asarray(labels), image_ids


def cell_columns(query: Version, gallery: Version) -> tuple[np.ndarray, np.ndarray]:
    """The PSP/LSP columns of the cell (query model, gallery model): the gallery's classes the query model knows."""
    def names(v: Version) -> tuple[str, ...]:
        return v.class_names if v.class_names is not None else index_names(len(v.classes))

    return aligned_columns(names(query), names(gallery))


def _head_weights(version: Version) -> tuple[np.ndarray | None, bool]:
    """The classifier rows in class order (row y = class y) and whether they are fixed prototypes."""
    if not version.checkpoint_path:
        return None, False
    from pathlib import Path

    if not Path(version.checkpoint_path).exists():
        return None, False
    import torch

    from engine.models import FixedHead, load_checkpoint

    net = load_checkpoint(version.checkpoint_path, device="cpu")
    head = net.head
    with torch.no_grad():
        rows = head.class_to_output(torch.arange(head.num_outputs))
        weights = head.weight.detach()[rows].double().numpy()
    return weights, isinstance(head, FixedHead)


def _joint_pair(db: Engine, old: Version, new: Version, split: str, view: str, topk: int | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Old and new features of the same images in one space (PSP/LSP on the old model's classes), and labels."""
    new_cols, old_cols = cell_columns(new, old)
    f_old, labels, _ = load_view(db, old, split, view, columns=old_cols, topk=topk)
    f_new, labels_new, _ = load_view(db, new, split, view, columns=new_cols, topk=topk)
    if len(labels) != len(labels_new) or not np.array_equal(labels, labels_new):
        raise ValueError(f"the {split} features of steps {old.step} and {new.step} do not embed the same images "
                         f"({len(labels)} vs {len(labels_new)} rows, or different labels); cannot compare them row by row")
    return f_old, f_new, labels


# ---------------------------------------------------------------------------------------------- pure pieces


def sample_rows(n: int, max_points: int, seed: int) -> np.ndarray:
    """Sorted row indices of a seeded uniform subsample of at most ``max_points`` of ``n`` rows."""
    if n <= max_points:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=max_points, replace=False))


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


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


def embed_2d(fit: np.ndarray, others: Sequence[np.ndarray], *, method: str, seed: int
             ) -> tuple[np.ndarray, list[np.ndarray], str]:
    """2-D coordinates of ``fit`` and of ``others`` placed in the same map; returns the method actually used.

    PCA is exact for the extra points; UMAP places them with ``transform``. UMAP needs a dozen points at
    least: with fewer it falls back to PCA.
    """
    fit = np.asarray(fit, dtype=np.float64)
    if fit.shape[1] < 2:  # a 1-d feature: draw it on a line
        pad = lambda a: np.hstack([np.asarray(a, np.float64), np.zeros((len(a), 1))])  # noqa: E731
        fit, others = pad(fit), [pad(o) for o in others]
    if method == "umap" and len(fit) >= 12:
        import umap

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reducer = umap.UMAP(n_components=2, n_neighbors=min(15, len(fit) - 1), min_dist=0.1, random_state=seed,
                                n_jobs=1)
            coords = reducer.fit_transform(fit)
            placed = [reducer.transform(o) if len(o) else np.zeros((0, 2)) for o in others]
        return np.asarray(coords, np.float64), [np.asarray(p, np.float64) for p in placed], "umap"
    from sklearn.decomposition import PCA

    pca = PCA(n_components=2, svd_solver="full").fit(fit)
    return pca.transform(fit), [pca.transform(o) if len(o) else np.zeros((0, 2)) for o in others], "pca"


def _topk_note(topk: int | None) -> str:
    return "" if topk is None else f", top-{topk} entries kept"


def _finite(value: float | None) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


def model_collapse(db: Engine, version: Version, split: str, view: str, *,
                   head: tuple[np.ndarray | None, bool] | None = None, topk: int | None = None) -> dict[str, Any]:
    """NC1-NC4 and the angles between class means of one model on its own view, over the classes it was trained on.

    NC3 compares with the classifier rows (checkpoint) on the encoder view, and with the probability-simplex
    prototypes V^C on output-space views (logits, softmax, PSP, LSP); NC4 uses the stored logits' argmax.
    ``head``: the model's ``_head_weights`` when already loaded; ``topk``: the experiment's PSP/LSP top-k.
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
        weights, _ = head or _head_weights(version)
        if weights is None:
            row["notes"].append("NC3 needs the classifier weights: no checkpoint found")
    elif view in OUTPUT_VIEWS:
        from engine.collapse import probability_simplex_prototypes

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
    row.update({k: _finite(v) for k, v in report.items()})
    angles = mean_angles(features, labels)
    row["angles"] = angles.tolist()
    row["angle_mean"], row["angle_std"] = float(angles.mean()), float(angles.std())
    row["simplex_angle"] = simplex_angle(row["classes"])
    return row


def model_stationarity(db: Engine, version: Version, split: str, head: tuple[np.ndarray | None, bool]
                       ) -> tuple[dict[str, Any], np.ndarray | None]:
    """The stationarity probe (:mod:`engine.stationarity`) of one model on its encoder features of ``split``.

    Prototypes: a fixed head's rows (d-Simplex, ETF), else the learned classifier's weight rows, in class
    order; ``head`` is the model's ``_head_weights``. Returns the row and the assigned-prototype centroid.
    """
    from engine.stationarity import stationarity_probe

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
    row.update({k: _finite(v) for k, v in probe.items()})
    if direction is None:
        row["note"] = "the prototypes of all assigned classes sum to zero: no centroid direction"
    return row, direction


def _definition1(f_old: np.ndarray, f_new: np.ndarray, labels: np.ndarray, *, n_pairs: int, seed: int) -> dict[str, Any]:
    from engine.metrics import definition1_check

    out = definition1_check(f_old, f_new, labels, n_pairs=n_pairs, seed=seed)
    return {k: (_finite(v) if isinstance(v, float) else v) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------- projection


def compute_projection(db: Engine, config: dict[str, Any], versions: list[Version], params: dict[str, Any],
                       progress: Progress) -> tuple[dict[str, Any], np.ndarray]:
    """The payload and the (n, 6) point array of a ``projection`` analysis (columns ``PROJECTION_COLUMNS``)."""
    old, new = _version(versions, params["step_a"]), _version(versions, params["step_b"])
    split, view, seed = params["split"], params["view"], params["seed"]
    notes: list[str] = []
    progress(0.05, "loading features")
    topk = topk_of(config)
    f_old, f_new, labels = _joint_pair(db, old, new, split, view, topk)
    joint = f_old.shape[1] == f_new.shape[1]
    if view in DERIVED_VIEWS:
        notes.append(f"{view.upper()}: both models projected onto the old model's {len(old.classes)} classes"
                     f"{_topk_note(topk)}, as in the cross-test")
    rows = sample_rows(len(labels), params["max_points"], seed)
    classes = np.unique(labels)

    # class means and (fixed) prototypes, in the same normalised space as the points
    def means_of(f: np.ndarray) -> np.ndarray:
        return class_means(unit(f), labels)[1] if len(classes) >= 2 else unit(f).mean(axis=0, keepdims=True)

    protos = np.zeros((0, f_new.shape[1]))
    proto_classes = np.zeros(0, np.int64)
    proto_note = "fixed prototypes are drawn for fixed-prototype heads (d-Simplex, ETF) on the encoder view"
    if view == "encoder":
        weights, fixed = _head_weights(new)
        if weights is not None and fixed and weights.shape[1] == f_new.shape[1]:
            proto_classes = np.array([c for c in new.classes if c < len(weights)], np.int64)
            protos = unit(weights[proto_classes])
            proto_note = f"the new model's fixed prototypes of its {len(proto_classes)} classes"
        elif weights is not None and not fixed:
            proto_note = "this method learns its classifier: there are no fixed prototypes to draw"
        elif weights is None:
            proto_note = "no checkpoint of the new model was found: prototypes cannot be drawn"

    progress(0.2, f"embedding with {params['method'].upper()}")
    if joint:
        coords, (m_old, m_new, p_xy), used = embed_2d(np.vstack([unit(f_old[rows]), unit(f_new[rows])]),
                                                      [means_of(f_old), means_of(f_new), protos],
                                                      method=params["method"], seed=seed)
        xy_old, xy_new = coords[: len(rows)], coords[len(rows):]
    else:
        notes.append(f"old features are {f_old.shape[1]}-d and new ones {f_new.shape[1]}-d: each model has its own map "
                     "(choose 'encoder', 'psp' or 'lsp' for one shared map)")
        xy_old, (m_old,), used = embed_2d(unit(f_old[rows]), [means_of(f_old)], method=params["method"], seed=seed)
        xy_new, (m_new, p_xy), _ = embed_2d(unit(f_new[rows]), [means_of(f_new), protos], method=params["method"],
                                           seed=seed)
    if used != params["method"]:
        notes.append(f"too few points for {params['method'].upper()}: used {used.upper()}")

    mean_labels = classes if len(classes) >= 2 else classes[:1]
    blocks = [
        (xy_old, 0, SAMPLE, labels[rows], rows),
        (xy_new, 1, SAMPLE, labels[rows], rows),
        (m_old, 0, CLASS_MEAN, mean_labels, np.full(len(mean_labels), -1)),
        (m_new, 1, CLASS_MEAN, mean_labels, np.full(len(mean_labels), -1)),
        (p_xy, 1, PROTOTYPE, proto_classes, np.full(len(proto_classes), -1)),
    ]
    array = np.vstack([np.column_stack([xy, np.full(len(xy), model), np.full(len(xy), kind), lab, row])
                       for xy, model, kind, lab, row in blocks if len(xy)]).astype(np.float64)

    progress(0.7, "drift, angles and collapse")
    drift = None
    definition1 = None
    if joint and len(classes) >= 2:
        cls, cosines = class_drift(f_old, f_new, labels)
        drift = [{"label": int(c), "name": new.name(int(c)), "cosine": float(v), "seen_old": int(c) in old.classes,
                  "seen_new": int(c) in new.classes} for c, v in zip(cls, cosines)]
        definition1 = _definition1(f_old, f_new, labels, n_pairs=params["n_pairs"], seed=seed)
    elif not joint:
        notes.append("drift and Definition 1 need old and new features of the same dimension")
    collapse = [model_collapse(db, v, split, view, topk=topk) for v in (old, new)]
    payload = {
        "params": params,
        "columns": list(PROJECTION_COLUMNS),
        "embedding": used,
        "joint": joint,
        "normalised": True,
        "models": [{"model": i, "step": v.step, "model_version_id": v.id, "num_classes": len(v.classes),
                    "dim": int(f.shape[1])} for i, (v, f) in enumerate(((old, f_old), (new, f_new)))],
        "n_rows": int(len(labels)),
        "n_sampled": int(len(rows)),
        "classes": [{"label": int(c), "name": new.name(int(c)), "seen_old": int(c) in old.classes,
                     "seen_new": int(c) in new.classes} for c in classes],
        "prototypes": int(len(proto_classes)),
        "prototype_note": proto_note,
        "drift": drift,
        "definition1": definition1,
        "collapse": collapse,
        "notes": notes,
    }
    return payload, array


# ---------------------------------------------------------------------------------------------- backfilling


def compute_backfill(db: Engine, config: dict[str, Any], versions: list[Version], params: dict[str, Any],
                     progress: Progress) -> dict[str, Any]:
    """The payload of a ``backfill`` analysis: one curve per (ordering, metric), M-tilde and reach fractions.

    Queries are the new model's query features; the old gallery the old model's gallery features and the new
    gallery the new model's (same images, same rows). With ``eval_classes = "seen"`` queries and gallery keep
    the old model's classes. The orderings that look at features use the old gallery (as stored before any
    backfilling); ``confidence`` uses the new model's stored gallery logits.
    """
    from engine.backfill import backfill_curves, backfill_order, curve_area, fraction_to_reach

    old, new = _version(versions, params["step_a"]), _version(versions, params["step_b"])
    view, topk = params["view"], topk_of(config)
    new_cols, old_cols = cell_columns(new, old)
    same_set = same_set_of(config)
    progress(0.05, "loading features")
    query, q_labels, _ = load_view(db, new, "query", view, columns=new_cols, topk=topk)
    old_g, g_labels, _ = load_view(db, old, "gallery", view, columns=old_cols, topk=topk)
    new_g, g_labels_new, _ = load_view(db, new, "gallery", view, columns=new_cols, topk=topk)
    if not np.array_equal(g_labels, g_labels_new):
        raise ValueError(f"the gallery features of steps {old.step} and {new.step} do not embed the same images")
    new_logits = None
    if "confidence" in params["orderings"]:
        new_logits = load_view(db, new, "gallery", "logits")[0]
    notes = []
    if config.get("eval", {}).get("eval_classes", "all") == "seen":
        q_keep, g_keep = np.isin(q_labels, old.classes), np.isin(g_labels, old.classes)
        if same_set and not np.array_equal(q_keep, g_keep):
            raise ValueError("closed-set queries and gallery must be the same images")
        query, q_labels, old_g, new_g, g_labels = query[q_keep], q_labels[q_keep], old_g[g_keep], new_g[g_keep], g_labels[g_keep]
        new_logits = None if new_logits is None else new_logits[g_keep]
        notes.append(f"eval_classes = seen: queries and gallery restricted to the old model's {len(old.classes)} classes")
    if view in DERIVED_VIEWS:
        notes.append(f"{view.upper()}: everything projected onto the old model's {len(old.classes)} classes"
                     f"{_topk_note(topk)}")
    fractions = np.linspace(0.0, 1.0, params["num_fractions"])
    curves: dict[str, dict[str, list[float | None]]] = {}
    area: dict[str, dict[str, float | None]] = {}
    reach: dict[str, dict[str, dict[str, float | None]]] = {}
    counts: dict[str, Any] = {}
    for i, name in enumerate(params["orderings"]):
        progress(0.1 + 0.85 * i / len(params["orderings"]), f"ordering {name}")
        order = backfill_order(name, old_gallery=old_g, new_gallery=new_g, gallery_labels=g_labels,
                               new_logits=new_logits, seed=params["seed"])
        out = backfill_curves(query, q_labels, old_g, new_g, g_labels, order=order, fractions=fractions,
                              metrics=params["metrics"], same_set=same_set)
        counts = {k: (np.asarray(out[k]).tolist() if k == "n_backfilled" else int(out[k]))
                  for k in ("n_backfilled", "n_queries", "n_valid", "n_no_positive")}
        curves[name] = {m: [_finite(v) for v in np.asarray(out[m])] for m in params["metrics"]}
        area[name] = {m: _finite(curve_area(fractions, np.asarray(out[m]))) for m in params["metrics"]}
        reach[name] = {m: {f"{share:g}": fraction_to_reach(fractions, np.asarray(out[m]), share * float(out[m][-1]))
                           for share in REACH_SHARES} for m in params["metrics"]}
    first = curves[params["orderings"][0]]
    return {
        "params": params,
        "fractions": fractions.tolist(),
        **counts,
        "n_gallery": int(len(g_labels)),
        "same_set": same_set,
        "models": [{"step": v.step, "model_version_id": v.id, "num_classes": len(v.classes)} for v in (old, new)],
        "curves": curves,
        "area": area,
        "reach": reach,
        "reach_shares": [f"{s:g}" for s in REACH_SHARES],
        "self_test": {m: first[m][-1] for m in params["metrics"]},
        "cross_test": {m: first[m][0] for m in params["metrics"]},
        "notes": notes,
    }


# ---------------------------------------------------------------------------------------------- geometry over steps


def compute_geometry(db: Engine, config: dict[str, Any], versions: list[Version], params: dict[str, Any],
                     progress: Progress) -> dict[str, Any]:
    """NC1-NC4 and angles for every step; mean drift and Definition 1 between consecutive steps.

    ``stationarity``: the probe of every step on its encoder features (whatever ``view``), with the angle its
    assigned-prototype centroid turns from the previous step.
    """
    from engine.stationarity import turn_angle

    split, view, topk = params["split"], params["view"], topk_of(config)
    models, stationarity = [], []
    direction = None  # the previous step's assigned-prototype centroid
    for i, v in enumerate(versions):
        progress(0.05 + 0.6 * i / max(1, len(versions)), f"collapse of step {v.step}")
        head = _head_weights(v)
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
        f_old, f_new, labels = _joint_pair(db, old, new, split, view, topk)
        if f_old.shape[1] != f_new.shape[1]:
            pair["note"] = f"{f_old.shape[1]}-d vs {f_new.shape[1]}-d features: not comparable"
        elif len(np.unique(labels)) >= 2:
            classes, cosines = class_drift(f_old, f_new, labels)
            seen = np.isin(classes, old.classes)
            pair["mean_drift_seen"] = _finite(float(cosines[seen].mean())) if seen.any() else None
            pair["mean_drift_all"] = float(cosines.mean())
            pair.update(_definition1(f_old, f_new, labels, n_pairs=params["n_pairs"], seed=params["seed"]))
        pairs.append(pair)
    return {"params": params, "models": models, "pairs": pairs, "stationarity": stationarity}


# ---------------------------------------------------------------------------------------------- entry points


def run_analysis(db_engine: Engine, experiment_id: int, kind: str, params: dict[str, Any], *,
                 progress: Progress | None = None) -> None:
    """Compute one analysis of an experiment and store it under ``(experiment_id, kind, analysis_key(kind, params))``.

    Reads in short transactions, computes without holding a session, writes in one transaction.
    ``progress(fraction, message)`` is called along the way when given.
    """
    params = normalize_params(kind, params)
    report = progress or (lambda fraction, message: None)
    config, versions = _load_experiment(db_engine, experiment_id)
    if not versions:
        raise ValueError(f"experiment {experiment_id} has no model versions yet; wait for it to train a step")
    array = None
    if kind == "projection":
        payload, array = compute_projection(db_engine, config, versions, params, report)
    elif kind == "backfill":
        payload = compute_backfill(db_engine, config, versions, params, report)
    else:
        payload = compute_geometry(db_engine, config, versions, params, report)
    report(0.98, "saving")
    with session_scope(db_engine) as s:
        save_analysis(s, experiment_id, kind, analysis_key(kind, params), payload, array)


def nearest_neighbours(db: Engine, query_version_id: int, gallery_version_id: int, view: str, query_index: int,
                       k: int = 10) -> dict[str, Any]:
    """The ``k`` gallery items nearest (cosine) to one query, across models: hits share the query's label.

    Query = row ``query_index`` of the query model's ``query`` split; gallery = the gallery model's
    ``gallery`` split (PSP/LSP on the gallery model's classes with the experiment's top-k, as in the matrix cell). In a
    closed-set experiment the query's own image (same row) is excluded from the gallery, by index.
    """
    with session_scope(db) as s:
        mv_q, mv_g = s.get(ModelVersion, query_version_id), s.get(ModelVersion, gallery_version_id)
        if mv_q is None or mv_g is None:
            raise ValueError(f"model version {query_version_id if mv_q is None else gallery_version_id} does not exist")
        config = dict(mv_g.experiment.config)
        vq, vg = Version.of(mv_q), Version.of(mv_g)
    q_cols, g_cols = cell_columns(vq, vg)
    topk = topk_of(config)
    query, q_labels, q_ids = load_view(db, vq, "query", view, columns=q_cols, topk=topk)
    gallery, g_labels, g_ids = load_view(db, vg, "gallery", view, columns=g_cols, topk=topk)
    if not 0 <= query_index < len(query):
        raise ValueError(f"query index {query_index} is out of range: the query split has rows 0..{len(query) - 1}")
    if query.shape[1] != gallery.shape[1]:
        raise ValueError(f"the query model gives {query.shape[1]}-d {view} features and the gallery model "
                         f"{gallery.shape[1]}-d ones; choose a view both share (e.g. 'psp' or 'lsp')")
    same_set = same_set_of(config)
    # class names are nested (the classes in scenario order): the later model knows the most of them
    named = max((vq, vg), key=lambda v: len(v.class_names or ()))
    sims = unit(gallery) @ unit(query[query_index : query_index + 1])[0]
    if same_set:
        sims[query_index] = -np.inf
    k = max(1, min(int(k), len(sims) - int(same_set)))
    top = np.argsort(-sims, kind="stable")[:k]
    label = int(q_labels[query_index])
    positives = int(np.sum(g_labels == label)) - int(same_set and g_labels[query_index] == label)
    return {
        "query": {"index": int(query_index), "label": label, "name": named.name(label),
                  "image_id": None if q_ids is None else np.asarray(q_ids)[query_index].item()},
        "neighbours": [{"rank": r + 1, "gallery_index": int(i), "label": int(g_labels[i]), "name": named.name(int(g_labels[i])),
                        "similarity": float(sims[i]), "hit": bool(g_labels[i] == label),
                        "image_id": None if g_ids is None else np.asarray(g_ids)[i].item()} for r, i in enumerate(top)],
        "n_gallery": int(len(g_labels)),
        "n_positives": positives,
        "same_set": same_set,
        "query_step": vq.step,
        "gallery_step": vg.step,
    }


__all__ = ["DEFAULTS", "KINDS", "PROJECTION_COLUMNS", "analysis_key", "available_views", "class_drift",
           "cell_columns", "compute_backfill", "compute_geometry", "compute_projection", "embed_2d", "load_view", "mean_angles",
           "model_collapse", "model_stationarity", "nearest_neighbours", "normalize_params", "run_analysis", "same_set_of", "sample_rows",
           "simplex_angle", "topk_of"]
