"""Shared by several test modules; moved from tests/test_pipeline.py."""
from sqlalchemy import func, select

from engine.core.config import config_from_dict
from engine.run.pipeline import RunContext
from storage import get_engine, session_scope

TINY = {
    "dataset": {"name": "digits"},
    "scenario": {"initial_classes": 4, "increment": 3, "num_steps": 3},
    "model": {"backbone": "small_cnn", "width": 8},
    "training": {"epochs": 1, "batch_size": 64, "lr": 0.05},
}


def _cfg(**over):
    data = {**TINY, **over}
    return config_from_dict(data)


def _ctx(tmp_path, db_url=None, **kw):
    return RunContext(get_engine(db_url or f"sqlite:///{tmp_path / 'db.sqlite'}"), tmp_path / "ckpt", **kw)


def _count(db, model):
    with session_scope(db) as s:
        return s.scalar(select(func.count()).select_from(model))

