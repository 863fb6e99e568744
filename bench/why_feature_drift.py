"""Why a reduced claim's cross-test fails: how far one image's feature moves between two models (issue 38).

For every seed of every method of a claim, read from a reproduction's database (runs of
``python -m engine reproduce NAME --scale reduced``), the first two models' stored features and print, mean over seeds:

* ``cos, test queries`` / ``cos, old classes' training images``: the reproduce table's same-image cosines
  (:func:`engine.reproduce.outcomes.same_image_cosines`: one image's old and new features, on the test queries, open
  set: classes no model trained, and on the training images of the classes the old model learned, where a method's
  loss acts);
* for a learnable linear head only (its weight ``W_old``, C_old x d, read from the old model's checkpoint as arrays):
  ``share in W_old's rows`` of a test feature's energy, old and new model (the only directions BCT's influence loss
  ``CE(W_old phi_new)`` constrains), and ``cos in W_old's rows``, the cosine after projecting both onto that row space.

* ``units silent in old``: feature units the old model never turns on over the test queries (a ReLU output that stays
  at 0), and ``new energy on them``: the share of the new features' energy on those units.

A new feature that agrees with the old one inside the row space but puts almost all its energy outside it is
compatible in logits and not in features. Run: ``python bench/why_feature_drift.py --db sqlite:///PATH P0-Tab1a``.
"""
from __future__ import annotations

import argparse

import numpy as np
from safetensors.numpy import load_file

from engine.reproduce.claims import CLAIMS
from engine.reproduce.outcomes import row_cosines, same_image_cosines
from engine.reproduce.plan import stored_runs, study_config
from storage import get_engine, list_model_versions, load_feature_set, session_scope

HEAD = "head.fc.weight"  # a learnable linear head's weight in a checkpoint (engine.models.heads.LinearHead)


def drift(features_old: np.ndarray, features_new: np.ndarray, head_old: np.ndarray) -> dict[str, float]:
    """The linear-head numbers of the module docstring for one seed (features of the same images, row by row)."""
    basis, _ = np.linalg.qr(np.asarray(head_old, np.float64).T)  # (d, C_old): an orthonormal basis of W_old's rows
    out = {}
    for name, f in (("old", features_old), ("new", features_new)):
        f = np.asarray(f, np.float64)
        out[f"share in W_old's rows, {name}"] = float(np.mean(np.sum((f @ basis) ** 2, 1) / np.sum(f ** 2, 1)))
    a, b = np.asarray(features_old, np.float64), np.asarray(features_new, np.float64)
    out["cos in W_old's rows"] = float(np.nanmean(row_cosines(a @ basis, b @ basis)))
    return out


def silent_units(features_old: np.ndarray, features_new: np.ndarray) -> dict[str, float]:
    """Units (feature coordinates) the old model never uses on these images (never above 0: a ReLU output that stays
    off), and the share of the new features' energy on them."""
    fo, fn = np.asarray(features_old, np.float64), np.asarray(features_new, np.float64)
    silent = fo.max(axis=0) <= 0
    return {"units silent in old": float(silent.sum()),
            "new energy on them": float(np.sum(fn[:, silent] ** 2) / np.sum(fn ** 2))}


def seed_drift(db, exp_id: int) -> dict[str, float]:
    """Every number of the module docstring for one stored experiment (its first two models)."""
    cos = same_image_cosines(db, exp_id)  # the reproduce table's own column
    out = {"cos, test queries": cos["test"], "cos, old classes' training images": cos["trained"]}
    with session_scope(db) as s:
        old, new = list_model_versions(s, exp_id)[:2]
        head = load_file(old.checkpoint_path).get(HEAD)
        queries = [load_feature_set(s, v.id, "query", "encoder")[0] for v in (old, new)]
    out.update(silent_units(*queries))
    if head is None:  # a fixed head (d-Simplex, ETF) constrains every direction it spans
        return out
    return {**out, **drift(*queries, head)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("claim", choices=sorted(CLAIMS))
    p.add_argument("--db", required=True, help="the reproduction's database URL")
    p.add_argument("--scale", default="reduced")
    args = p.parse_args()
    db = get_engine(args.db)
    runs = stored_runs(db, study_config(CLAIMS[args.claim], args.scale))
    per_method: dict[str, list[dict[str, float]]] = {}
    for (seed, method), exp_id in sorted(runs.items()):
        per_method.setdefault(method, []).append(seed_drift(db, exp_id))
    for method, rows in per_method.items():
        means = {k: np.nanmean([r.get(k, np.nan) for r in rows]) for k in rows[0]}
        print(f"{method:<12} seeds {len(rows):>2}  " + "  ".join(f"{k} {v:.3f}" for k, v in means.items()))


if __name__ == "__main__":
    main()
