"""Why a reduced claim's cross-test fails: how much of each model's feature its old classifier constrains (issue 38).

For every seed of a claim's method with a learnable linear head, read from a reproduction's database (runs of
``python -m engine reproduce NAME --scale reduced``): the old model's head ``W_old`` (C_old x d) from its checkpoint
(safetensors, read as arrays), both models' stored test features, and print, mean over seeds:

* ``share in W_old's rows``: the share of a feature's energy in the row space of ``W_old`` (the only directions BCT's
  influence loss, ``CE(W_old phi_new)``, constrains), for the old and the new model;
* ``same-image cos``: the cosine of one test image's old and new features (what a cross-test compares);
* ``cos in W_old's rows``: the same cosine after projecting both features onto that row space.

A new feature that agrees with the old one inside the row space but puts almost all its energy outside it is
compatible in logits and not in features. Run: ``python bench/why_feature_drift.py --db sqlite:///PATH P0-Tab1a``.
"""
from __future__ import annotations

import argparse

import numpy as np
from safetensors.numpy import load_file

from engine.reproduce.claims import CLAIMS
from engine.reproduce.plan import stored_runs, study_config
from storage import get_engine, list_model_versions, load_feature_set, session_scope

HEAD = "head.fc.weight"  # a learnable linear head's weight in a checkpoint (engine.models.heads.LinearHead)


def drift(features_old: np.ndarray, features_new: np.ndarray, head_old: np.ndarray) -> dict[str, float]:
    """The three numbers of the module docstring for one seed (features of the same images, row by row)."""
    basis, _ = np.linalg.qr(np.asarray(head_old, np.float64).T)  # (d, C_old): an orthonormal basis of W_old's rows
    out = {}
    for name, f in (("old", features_old), ("new", features_new)):
        f = np.asarray(f, np.float64)
        out[f"share in W_old's rows, {name}"] = float(np.mean(np.sum((f @ basis) ** 2, 1) / np.sum(f ** 2, 1)))
    a, b = (np.asarray(x, np.float64) for x in (features_old, features_new))
    a, b = a / np.linalg.norm(a, axis=1, keepdims=True), b / np.linalg.norm(b, axis=1, keepdims=True)
    pa, pb = a @ basis, b @ basis
    out["same-image cos"] = float(np.mean(np.sum(a * b, 1)))
    out["cos in W_old's rows"] = float(np.mean(np.sum(pa * pb, 1) / np.linalg.norm(pa, axis=1) / np.linalg.norm(pb, axis=1)))
    return out


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
        with session_scope(db) as s:
            versions = list_model_versions(s, exp_id)[:2]
            head = load_file(versions[0].checkpoint_path).get(HEAD)
            if head is None or len(versions) < 2:
                continue  # a fixed head (d-Simplex, ETF) or one model: nothing to project on
            (f_old, _, ids_old), (f_new, _, ids_new) = (load_feature_set(s, v.id, "query", "encoder") for v in versions)
        if ids_old is not None and not np.array_equal(ids_old, ids_new):
            raise SystemExit(f"experiment {exp_id}: the two models' query features are not of the same images")
        per_method.setdefault(method, []).append(drift(f_old, f_new, head))
    for method, rows in per_method.items():
        means = {k: np.mean([r[k] for r in rows]) for k in rows[0]}
        print(f"{method:<12} seeds {len(rows):>2}  " + "  ".join(f"{k} {v:.3f}" for k, v in means.items()))


if __name__ == "__main__":
    main()
