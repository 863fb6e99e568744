"""Model versions' user names: the column added to an older database, and rename_model_version's rules."""
from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import create_engine

from storage import add_model_version, create_experiment, get_engine, init_db, rename_model_version, session_scope
from storage.migrate import add_missing_columns
from storage.models import ModelVersion


def two_versions(url: str) -> tuple[int, int]:
    db = get_engine(url)
    init_db(db)
    with session_scope(db) as s:
        exp = create_experiment(s, name="e", method="bct", config={}, config_hash="h")
        return tuple(add_model_version(s, exp.id, t, architecture="a", method="bct", classes=[0], num_outputs=1,
                                       feature_dim=2).id for t in (1, 2))  # type: ignore[return-value]


def test_an_older_database_gains_the_name_column(tmp_path):
    path = tmp_path / "old.db"
    two_versions(f"sqlite:///{path}")
    with sqlite3.connect(path) as c:  # as a database made before names existed
        c.execute("ALTER TABLE model_versions DROP COLUMN name")
        assert "name" not in [r[1] for r in c.execute("PRAGMA table_info(model_versions)")]
    db = create_engine(f"sqlite:///{path}")
    assert add_missing_columns(db) == ["model_versions.name"]  # what init_db runs on an existing database
    with sqlite3.connect(path) as c:
        assert "name" in [r[1] for r in c.execute("PRAGMA table_info(model_versions)")]
    with session_scope(db) as s:
        assert [mv.name for mv in s.query(ModelVersion).order_by(ModelVersion.step)] == [None, None]


def test_rename_sets_clears_and_refuses_duplicates(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    a, b = two_versions(url)
    with session_scope(get_engine(url)) as s:
        rename_model_version(s, a, "  v1 ")
        assert s.get(ModelVersion, a).name == "v1"
        with pytest.raises(ValueError, match="step 1 is already named 'v1'"):
            rename_model_version(s, b, "v1")
        with pytest.raises(ValueError, match="printable"):
            rename_model_version(s, b, "x" * 41)
        rename_model_version(s, a, "")
        assert s.get(ModelVersion, a).name is None
        with pytest.raises(ValueError):
            rename_model_version(s, 999, "v3")


def test_record_version_stores_the_given_name(tmp_path):
    import numpy as np

    from engine.results.record import NewVersion, record_version, start_experiment

    db = get_engine(f"sqlite:///{tmp_path / 'x.db'}")
    init_db(db)
    with session_scope(db) as s:
        exp = start_experiment(s, name="e", method="checkpoints", config={})
        out = {"gallery": {"encoder": np.ones((2, 3), np.float32)}}
        ids = [record_version(s, exp, t, NewVersion(architecture="a", method="checkpoints", classes=[0], num_outputs=1,
                                                 feature_dim=3, outputs=out, labels={"gallery": np.zeros(2, np.int64)},
                                                 name=name))
               for t, name in ((1, "v1"), (2, None))]
        assert [s.get(ModelVersion, i).name for i in ids] == ["v1", None]
