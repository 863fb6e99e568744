"""Qrels read from the stores the product reads vectors from (engine.sources.qrels.STORES): the same graded judgements
as a TREC or BEIR file, a SQLite, PostgreSQL or LanceDB table and a Qdrant collection's payloads read back to the same
table, ids as text; each bad store one line, passwords never shown, nothing written; and check-upgrade gives the same
numbers with qrels from SQLite as from a .tsv."""
from __future__ import annotations

import sqlite3
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
from support.sources import fingerprint, fixed_list
from support.upgrade_sources import NQ, close_json, embeddings, ids_for, run, tables, write_all

from engine.core.kinds import QRELS, SOURCES
from engine.sources import SourceError, qrels
from engine.sources.qrels import STORES, TEXT_FORMATS, read_qrels

# graded judgements whose ids a number parser would spoil (leading zeros, a dot, a hash, an exponent) or that are not
# ASCII; none holds a space, so a TREC file can carry them too
JUDGED = [("q007", "d0010", 2), ("q007", "d.11", 0), ("q007", "doc#3", 1), ("1e3", "001", 3), ("1e3", "d0010", 1),
          ("запрос", "文書-1", 2)]
# ids with spaces and accents: a BEIR .tsv keeps them, as every store does
SPACED = [("query one", "doc é 1", 1), ("query one", "d  2", 3), ("q-two", "doc é 1", 2)]


def triples(table) -> list[tuple[str, str, float]]:
    return sorted(zip(table.query.tolist(), table.item.tolist(), table.grade.tolist()))


def want(rows) -> list[tuple[str, str, float]]:
    return sorted((q, d, float(g)) for q, d, g in rows)


def write_store(kind: str, folder, rows, *, name: str = "judged", pg_url: str | None = None) -> str:
    """``rows`` as a table (with a vector column beside them, never read) or a collection; each kind names its columns
    its own way, read by their usual names or by options; returns the qrels text."""
    folder.mkdir(parents=True, exist_ok=True)
    queries, items, grades = ([r[k] for r in rows] for k in range(3))
    vectors = np.arange(2 * len(rows), dtype=np.float32).reshape(len(rows), 2)
    if kind == "sqlite":
        with sqlite3.connect(folder / "q.db") as conn:
            conn.execute(f"CREATE TABLE {name} (qid TEXT, docid TEXT, rel INTEGER, note TEXT, vector TEXT)")
            conn.executemany(f"INSERT INTO {name} VALUES (?, ?, ?, 'secret note', '[1, 2]')", rows)
        conn.close()
        return f"sql:sqlite:///{folder / 'q.db'}#table={name}"
    if kind == "postgresql":
        from sqlalchemy import create_engine, text

        engine = create_engine(pg_url)
        with engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE {name} (who text, what text, how int, vector real[])"))
            conn.execute(text(f"INSERT INTO {name} VALUES (:q, :d, :g, :v)"),
                         [{"q": q, "d": d, "g": g, "v": [1.0, 2.0]} for q, d, g in rows])
        engine.dispose()
        return f"sql:{pg_url}#table={name}&query=who&item=what&grade=how"
    if kind == "lance":
        import lancedb

        lancedb.connect(str(folder / "lance")).create_table(name, pa.table(
            {"query-id": queries, "corpus-id": items, "score": grades, "note": ["x"] * len(rows),
             "vector": fixed_list(vectors)}))
        return f"lance:{folder / 'lance'}#table={name}"
    import qdrant_client
    from qdrant_client import models

    client = qdrant_client.QdrantClient(path=str(folder / "qd"))
    client.create_collection(name, vectors_config=models.VectorParams(size=2, distance=models.Distance.DOT))
    client.upsert(name, [models.PointStruct(id=n, vector=v.tolist(), payload={"query_id": q, "item_id": d,
                                                                              "grade": g, "note": "x"})
                         for n, (q, d, g, v) in enumerate(zip(queries, items, grades, vectors))])
    client.close()
    return f"qdrant:{folder / 'qd'}#collection={name}"


STORE_KINDS = ["sqlite", "postgresql", "lance", "qdrant"]


def needs(kind: str, request) -> str | None:
    """Skips a kind whose library is absent; the PostgreSQL kind's new database URL."""
    if kind in ("lance", "qdrant"):
        pytest.importorskip("lancedb" if kind == "lance" else "qdrant_client")
    return request.getfixturevalue("pg_server").create_database() if kind == "postgresql" else None


def test_the_qrels_kinds_are_the_files_and_the_stores_readers():
    assert set(QRELS) == {*TEXT_FORMATS, "parquet", *STORES} and set(STORES) <= set(SOURCES)


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_the_same_judgements_read_the_same_from_a_trec_file_and_every_store(kind, tmp_path, request, monkeypatch):
    pg_url = needs(kind, request)
    monkeypatch.setattr(qrels, "BLOCK_ROWS", 4)  # 6 judgements: two blocks
    (tmp_path / "j.txt").write_text("".join(f"{q} 0 {d} {g}\n" for q, d, g in JUDGED))
    trec = read_qrels(str(tmp_path / "j.txt"))
    assert triples(trec) == want(JUDGED)
    text = write_store(kind, tmp_path / kind, JUDGED, pg_url=pg_url)
    before = fingerprint(tmp_path / kind) if kind != "postgresql" else None
    got = read_qrels(text)
    assert triples(got) == triples(trec)  # grades are small integers: equal exactly
    assert got.query.dtype.kind == got.item.dtype.kind == "U" and got.grade.dtype == np.float64
    if before is not None:
        assert fingerprint(tmp_path / kind) == before  # nothing written to the store, not even a lock
    # ids with spaces and accents: as a BEIR .tsv has them
    (tmp_path / "s.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{g}\n" for q, d, g in SPACED))
    spaced = read_qrels(write_store(kind, tmp_path / kind, SPACED, name="spaced", pg_url=pg_url))
    assert triples(spaced) == want(SPACED) == triples(read_qrels(str(tmp_path / "s.tsv")))


def test_a_store_is_recognised_without_its_prefix(tmp_path):
    """As a source is: a SQL URL, a TABLE.lance folder, a Qdrant local-mode folder."""
    sql = write_store("sqlite", tmp_path / "s", JUDGED)
    texts = [sql.removeprefix("sql:")]
    if _have("lancedb"):
        write_store("lance", tmp_path / "l", JUDGED)
        texts.append(str(tmp_path / "l" / "lance" / "judged.lance"))
    if _have("qdrant_client"):
        texts.append(write_store("qdrant", tmp_path / "q", JUDGED).removeprefix("qdrant:"))
    for text in texts:
        assert triples(read_qrels(text)) == want(JUDGED), text


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_qdrant_server_scrolls_the_payload_fields_only(monkeypatch):
    """The server path (qdrant-client's in-memory client answers what a server does): pages of points, never a
    vector, and past the first point only the three payload fields."""
    qdrant_client = pytest.importorskip("qdrant_client")
    from qdrant_client import models

    client = qdrant_client.QdrantClient(":memory:")
    client.create_collection("judged", vectors_config=models.VectorParams(size=2, distance=models.Distance.DOT))
    client.upsert("judged", [models.PointStruct(id=n, vector=[1.0, 0.0], payload={"qid": q, "docid": d, "rel": g,
                                                                                  "text": "a long document"})
                             for n, (q, d, g) in enumerate(JUDGED)])
    calls = []
    scroll = client.scroll

    def spy(*args, **kw):
        calls.append((kw["with_vectors"], kw["with_payload"]))
        return scroll(*args, **kw)

    monkeypatch.setattr(client, "scroll", spy)
    monkeypatch.setattr(qrels, "BLOCK_ROWS", 4)
    monkeypatch.setattr(qdrant_client, "QdrantClient", lambda **kw: client)
    got = read_qrels("qdrant:https://me:hunter2@q.example:6333#collection=judged&api_key=k")
    assert triples(got) == want(JUDGED) and "hunter2" not in got.description and "=k" not in got.description
    assert calls == [(False, True)] + [(False, ["qid", "docid", "rel"])] * 2  # 6 points in pages of 4


@pytest.mark.parametrize("kind, options, message", [
    ("sqlite", "&grade=nope", r"has no grade column 'nope' \(columns: qid, docid, rel, note, vector\)"),
    ("sqlite", "&grade=note", r": a grade is not a number \(a str; its value is not shown\)$"),
    ("sqlite", "&query=SELECT qid, docid FROM judged", r"qrels are read from a table or view \(#table=NAME\)"),
    ("lance", "&item=nope", r"has no item column 'nope' \(columns: query-id, corpus-id, score, note, vector\)"),
    ("lance", "&grade=note", r": a grade is not a number \(a str; its value is not shown\)$"),
    ("qdrant", "&query=nope", r"has no query payload field 'nope' \(payload fields: query_id, item_id, grade, note\)"),
    ("qdrant", "&grade=note", r": a grade is not a number \(a str; its value is not shown\)$"),
])
def test_a_bad_column_or_grade_is_one_line(kind, options, message, tmp_path):
    if kind != "sqlite":
        pytest.importorskip("lancedb" if kind == "lance" else "qdrant_client")
    text = write_store(kind, tmp_path, JUDGED) + options
    with pytest.raises(SourceError, match=message) as err:
        read_qrels(text)
    assert "\n" not in str(err.value) and "secret note" not in str(err.value)


@pytest.mark.parametrize("kind, change, message", [
    ("sqlite", ("#table=judged", "#table=gone"), r"the query fails: no such table: gone$"),
    ("sqlite", ("#table=judged", ""), r"names no table; add #table=NAME"),
    ("lance", ("#table=judged", "#table=gone"), r"cannot be opened: .*gone"),
    ("qdrant", ("#collection=judged", "#collection=gone"), r"has no collection 'gone' \(collections: judged\)"),
])
def test_a_missing_table_or_collection_is_one_line(kind, change, message, tmp_path):
    if kind != "sqlite":
        pytest.importorskip("lancedb" if kind == "lance" else "qdrant_client")
    text = write_store(kind, tmp_path, JUDGED).replace(*change)
    with pytest.raises(SourceError, match=message) as err:
        read_qrels(text)
    assert "\n" not in str(err.value)


def test_a_sql_password_is_never_shown(tmp_path, request, monkeypatch):
    """Unreachable, or reached with a missing table: the line masks the password; a stored reference is resolved."""
    with pytest.raises(SourceError, match=r"qrels sql:postgresql\+psycopg://lab:\*\*\*@127.0.0.1:1/x#table=j cannot be "
                                          r"reached") as err:
        read_qrels("sql:postgresql+psycopg://lab:hunter2@127.0.0.1:1/x#table=j")
    assert "hunter2" not in str(err.value) and "\n" not in str(err.value)
    pg_url = request.getfixturevalue("pg_server").create_database()
    text = write_store("postgresql", tmp_path, JUDGED, pg_url=pg_url)
    with_password = text.replace("@", ":hunter2@", 1)  # a trust login: the server never asks for the password
    assert triples(read_qrels(with_password)) == want(JUDGED)
    with pytest.raises(SourceError, match=r'relation "gone" does not exist') as err:
        read_qrels(with_password.replace("#table=judged", "#table=gone"))
    assert "hunter2" not in str(err.value) and ":***@" in str(err.value)
    monkeypatch.setenv("SOURCE_SECRET_PG", "hunter2")
    assert triples(read_qrels(text.replace("@", ":${SOURCE_SECRET_PG}@", 1))) == want(JUDGED)


def test_check_upgrade_gives_the_same_numbers_with_qrels_from_sqlite_as_from_a_tsv(tmp_path):
    drift = embeddings()
    g_ids, q_ids = ids_for(drift, text=True)
    rng = np.random.default_rng(5)
    rows = [(str(q_ids[qi]), str(g_ids[j]), int(rng.integers(1, 4)))
            for qi in range(NQ) for j in rng.choice(len(g_ids), size=4, replace=False)]
    (tmp_path / "q.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{g}\n" for q, d, g in rows))
    specs = write_all("npz", tmp_path / "s", tables(drift, text=True))
    from_tsv = run(replace(specs, qrels=str(tmp_path / "q.tsv"))).to_json()
    from_sql = run(replace(specs, qrels=write_store("sqlite", tmp_path / "db", rows))).to_json()
    assert from_tsv["relevance"] == "qrels" and from_tsv["sources"]["qrels"] != from_sql["sources"]["qrels"]
    from_tsv.pop("sources"), from_sql.pop("sources")
    close_json(from_tsv, from_sql)
