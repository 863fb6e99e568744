"""storage: where the database lives, SQLite pragmas, sessions, JSON and datetimes, schema portability."""
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import inspect, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import StatementError
from sqlalchemy.schema import CreateIndex, CreateTable

from storage import (
    Base,
    Experiment,
    Job,
    Study,
    create_experiment,
    create_study,
    default_db_url,
    enqueue_job,
    get_engine,
    init_db,
    session_scope,
)

TABLES = {"studies", "experiments", "model_versions", "feature_sets", "compatibility_matrices", "analyses", "jobs",
          "source_checks"}  # no tasks table since the task layer went (issue 41); an old database keeps its own


def test_sqlite_connections_use_wal_foreign_keys_and_a_busy_timeout(engine):
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000


def test_init_db_creates_every_table_and_is_idempotent(engine):
    init_db(engine)
    init_db(engine)
    assert set(inspect(engine).get_table_names()) == TABLES
    assert "ix_experiments_config_hash" in {index["name"] for index in inspect(engine).get_indexes("experiments")}


def test_default_url_is_data_compatlab_db_under_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("COMPATLAB_DB_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_db_url() == f"sqlite:///{(tmp_path / 'data' / 'compatlab.db').as_posix()}"
    engine = get_engine()
    init_db(engine)
    assert (tmp_path / "data" / "compatlab.db").is_file()
    engine.dispose()


def test_environment_url_is_honoured_and_an_explicit_url_wins(tmp_path, monkeypatch):
    env_db, explicit_db = tmp_path / "env" / "from_env.db", tmp_path / "explicit.db"
    monkeypatch.setenv("COMPATLAB_DB_URL", f"sqlite:///{env_db}")
    monkeypatch.chdir(tmp_path)
    assert default_db_url() == f"sqlite:///{env_db}"
    engine = get_engine()
    init_db(engine)
    assert Path(engine.url.database) == env_db and env_db.is_file()
    assert not (tmp_path / "data").exists()
    assert Path(get_engine(f"sqlite:///{explicit_db}").url.database) == explicit_db
    engine.dispose()


def test_engine_is_cached_per_url(tmp_path):
    first, second = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    assert get_engine(first) is get_engine(first)
    assert get_engine(first) is not get_engine(second)


def test_session_scope_commits_on_success_and_rolls_back_on_error(engine):
    with session_scope(engine) as session:
        create_study(session, name="kept", kind="compare")
    with pytest.raises(RuntimeError, match="boom"):
        with session_scope(engine) as session:
            create_study(session, name="lost", kind="compare")
            raise RuntimeError("boom")
    with session_scope(engine) as session:
        assert session.scalars(select(Study.name)).all() == ["kept"]


def test_rows_stay_readable_after_the_session_closes(engine):
    with session_scope(engine) as session:
        study = create_study(session, name="s", kind="checkpoints", config={"steps": 3})
    assert (study.id, study.name, study.config) == (1, "s", {"steps": 3})


def test_datetimes_are_timezone_aware_utc_and_naive_ones_are_refused(engine):
    before = datetime.now(timezone.utc)
    with session_scope(engine) as session:
        experiment_id = create_experiment(session, name="e", method="bct", config={}, config_hash="h").id
    with session_scope(engine) as session:
        created = session.get(Experiment, experiment_id).created_at
    assert created.tzinfo is not None and created.utcoffset() == timedelta(0)
    assert before <= created <= datetime.now(timezone.utc)

    plus_two = timezone(timedelta(hours=2))
    with session_scope(engine) as session:
        session.get(Experiment, experiment_id).finished_at = datetime(2030, 1, 1, 12, 0, tzinfo=plus_two)
    with session_scope(engine) as session:
        assert session.get(Experiment, experiment_id).finished_at == datetime(2030, 1, 1, 10, 0, tzinfo=timezone.utc)

    with pytest.raises(StatementError, match="naive datetime"):
        with session_scope(engine) as session:
            session.get(Experiment, experiment_id).finished_at = datetime(2030, 1, 1)


def test_json_columns_accept_numpy_values_and_store_non_finite_floats_as_null(engine):
    payload = {"lr": np.float32(0.5), "classes": np.arange(3), "flag": np.bool_(True), "ac": math.nan, "x": math.inf}
    with session_scope(engine) as session:
        job_id = enqueue_job(session, "train", payload)
    with session_scope(engine) as session:
        assert session.get(Job, job_id).payload == {"lr": 0.5, "classes": [0, 1, 2], "flag": True, "ac": None,
                                                    "x": None}


def test_schema_compiles_for_postgresql():
    dialect = postgresql.dialect()
    ddl = "\n".join(str(CreateTable(table).compile(dialect=dialect)) for table in Base.metadata.sorted_tables)
    ddl += "\n".join(str(CreateIndex(index).compile(dialect=dialect))
                     for table in Base.metadata.sorted_tables for index in table.indexes)
    assert "BYTEA" in ddl and "JSON" in ddl and "TIMESTAMP WITH TIME ZONE" in ddl
    assert "ON DELETE CASCADE" in ddl and "ON DELETE SET NULL" in ddl


def test_mask_url_hides_passwords_even_in_unparsable_urls():
    from storage import mask_url

    assert mask_url("postgresql+psycopg://lab:s3cret@db.example:5432/compat") == "postgresql+psycopg://lab:***@db.example:5432/compat"
    assert mask_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    shown = mask_url("postgresql://lab:s3cret@host:notaport/db")  # SQLAlchemy refuses the port
    assert "s3cret" not in shown and shown.startswith("postgresql://lab:***@")
