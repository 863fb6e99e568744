"""SQL sources hold to the rules of the other doors (issue 39): a time limit on every statement, fetch and connection,
and errors that never quote the query's data (a password selected as a vector, a file read by pg_read_file)."""
from __future__ import annotations

import socket
import sqlite3
import threading

import pytest

from engine.sources import SourceError, open_source

SECRET = "hunter2-do-not-print"


def users_db(path):
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER, password TEXT, label INTEGER)")
        conn.execute("INSERT INTO users VALUES (1, ?, 0)", (SECRET,))
        conn.execute("CREATE VIEW forever AS WITH RECURSIVE n(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n) "
                     "SELECT id, '[1.0, 2.0]' AS vector, 0 AS label FROM n")
    conn.close()
    return path


def read(text: str):
    return list(open_source(text, what="old gallery").blocks(64))


def test_a_selected_secret_is_never_echoed(tmp_path):
    db = users_db(tmp_path / "u.db")
    with pytest.raises(SourceError) as exc:
        read(f"sql:sqlite:///{db}#query=SELECT id, password AS vector, label FROM users")
    assert SECRET not in str(exc.value) and "its value is not shown" in str(exc.value)


def test_a_database_error_names_its_class_not_its_message(tmp_path):
    db = users_db(tmp_path / "u.db")
    with pytest.raises(SourceError, match="the query fails: no such table: missing$"):
        read(f"sql:sqlite:///{db}#table=missing")  # a naming-only message is shown as it is
    with pytest.raises(SourceError, match=r"the query fails: OperationalError \(SQLITE_ERROR\) \(the database's message "
                                          r"is not shown"):
        read(f"sql:sqlite:///{db}#query=SELECT id, vector FROM users WHERE password = '{SECRET}' GROUP")


def test_an_endless_recursive_view_ends_at_the_time_limit(tmp_path):
    db = users_db(tmp_path / "u.db")
    with pytest.raises(SourceError, match="ran past its time limit of 1 s"):
        open_source(f"sql:sqlite:///{db}#table=forever&timeout=1", what="old gallery").ids()


def test_a_statement_that_never_returns_a_row_is_interrupted(tmp_path):
    db = users_db(tmp_path / "u.db")
    slow = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT 1 AS id, '[1.0]' AS vector "
            "FROM (SELECT count(*) FROM n)")
    with pytest.raises(SourceError, match="ran past its time limit of 1 s"):
        read(f"sql:sqlite:///{db}#query={slow}&timeout=1")


@pytest.mark.parametrize("bad", ["0", "x", "86401", "1.5"])
def test_bad_timeouts_are_refused(tmp_path, bad):
    db = users_db(tmp_path / "u.db")
    with pytest.raises(SourceError, match=r"timeout must be whole seconds in 1\.\.86400"):
        open_source(f"sql:sqlite:///{db}#table=users&timeout={bad}", what="old gallery")


def test_a_server_that_accepts_and_never_answers_is_given_up_on():
    """A socket that accepts the connection and says nothing: libpq's connect_timeout (2 s, the smallest) ends it."""
    pytest.importorskip("psycopg")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    held = []
    threading.Thread(target=lambda: held.append(listener.accept()), daemon=True).start()
    try:
        port = listener.getsockname()[1]
        with pytest.raises(SourceError, match="cannot be reached"):
            open_source(f"sql:postgresql+psycopg://lab:pw@127.0.0.1:{port}/x#table=t&timeout=2", what="old gallery")
    finally:
        for conn, _ in held:
            conn.close()
        listener.close()


def test_postgresql_sleeps_and_file_reads_are_bounded_and_unquoted(pg_server):
    from sqlalchemy import create_engine, text

    url = pg_server.create_database()
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE users (id bigint, password text)"))
            conn.execute(text("INSERT INTO users VALUES (1, :p)"), {"p": SECRET})
        with pytest.raises(SourceError) as exc:
            read(f"sql:{url}#query=SELECT id, password::int AS vector FROM users")
        assert SECRET not in str(exc.value) and "InvalidTextRepresentation (22P02)" in str(exc.value)
        with pytest.raises(SourceError, match="ran past its time limit of 2 s"):
            read(f"sql:{url}#query=SELECT 1 AS id, ARRAY[1.0] AS vector FROM pg_sleep(100000)&timeout=2")
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------------------- secrets in job payloads
def test_a_payload_keeps_no_secret_only_a_reference(monkeypatch):
    from engine.core.contract import sources_check_payload

    monkeypatch.setenv("COMPATLAB_ALLOW_HOSTS", "db,db:6333")

    base = {"old_queries": "/data/oq.parquet", "new_queries": "/data/nq.parquet"}
    for text, what in ((f"sql:postgresql+psycopg://lab:{SECRET}@db/x#table=t", "a password in its URL"),
                       ("qdrant:http://db:6333#collection=c&api_key=abc", "a value of api_key")):
        with pytest.raises(ValueError, match=f"the old gallery holds {what}; a job's payload is stored") as exc:
            sources_check_payload({**base, "old_gallery": text}, relevance="labels")
        assert SECRET not in str(exc.value) and "abc" not in str(exc.value)
    ref = "sql:postgresql+psycopg://lab:${SOURCE_SECRET_PG}@db/x#table=t"
    assert sources_check_payload({**base, "old_gallery": ref}, relevance="labels")["sources"]["old_gallery"] == ref


def test_a_reference_is_resolved_from_the_readers_environment(tmp_path, monkeypatch):
    db = users_db(tmp_path / "u.db")
    text = "sql:sqlite:///${SOURCE_SECRET_DB}#query=SELECT id, '[1.0]' AS vector FROM users"
    with pytest.raises(SourceError, match=r"names the secret \$\{SOURCE_SECRET_DB\}, which this process's environment"):
        open_source(text, what="old gallery")
    monkeypatch.setenv("SOURCE_SECRET_DB", str(db))
    assert open_source(text, what="old gallery").ids().tolist() == [1]
    monkeypatch.setenv("COMPATLAB_SECRET", "the dashboard's own secret")  # only SOURCE_SECRET_* is ever read
    with pytest.raises(SourceError):
        open_source("sql:sqlite:///${COMPATLAB_SECRET}#table=users", what="old gallery")


@pytest.mark.parametrize("name", ["a\x1b[31m", "b\u202e", "x" * 41])
def test_model_names_on_the_sources_form_follow_the_one_name_rule(name):
    from engine.core.contract import sources_check_payload

    base = {"old_gallery": "/d/g.parquet", "old_queries": "/d/oq.parquet", "new_queries": "/d/nq.parquet"}
    with pytest.raises(ValueError, match="model name must be 1..40 printable characters"):
        sources_check_payload(base, relevance="labels", names=("old", name))


def test_a_job_label_masks_secret_options_as_messages_do():
    from engine.core.contract import job_label  # the jobs table's label

    label = job_label("sources_check", {"sources": {"old_gallery": "qdrant:http://db:6333#collection=c&api_key=abc"},
                                        "relevance": "labels"})
    assert "abc" not in label and "api_key=***" in label


def test_one_masking_function_for_every_label_message_and_export():
    """storage.secrets.mask_url is the only masking function (issue 40: two of them once showed a Qdrant api_key in
    clear on Overview); it masks passwords, bare tokens and secret keys' values in URLs, source texts and messages."""
    import pathlib
    import re

    from storage import mask_url

    root = pathlib.Path(__file__).resolve().parents[1]
    defs = [str(p.relative_to(root)) for folder in ("engine", "app", "storage") for p in (root / folder).rglob("*.py")
            if re.search(r"^def mask(_url|_in|_source)?\(", p.read_text(encoding="utf-8"), re.MULTILINE)]
    assert defs == ["storage/secrets.py"]
    assert mask_url("qdrant:https://q.example:6333#collection=c&api_key=abc") == \
        "qdrant:https://q.example:6333#collection=c&api_key=***"
    assert mask_url("https://ghp_token@host/x.parquet") == "https://***@host/x.parquet"
    assert mask_url("cannot reach postgresql+psycopg://lab:pw@db/x (timeout)") == \
        "cannot reach postgresql+psycopg://lab:***@db/x (timeout)"


def test_a_job_contacts_no_host_the_operator_did_not_allow(tmp_path, monkeypatch):
    """From the browser no host is contacted by default: the payload is refused before anything is sent (a listener
    would have received a HEAD or a GET); --allow-host HOST[:PORT] lets one in, on one port or every port."""
    import socket

    from engine.core.contract import sources_check_payload
    from engine.data import roots

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.0)
    port = listener.getsockname()[1]
    base = {"old_queries": "/d/oq.parquet", "new_queries": "/d/nq.parquet"}
    text = f"parquet:http://127.0.0.1:{port}/internal-admin/g.parquet"
    try:
        with pytest.raises(ValueError, match=f"names host 127.0.0.1:{port}, which the operator has not allowed"):
            sources_check_payload({**base, "old_gallery": text}, relevance="labels")
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing connected
    finally:
        listener.close()
    parser = __import__("argparse").ArgumentParser()
    roots.add_arguments(parser, torchscript=True)
    monkeypatch.delenv("COMPATLAB_ALLOW_HOSTS", raising=False)
    roots.export(parser.parse_args(["--allow-host", "127.0.0.1"]))
    assert sources_check_payload({**base, "old_gallery": text}, relevance="labels")["sources"]["old_gallery"] == text
    monkeypatch.setenv("COMPATLAB_ALLOW_HOSTS", "127.0.0.1:1")
    with pytest.raises(ValueError, match="not allowed"):
        sources_check_payload({**base, "old_gallery": text}, relevance="labels")
