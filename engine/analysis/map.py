"""The ``projection`` analysis: old and new features of one split and view drawn in one 2-D map.

The two models' features are subsampled (seeded, the same images for both models) and embedded together
in 2-D (UMAP, or PCA as the fast option), with the class means and, for fixed-prototype heads on the
encoder view, the prototypes; the payload adds per-class drift (cosine between the old and new class
mean), NC1-NC4 and the angles between centred class means per model, and the sampled Definition-1 check
(:mod:`engine.analysis.geometry`).

Each sampled point also carries, for the explorer's colour-by, whether its image is retrieved correctly
(the nearest other image of the split in the old model's space has its class: old/old for the old model's
point, new-query/old-gallery for the new one's) and its feature drift (1 - cosine between its old and new
feature); both are -1 where old and new features do not share a space, and for class means and prototypes.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import Engine

from engine.analysis.arrays import unit
from engine.analysis.collapse import class_means
from engine.analysis.geometry import class_drift, definition1, model_collapse
from engine.analysis.views import Progress, StoredVersion, experiment_recipe, head_weights, joint_pair, topk_note, version_of_step
from engine.core.contract import CLASS_MEAN, PROJECTION_COLUMNS, PROTOTYPE, SAMPLE


def sample_rows(n: int, max_points: int, seed: int) -> np.ndarray:
    """Sorted row indices of a seeded uniform subsample of at most ``max_points`` of ``n`` rows."""
    if n <= max_points:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=max_points, replace=False))


SIMILARITY_BYTES = 1 << 26  # one block of the top-1 search holds at most 64 MiB of float32 similarities


def top1_hits(queries: np.ndarray, gallery: np.ndarray, labels: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Whether the gallery row nearest (cosine) to ``queries[i]``, other than row ``rows[i]`` itself, has label
    ``labels[rows[i]]``; ``queries`` are the features of ``rows``, ``gallery`` those of every row.

    Memory is bounded by blocks of queries (:data:`SIMILARITY_BYTES`); ties go to the lower gallery row.
    """
    g = unit(gallery).astype(np.float32)
    q = unit(queries).astype(np.float32)
    block = max(1, SIMILARITY_BYTES // (4 * max(len(g), 1)))
    hits = np.zeros(len(rows), bool)
    for start in range(0, len(rows), block):
        own = rows[start:start + block]
        sims = q[start:start + block] @ g.T
        sims[np.arange(len(own)), own] = -np.inf  # never the image itself
        hits[start:start + block] = labels[np.argmax(sims, axis=1)] == labels[own]
    return hits


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


def compute_projection(db: Engine, config: dict[str, Any], versions: list[StoredVersion], params: dict[str, Any],
                       progress: Progress) -> tuple[dict[str, Any], np.ndarray]:
    """The payload and the (n, 6) point array of a ``projection`` analysis (columns ``PROJECTION_COLUMNS``)."""
    old, new = version_of_step(versions, params["step_a"]), version_of_step(versions, params["step_b"])
    split, view, seed = params["split"], params["view"], params["seed"]
    notes: list[str] = []
    progress(0.05, "loading features")
    recipe = experiment_recipe(config, view, new, old, every_row=True)  # the cross-test's columns, every stored row
    topk = recipe.topk
    f_old, f_new, labels = joint_pair(db, old, new, split, recipe)
    joint = f_old.shape[1] == f_new.shape[1]
    if recipe.derived:
        notes.append(f"{view.upper()}: both models projected onto the old model's {len(old.classes)} classes"
                     f"{topk_note(topk)}, as in the cross-test")
    rows = sample_rows(len(labels), params["max_points"], seed)
    classes = np.unique(labels)

    # class means and (fixed) prototypes, in the same normalised space as the points
    def means_of(f: np.ndarray) -> np.ndarray:
        return class_means(unit(f), labels)[1] if len(classes) >= 2 else unit(f).mean(axis=0, keepdims=True)

    protos = np.zeros((0, f_new.shape[1]))
    proto_classes = np.zeros(0, np.int64)
    proto_note = "fixed prototypes are drawn for fixed-prototype heads (d-Simplex, ETF) on the encoder view"
    if view == "encoder":
        weights, fixed = head_weights(new)
        if weights is not None and fixed and weights.shape[1] == f_new.shape[1]:
            proto_classes = np.array([c for c in new.classes if c < len(weights)], np.int64)
            protos = unit(weights[proto_classes])
            proto_note = f"the new model's fixed prototypes of its {len(proto_classes)} classes"
        elif weights is not None and not fixed:
            proto_note = "this method learns its classifier: there are no fixed prototypes to draw"
        elif weights is None:
            proto_note = ("no Compatibility Lab checkpoint of the new model was found (a compared model's own "
                          "file carries no project head): prototypes cannot be drawn")

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

    progress(0.6, "top-1 retrieval and drift per point")
    hit_old = hit_new = drift_rows = np.full(len(rows), -1.0)  # -1: not defined (no shared space)
    if joint and len(labels) >= 2:
        hit_old = top1_hits(f_old[rows], f_old, labels, rows).astype(np.float64)
        hit_new = top1_hits(f_new[rows], f_old, labels, rows).astype(np.float64)
        drift_rows = 1.0 - np.sum(unit(f_old[rows]) * unit(f_new[rows]), axis=1)

    mean_labels = classes if len(classes) >= 2 else classes[:1]
    marks = ((m_old, 0, CLASS_MEAN, mean_labels), (m_new, 1, CLASS_MEAN, mean_labels),
             (p_xy, 1, PROTOTYPE, proto_classes))  # no row, hit or drift
    blocks = [(xy_old, 0, SAMPLE, labels[rows], rows, hit_old, drift_rows),
              (xy_new, 1, SAMPLE, labels[rows], rows, hit_new, drift_rows),
              *[(xy, model, kind, lab, *[np.full(len(lab), -1.0)] * 3)
                for xy, model, kind, lab in marks]]
    array = np.vstack([np.column_stack([xy, np.full(len(xy), model), np.full(len(xy), kind), *rest])
                       for xy, model, kind, *rest in blocks if len(xy)]).astype(np.float64)

    progress(0.7, "drift, angles and collapse")
    drift = None
    check = None
    if joint and len(classes) >= 2:
        cls, cosines = class_drift(f_old, f_new, labels)
        drift = [{"label": int(c), "name": new.name(int(c)), "cosine": float(v), "seen_old": int(c) in old.classes,
                  "seen_new": int(c) in new.classes} for c, v in zip(cls, cosines)]
        check = definition1(f_old, f_new, labels, n_pairs=params["n_pairs"], seed=seed)
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
        "hit_rule": ("top-1 among the other images of the split, in the old model's gallery space: old point = "
                     "old/old, new point = new-query/old-gallery; ties go to the lower row"),
        "prototype_note": proto_note,
        "drift": drift,
        "definition1": check,
        "collapse": collapse,
        "notes": notes,
    }
    return payload, array
