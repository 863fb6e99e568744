"""Shared by several test modules; moved from tests/test_app_text.py."""
from __future__ import annotations

import numpy as np

from storage import get_engine, session_scope


def stored_encoder(url: str, experiment: int, step: int, split: str) -> np.ndarray:
    from engine.analysis.views import load_experiment, version_of_step
    from storage import load_feature_set

    db = get_engine(url)
    version = version_of_step(load_experiment(db, experiment)[1], step)
    with session_scope(db) as s:
        return np.asarray(load_feature_set(s, version.id, split, "encoder")[0])

