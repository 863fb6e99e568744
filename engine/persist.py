"""Writing engine results through the storage repository (the engine is the single writer)."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from sqlalchemy import Engine

from engine.metrics.compatibility import CellFeatures, MatrixResult, stored_summary
from storage import add_model_version, create_experiment, init_db, save_feature_set, save_matrix, session_scope, set_experiment_status


def config_hash(config: dict) -> str:
    """A stable hash of a JSON-able config (key order does not matter)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def save_matrices(session, experiment_id: int, result: MatrixResult, *, protocol: str, view: str,
                  eval_classes: str = "all", ties: str = "fail") -> None:
    """Store every metric's matrix of ``result`` with its summary (AC/AA/ACA, update gain, paired test)."""
    for metric, C in result.values.items():
        summary = stored_summary(result, metric, ties=ties)
        save_matrix(session, experiment_id, metric=metric, protocol=protocol, view=view, values=C,
                    valid_queries=result.valid_queries, no_positive=result.no_positive, summary=summary,
                    eval_classes=eval_classes)


def store_feature_evaluation(db: Engine, *, name: str, config: dict, sets: Sequence[CellFeatures], result: MatrixResult,
                             protocol: str, view: str = "external") -> int:
    """Store an evaluation of external features (one experiment, one model version per step) in one transaction."""
    init_db(db)
    with session_scope(db) as s:
        exp = create_experiment(s, name=name, method="features", config=config, config_hash=config_hash(config))
        for step, fs in enumerate(sets, start=1):
            classes = sorted({int(c) for c in fs.gallery_labels} | {int(c) for c in fs.query_labels})
            mv = add_model_version(s, exp.id, step, architecture="external", method="features", classes=classes,
                                   num_outputs=0, feature_dim=int(fs.query.shape[1]))
            save_feature_set(s, mv.id, "query", view, fs.query, fs.query_labels)
            save_feature_set(s, mv.id, "gallery", view, fs.gallery, fs.gallery_labels)
        save_matrices(s, exp.id, result, protocol=protocol, view=view)
        set_experiment_status(s, exp.id, "done")
        return exp.id
