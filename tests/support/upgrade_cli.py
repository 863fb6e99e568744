"""Shared by several test modules; moved from tests/test_upgrade_cli.py."""
from __future__ import annotations

import numpy as np

from engine.metrics.compatibility import CellFeatures
from storage import (
    add_model_version,
    create_experiment,
    get_engine,
    init_db,
    rename_model_version,
    save_feature_set,
    session_scope,
)


def write_folder(path, *sets, extra=None):
    path.mkdir()
    for i, s in enumerate(sets, 1):
        np.savez(path / f"step_{i}.npz", query_features=s.query, query_labels=s.query_labels,
                 gallery_features=s.gallery, gallery_labels=s.gallery_labels, **(extra or {}))
    return path


def store_pair(url: str, old: CellFeatures, new: CellFeatures, *, names=(None, None)) -> int:
    """An experiment with two model versions (steps 1, 2) holding ``old`` / ``new`` as encoder features."""
    db = get_engine(url)
    init_db(db)
    with session_scope(db) as s:
        exp = create_experiment(s, name="pair", method="folder", config={"same_set": False}, config_hash="pair")
        for step, cell, name in ((1, old, names[0]), (2, new, names[1])):
            classes = sorted(set(cell.gallery_labels.tolist()))
            mv = add_model_version(s, exp.id, step, architecture="features", method="folder", classes=classes,
                                   num_outputs=len(classes), feature_dim=cell.query.shape[1])
            save_feature_set(s, mv.id, "query", "encoder", cell.query.astype(np.float32), cell.query_labels)
            save_feature_set(s, mv.id, "gallery", "encoder", cell.gallery.astype(np.float32), cell.gallery_labels)
            if name:
                rename_model_version(s, mv.id, name)
        return exp.id

