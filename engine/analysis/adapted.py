"""Adapters between two stored models (paper 004), what the ``adapters`` job runs: fit on the stored training
features, store the adapted views, and compute the query/gallery combination table and adapted backfill curves.

Both backbones stay frozen: everything here works on feature rows already in the database. The
adapters train on the ``train`` split (a fixed per-class subset of the training images that every
model of a run embeds), never on the query/gallery images they are evaluated on.

Stored views: ``F(<kind>,to=<new step>)`` on the old model version (its features mapped by F) and
``B(<kind>,to=<old step>)`` on the new one (mapped by B), for every stored split, so the other
pages (geometry, backfill) can use them like any view.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
from sqlalchemy import Engine

from engine.adapters.fit import fit_adapters
from engine.adapters.table import combination_table
from engine.metrics.backfill import backfill_curves, curve_area, fraction_to_reach
from engine.metrics.backfill_orders import backfill_order
from engine.core.contract import DEFAULT_ORDERINGS, adapter_key
from engine.core.fingerprint import Fingerprint, normalisation_of
from engine.metrics.retrieval import retrieval_metrics
from storage import get_model_version, list_feature_views, load_feature_set, save_analysis, save_feature_set, session_scope


# Training settings for the small stored feature sets of a demo-sized run (a few hundred rows):
# the paper's Adam lr 1e-3 with batches of 512 takes one step per epoch there and does not converge.
SMALL_DATA_FIT = {"epochs": 60, "batch_size": 64, "lr": 1e-2}


@dataclass(frozen=True)
class AdapterJob:
    old_version_id: int
    new_version_id: int
    kind: str = "perp"  # perp (B_perp + F) | lambda (B_lambda + F) | fct (F only)
    view: str = "encoder"
    same_set: bool = True  # query set = gallery set (leave-one-out), as the closed-set protocol
    fit: dict = field(default_factory=lambda: dict(SMALL_DATA_FIT))  # keyword arguments of engine.adapters.fit.fit_adapters
    orderings: tuple[str, ...] = DEFAULT_ORDERINGS

    @property
    def key(self) -> str:
        return adapter_key(self.old_version_id, self.new_version_id, self.kind, self.view)


def _load(session, version_id: int, split: str, view: str):
    feats, labels, _ = load_feature_set(session, version_id, split, view)
    return feats.astype(np.float32), labels


def _mapped(view: str, version_id: int, x: np.ndarray) -> dict:
    """The fingerprint of an adapter's outputs stored as ``view`` of a model version: no weights file, a name that
    says which map of which model made them."""
    return Fingerprint(int(x.shape[1]), name=f"{view} of model version {version_id}",
                       normalisation=normalisation_of(x)).to_json()


def run_adapters(db: Engine, job: AdapterJob) -> dict:
    """Fit, store adapted views, and store/return ``{"table": [...], "backfill": {...}, "adapters": describe}``."""
    with session_scope(db) as s:
        old_v, new_v = get_model_version(s, job.old_version_id), get_model_version(s, job.new_version_id)
        if old_v is None or new_v is None:
            raise ValueError(f"model versions {job.old_version_id} and {job.new_version_id} must both exist")
        if job.view not in list_feature_views(s, old_v.id, "train"):
            raise ValueError(f"model version {old_v.id} has no stored 'train' features for view {job.view!r}; "
                             "re-run with eval.train_features_per_class > 0")
        splits = {sp: (_load(s, old_v.id, sp, job.view), _load(s, new_v.id, sp, job.view)) for sp in ("train", "query", "gallery")}
        old_step, new_step, exp_id = old_v.step, new_v.step, old_v.experiment_id
    (old_tr, ltr), (new_tr, ltr_new) = splits["train"]
    if not np.array_equal(ltr, ltr_new):
        raise ValueError("the two models' training features are not the same images in the same order")
    pair = fit_adapters(old_tr, new_tr, ltr, kind=job.kind, **job.fit)
    (old_q, lq), (new_q, _) = splits["query"]
    (old_g, lg), (new_g, _) = splits["gallery"]

    def evaluate(q, ql, g, gl):
        m = retrieval_metrics(q, ql, g, gl, ks=(1,), same_set=job.same_set)
        return {"recall@1": m["recall@1"], "map": m["map"]}

    table = combination_table(old_q, new_q, old_g, new_g, lq, lg, pair, evaluate=evaluate)
    f_name, b_name = f"F({job.kind},to={new_step})", f"B({job.kind},to={old_step})"
    adapted = {}
    with session_scope(db) as s:  # all adapted views of the pair in one transaction
        for sp, ((old_x, labels), (new_x, _)) in splits.items():
            if pair.forward is not None:
                adapted[(f_name, sp)] = pair.apply_forward(old_x)
                save_feature_set(s, job.old_version_id, sp, f_name, adapted[(f_name, sp)], labels,
                                 fingerprint=_mapped(f_name, job.old_version_id, adapted[(f_name, sp)]))
            adapted[(b_name, sp)] = pair.apply_backward(new_x)
            save_feature_set(s, job.new_version_id, sp, b_name, adapted[(b_name, sp)], labels,
                             fingerprint=_mapped(b_name, job.new_version_id, adapted[(b_name, sp)]))
    # partial backfilling in the adapted spaces: queries B(new), gallery F(old) (or old) replaced by B(new)
    q = adapted[(b_name, "query")]
    g_old = adapted.get((f_name, "gallery"), old_g)
    g_new = adapted[(b_name, "gallery")]
    g_old, g_new = pair.match_dims(g_old, g_new)
    q, _ = pair.match_dims(q, g_old)
    curves = {}
    for name in job.orderings:
        order = backfill_order(name, old_gallery=g_old, gallery_labels=lg, seed=0)
        c = backfill_curves(q, lq, g_old, g_new, lg, order=order, same_set=job.same_set)
        curves[name] = {
            "fractions": c["fractions"].tolist(),
            **{m: c[m].tolist() for m in ("recall@1", "map")},
            "area": {m: curve_area(c["fractions"], c[m]) for m in ("recall@1", "map")},
            "reach_new": {m: fraction_to_reach(c["fractions"], c[m], float(c[m][-1])) for m in ("recall@1", "map")},
        }
    result = {"job": asdict(job), "adapters": pair.describe(), "table": table, "backfill": curves}
    with session_scope(db) as s:
        save_analysis(s, exp_id, "adapters", job.key, result)
    return result
