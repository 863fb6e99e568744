"""A database written by the version with a task layer of its own (a ``tasks`` table, a ``jobs.lease_until`` column,
jobs of kinds "search", "extract" and "cell") still opens and works: its jobs are listed and labelled, a new job is
queued, claimed and finished, a running task job left behind is failed as stale, an old task job is not retried, and
deleting a job still cascades to its tasks. Built with the old DDL in raw SQL; SQLite and PostgreSQL."""
from datetime import timedelta

import pytest
from sqlalchemy import text

from engine.core.contract import job_label
from storage import (Job, claim_next_job, enqueue_job, fail_stale_jobs, finish_job, get_engine, init_db, list_jobs,
                     retry_job, session_scope)
from storage.clock import db_now

pytestmark = pytest.mark.both_databases

OLD_DDL = (  # what the old storage.models added beside today's tables
    "ALTER TABLE jobs ADD COLUMN lease_until TIMESTAMP",
    """CREATE TABLE tasks (
        id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
        kind VARCHAR(50), payload TEXT, state VARCHAR(20), deps_left INTEGER, upstream TEXT, downstream TEXT,
        needs_gpu BOOLEAN, attempts INTEGER, max_attempts INTEGER, worker VARCHAR(200), lease VARCHAR(64),
        lease_until TIMESTAMP, heartbeat_at TIMESTAMP, error TEXT, result TEXT, arrays BYTEA,
        created_at TIMESTAMP, started_at TIMESTAMP, finished_at TIMESTAMP)""",
)


def _old_database(url: str) -> dict[str, int]:
    """A database as the old version left it: a finished cells job, a running extract job with tasks, a "cell" job."""
    db = get_engine(url)
    init_db(db)
    with session_scope(db) as s:
        ids = {kind: enqueue_job(s, "run", {"old": kind}) for kind in ("search", "extract", "cell")}
    with db.begin() as c:
        for ddl in OLD_DDL:
            sqlite = db.dialect.name == "sqlite"  # the dialects' own words for an id column and bytes
            c.execute(text(ddl.replace("BYTEA", "BLOB") if sqlite else ddl.replace("INTEGER PRIMARY KEY", "SERIAL "
                                                                                    "PRIMARY KEY")))
        for kind, job_id in ids.items():
            status = "running" if kind == "extract" else "done"
            c.execute(text("UPDATE jobs SET kind = :kind, status = :status, payload = :payload, started_at = "
                           "created_at, heartbeat_at = created_at, lease_until = created_at WHERE id = :id"),
                      {"kind": kind, "status": status, "id": job_id,
                       "payload": '{"cells": [{"query": 1, "gallery": 2}], "label": "experiment 1, encoder"}'
                       if kind != "extract" else '{"kind": "extract", "images": "imagefolder:/x", "split": "gallery",'
                                                 ' "model_version_id": 3}'})
            for n in range(2):
                c.execute(text("INSERT INTO tasks (job_id, kind, payload, state, deps_left, upstream, downstream, "
                               "needs_gpu, attempts, max_attempts, created_at) VALUES (:job, :kind, '{}', :state, 0, "
                               "'[]', '[]', false, 1, 3, CURRENT_TIMESTAMP)"),
                          {"job": job_id, "kind": kind, "state": "running" if status == "running" else "done"})
    db.dispose()
    return ids


def test_a_database_of_the_task_layer_opens_and_works(db_url):
    ids = _old_database(db_url)
    db = get_engine(db_url)
    init_db(db)  # as the app and the worker open it
    with session_scope(db) as s:
        listed = {j.id: (j.kind, j.status, job_label(j.kind, j.payload)) for j in list_jobs(s)}
    assert listed[ids["search"]] == ("search", "done", "experiment 1, encoder: 1 cells")
    assert listed[ids["cell"]] == ("cell", "done", "experiment 1, encoder: 1 cells")
    assert listed[ids["extract"]][2] == "extract: imagefolder:/x by model version #3 (gallery)"
    with session_scope(db) as s:  # a new job runs as on a new database
        new = enqueue_job(s, "run", {"preset": "digits-tiny"})
    claimed = claim_next_job(db, 1)
    assert claimed.id == new
    with session_scope(db) as s:
        assert finish_job(s, new, "done", lease=claimed.lease)
        # the old running task job has no worker beating its heart: failed as stale like any silent job
        assert fail_stale_jobs(s, 60.0, now=db_now(s) + timedelta(seconds=61)) == [ids["extract"]]
        with pytest.raises(ValueError, match="ran as tasks of an older version"):
            retry_job(s, ids["search"])
        assert s.get(Job, new).status == "done" and s.get(Job, ids["extract"]).status == "failed"
    with db.begin() as c:  # the unmapped table is left as it was, and still follows its jobs
        assert c.execute(text("SELECT count(*) FROM tasks")).scalar() == 6
        c.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": ids["cell"]})
        assert c.execute(text("SELECT count(*) FROM tasks")).scalar() == 4
