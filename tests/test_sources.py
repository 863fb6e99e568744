"""engine.sources: the same vectors written to every kind of store read back identical through one interface,
in blocks of several sizes; the join by id; every bad input's one line; credentials masked; nothing written."""
from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.sources import SourceError, join_by_id, mask_url, open_source
from support.featurestore import s3_root  # noqa: F401  (moto's S3 server on 127.0.0.1)
from support.sources import D, N, data, fingerprint, fixed_list, write_parquet  # noqa: F401 (fixtures among them)

BLOCKS = (1, 7, 64, 200, 1000)




def read_all(source, rows):
    blocks = list(source.blocks(rows))
    assert all(len(b) == rows for b in blocks[:-1]) and 0 < len(blocks[-1]) <= rows
    ids = np.concatenate([b.ids for b in blocks])
    vectors = np.concatenate([b.vectors for b in blocks])
    labels = None if blocks[0].labels is None else np.concatenate([b.labels for b in blocks])
    assert vectors.dtype == np.float32
    return ids, vectors, labels


def assert_same(source, data):  # noqa: F811
    ids, vectors, labels = data
    assert source.dim == D
    assert source.count in (N, None)  # None: a SQL query (its count is not known before reading)
    for rows in BLOCKS:
        got_ids, got_vectors, got_labels = read_all(source, rows)
        order = np.argsort(got_ids)
        want = np.argsort(ids)
        np.testing.assert_array_equal(got_ids[order], ids[want])
        np.testing.assert_array_equal(got_vectors[order], vectors[want])  # float32 in, float32 out: exact
        np.testing.assert_array_equal(got_labels[order], labels[want])
    assert sorted(source.ids().tolist()) == sorted(ids.tolist())




def write_npz(path, data, **extra):  # noqa: F811
    ids, vectors, labels = data
    np.savez_compressed(path, ids=ids, vectors=vectors, labels=labels, **extra)
    return path






def write_sqlite(path, data):  # noqa: F811
    ids, vectors, labels = data
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE items (id INTEGER, vector TEXT, label INTEGER)")
        conn.executemany("INSERT INTO items VALUES (?, ?, ?)",
                         [(int(i), json.dumps(v.tolist()), int(lab)) for i, v, lab in zip(*data, strict=True)])
    conn.close()
    return path


def test_npz_and_npy(tmp_path, data):  # noqa: F811
    path = write_npz(tmp_path / "e.npz", data)
    before = fingerprint(tmp_path)
    source = open_source(str(path), what="old gallery")
    assert source.count == N
    assert_same(source, data)
    vectors_only = tmp_path / "v.npy"
    np.save(vectors_only, data[1])
    ids, vectors, labels = read_all(open_source(f"npy:{vectors_only}", what="old gallery"), 64)
    np.testing.assert_array_equal(ids, np.arange(N))
    np.testing.assert_array_equal(vectors, data[1])
    assert labels is None
    assert fingerprint(tmp_path).items() >= before.items()  # only v.npy was added


def test_parquet_file_folder_and_fsspec(tmp_path, data):  # noqa: F811
    path = write_parquet(tmp_path / "e.parquet", data)
    before = fingerprint(tmp_path)
    assert_same(open_source(f"{path}#id=doc_id&vector=emb&label=cls", what="old gallery"), data)
    folder = tmp_path / "lake"
    folder.mkdir()
    half = N // 2
    write_parquet(folder / "a.parquet", tuple(a[:half] for a in data), vector_type="list")
    write_parquet(folder / "b.parquet", tuple(a[half:] for a in data), vector_type="list")
    assert_same(open_source(f"parquet:{folder}#id=doc_id&vector=emb&label=cls", what="old gallery"), data)
    assert fingerprint(tmp_path).items() >= before.items()
    ids, vectors, labels = data
    arrow_file = tmp_path / "e.arrow"  # Arrow IPC, in record batches of 30 (blocks cut across them)
    table = pa.table({"id": ids, "vector": fixed_list(vectors), "label": labels})
    with pa.ipc.new_file(arrow_file, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=30):
            writer.write_batch(batch)
    assert_same(open_source(str(arrow_file), what="old gallery"), data)
    import fsspec

    with fsspec.open("memory://lab/e.parquet", "wb") as handle:
        handle.write(path.read_bytes())
    assert_same(open_source("memory://lab/e.parquet#id=doc_id&vector=emb&label=cls", what="old gallery"), data)


def test_parquet_on_the_local_s3_server(s3_root, tmp_path, data):  # noqa: F811 - the fixture
    path = write_parquet(tmp_path / "e.parquet", data)
    s3_root.put(str(path), "lab/emb/e.parquet")
    half = N // 2
    for name, part in (("a", slice(0, half)), ("b", slice(half, N))):
        write_parquet(tmp_path / f"{name}.parquet", tuple(a[part] for a in data), vector_type="list")
        s3_root.put(str(tmp_path / f"{name}.parquet"), f"lab/lake/{name}.parquet")
    before = {p: s3_root.info(p)["ETag"] for p in s3_root.find("lab")}
    assert_same(open_source("s3://lab/emb/e.parquet#id=doc_id&vector=emb&label=cls", what="old gallery"), data)
    assert_same(open_source("parquet:s3://lab/lake#id=doc_id&vector=emb&label=cls", what="old gallery"), data)
    s3_root.invalidate_cache()
    assert {p: s3_root.info(p)["ETag"] for p in s3_root.find("lab")} == before


def test_lancedb_table(tmp_path, data):  # noqa: F811
    lancedb = pytest.importorskip("lancedb")
    ids, vectors, labels = data
    db = lancedb.connect(str(tmp_path / "lance"))
    db.create_table("items", pa.table({"id": ids, "vector": fixed_list(vectors), "label": labels}))
    before = fingerprint(tmp_path / "lance")
    source = open_source(f"lance:{tmp_path / 'lance'}#table=items", what="old gallery")
    assert source.count == N
    assert_same(source, data)
    assert_same(open_source(str(tmp_path / "lance" / "items.lance"), what="old gallery"), data)
    assert fingerprint(tmp_path / "lance") == before


def test_qdrant_local_mode(tmp_path, data):  # noqa: F811
    qdrant_client = pytest.importorskip("qdrant_client")
    from qdrant_client import models

    ids, vectors, labels = data
    client = qdrant_client.QdrantClient(path=str(tmp_path / "qd"))
    client.create_collection("items", vectors_config={
        "emb": models.VectorParams(size=D, distance=models.Distance.COSINE),
        "other": models.VectorParams(size=3, distance=models.Distance.DOT)})
    client.upsert("items", [models.PointStruct(id=int(i), vector={"emb": v.tolist(), "other": [1.0, 2.0, 3.0]},
                                               payload={"cls": int(lab)}) for i, v, lab in zip(*data, strict=True)])
    client.close()
    before = fingerprint(tmp_path / "qd")
    source = open_source(f"qdrant:{tmp_path / 'qd'}#collection=items&vector=emb&label=cls", what="old gallery")
    assert source.count == N
    assert_same(source, data)  # local mode persists points as upserted (a server keeps cosine ones unit-length)
    assert fingerprint(tmp_path / "qd") == before  # not even the client's .lock
    with pytest.raises(SourceError, match="named vectors emb, other; pick one"):
        open_source(f"qdrant:{tmp_path / 'qd'}#collection=items", what="old gallery")


def test_qdrant_server_path_scrolls_in_pages(monkeypatch, data):  # noqa: F811
    """The server reader (get_collection, scroll by pages, the label from the payload) against qdrant-client's
    in-memory client, which answers the same calls a server does (no Qdrant server runs here)."""
    qdrant_client = pytest.importorskip("qdrant_client")
    from qdrant_client import models

    client = qdrant_client.QdrantClient(":memory:")
    client.create_collection("items", vectors_config=models.VectorParams(size=D, distance=models.Distance.DOT))
    client.upsert("items", [models.PointStruct(id=int(i), vector=v.tolist(), payload={"label": int(lab), "text": "x"})
                            for i, v, lab in zip(*data, strict=True)])
    seen = {}

    def connect(url, api_key, timeout, check_compatibility):
        seen.update(url=url, api_key=api_key)
        return client

    monkeypatch.setattr(qdrant_client, "QdrantClient", connect)
    source = open_source("qdrant:https://me:pw@q.example:6333#collection=items&api_key=k", what="old gallery")
    assert seen == {"url": "https://me:pw@q.example:6333", "api_key": "k"}
    assert "pw" not in source.description and "=k" not in source.description
    assert source.count == N
    assert_same(source, data)


def test_qdrant_local_never_unpickles_other_classes(tmp_path, data):  # noqa: F811
    pytest.importorskip("qdrant_client")
    import pickle

    folder = tmp_path / "qd"
    (folder / "collection" / "items").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"collections": {"items": {"vectors": {"size": 2}}}, "aliases": {}}))
    with sqlite3.connect(folder / "collection" / "items" / "storage.sqlite") as conn:
        conn.execute("CREATE TABLE points (id TEXT PRIMARY KEY, point BLOB)")
        conn.execute("INSERT INTO points VALUES ('a', ?)", (pickle.dumps(os.getcwd),))
    conn.close()
    source = open_source(f"qdrant:{folder}#collection=items", what="old gallery")
    with pytest.raises(SourceError, match=r"cannot be read safely \(.*posix.getcwd is not a point\)"):
        list(source.blocks(10))


def test_qdrant_local_layout_is_pinned_to_the_tested_version(tmp_path):
    import importlib.metadata

    from engine.sources.qdrant import LOCAL_LAYOUT_VERSION

    pinned = (Path(__file__).resolve().parents[1] / "requirements-qdrant.txt").read_text(encoding="utf-8")
    assert f"qdrant-client=={LOCAL_LAYOUT_VERSION}" in pinned  # the layout read is the pinned client's
    try:
        assert importlib.metadata.version("qdrant-client") == LOCAL_LAYOUT_VERSION  # the tests write with that one
    except importlib.metadata.PackageNotFoundError:
        pass
    folder = tmp_path / "qd"
    (folder / "collection" / "items").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"collections": {"items": {"vectors": {"size": 2}}}, "aliases": {}}))
    with sqlite3.connect(folder / "collection" / "items" / "storage.sqlite") as conn:
        conn.execute("CREATE TABLE points (id TEXT PRIMARY KEY, point BLOB, version INTEGER)")  # another layout
    conn.close()
    with pytest.raises(SourceError, match=r"^old gallery .*points has columns id, point, version, not id, point: a "
                                          rf"local-mode layout this reader does not know \(it reads qdrant-client "
                                          rf"{LOCAL_LAYOUT_VERSION}'s\)$"):
        open_source(f"qdrant:{folder}#collection=items", what="old gallery")


def test_sqlite_json_arrays(tmp_path, data):  # noqa: F811
    path = write_sqlite(tmp_path / "e.db", data)
    before = fingerprint(tmp_path)
    assert_same(open_source(f"sql:sqlite:///{path}#table=items", what="old gallery"), data)
    query = "SELECT id, vector AS emb, label FROM items WHERE id >= 0"
    assert_same(open_source(f"sqlite:///{path}#query={query}&vector=emb", what="old gallery"), data)
    assert fingerprint(tmp_path) == before
    with pytest.raises(SourceError, match="one SELECT or WITH statement"):
        open_source(f"sqlite:///{path}#query=DELETE FROM items", what="old gallery")
    with pytest.raises(SourceError, match="readonly|read-only|one SELECT"):
        list(open_source(f"sqlite:///{path}#query=WITH x AS (SELECT 1) INSERT INTO items SELECT * FROM items",
                         what="old gallery").blocks(10))
    assert fingerprint(tmp_path) == before


def test_postgresql_real_arrays_and_pgvector_text(pg_server, data):  # noqa: F811
    from sqlalchemy import create_engine, text

    url = pg_server.create_database()
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE items (id bigint, vector real[], label int, emb_text text)"))
            conn.execute(text("CREATE SEQUENCE s"))
            conn.execute(text("INSERT INTO items VALUES (:i, :v, :l, :t)"),
                         [{"i": int(i), "v": v.tolist(), "l": int(lab),
                           "t": "[" + ",".join(repr(float(x)) for x in v) + "]"}
                          for i, v, lab in zip(*data, strict=True)])
        assert_same(open_source(f"sql:{url}#table=items", what="old gallery"), data)
        assert_same(open_source(f"{url}#query=SELECT id, emb_text AS vector, label FROM items", what="old gallery"),
                    data)
        with pytest.raises(SourceError, match=r"the query fails: FeatureNotSupported \(0A000\)"):
            list(open_source(f"{url}#query=WITH d AS (DELETE FROM items RETURNING *) SELECT * FROM d",
                             what="old gallery").blocks(10))
        with pytest.raises(SourceError, match="the query fails: .*read-only transaction"):  # a write inside a SELECT
            list(open_source(f"{url}#query=SELECT nextval('s') AS id, vector FROM items",
                             what="old gallery").blocks(10))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM items")).scalar() == N
            assert conn.execute(text("SELECT last_value, is_called FROM s")).one() == (1, False)  # never advanced
    finally:
        engine.dispose()
        pg_server.drop_database(url)


def test_join_by_id_aligns_old_and_new(tmp_path, data):  # noqa: F811
    ids, vectors, labels = data
    new_vectors = (vectors[:, :8] * 2 + 1).astype(np.float32)  # another model: another dimension
    write_npz(tmp_path / "old.npz", data)
    order = np.random.default_rng(1).permutation(N)  # the new store keeps the items in another order
    write_parquet(tmp_path / "new.parquet", (ids[order], new_vectors[order], labels[order]))
    old = open_source(str(tmp_path / "old.npz"), what="old gallery")
    new = open_source(f"{tmp_path / 'new.parquet'}#id=doc_id&vector=emb&label=cls", what="new gallery")
    for rows in (7, 1000):
        joined = join_by_id(old, new, block_rows=rows)
        np.testing.assert_array_equal(joined.ids, ids)
        np.testing.assert_array_equal(joined.old, vectors)
        np.testing.assert_array_equal(joined.new, new_vectors)
        np.testing.assert_array_equal(joined.labels, labels)
    half = join_by_id(old, new, block_rows=7, dtype=np.float16)  # a smaller copy kept by the caller
    assert half.old.dtype == np.float16 and np.allclose(half.old, vectors, atol=2e-3, rtol=1e-3)
    text_labels = np.array(["c" * (1 + int(lab)) for lab in labels])  # lengths differ from block to block
    write_npz(tmp_path / "old_text.npz", (ids.astype(str), vectors, text_labels))
    write_npz(tmp_path / "new_text.npz", (ids[order].astype(str), new_vectors[order], text_labels[order]))
    joined = join_by_id(open_source(str(tmp_path / "old_text.npz"), what="old gallery"),
                        open_source(str(tmp_path / "new_text.npz"), what="new gallery"), block_rows=3)
    np.testing.assert_array_equal(joined.ids, ids.astype(str))
    np.testing.assert_array_equal(joined.labels, text_labels)
    np.testing.assert_array_equal(joined.new, new_vectors)


def test_join_refuses_missing_duplicate_and_mismatched_ids(tmp_path, data):  # noqa: F811
    ids, vectors, labels = data
    old = open_source(str(write_npz(tmp_path / "old.npz", data)), what="old gallery")
    fewer = write_npz(tmp_path / "fewer.npz", tuple(a[:-3] for a in data))
    more_ids = ids.copy()
    more_ids[:2] = [1, 2]
    other = write_npz(tmp_path / "other.npz", (more_ids, vectors, labels))
    with pytest.raises(SourceError) as info:
        join_by_id(old, open_source(str(fewer), what="new gallery"))
    line = str(info.value)
    assert "\n" not in line and "3 of the 200 ids of old gallery are missing from new gallery" in line
    assert str(ids[-1]) in line
    with pytest.raises(SourceError, match=r"2 of the 200 ids of old gallery are missing from new gallery \(e\.g\. "
                                          rf"{ids[0]}, {ids[1]}\); 2 of the 200 ids of new gallery are missing from "
                                          r"old gallery \(e\.g\. 1, 2\)"):
        join_by_id(old, open_source(str(other), what="new gallery"))
    dup_ids = ids.copy()
    dup_ids[5] = dup_ids[6]
    dup = write_npz(tmp_path / "dup.npz", (dup_ids, vectors, labels))
    with pytest.raises(SourceError, match=rf"has 1 ids that occur more than once \(e\.g\. {dup_ids[6]}\)"):
        join_by_id(open_source(str(dup), what="old gallery"), old)
    text_ids = write_npz(tmp_path / "text.npz", (ids.astype(str), vectors, labels))
    with pytest.raises(SourceError, match="ids that are integers but .* text"):
        join_by_id(old, open_source(str(text_ids), what="new gallery"))
    relabelled = write_npz(tmp_path / "relabelled.npz", (ids, vectors, (labels + 1) % 5))
    with pytest.raises(SourceError, match=f"give {N} items different labels"):
        join_by_id(old, open_source(str(relabelled), what="new gallery"))


def one_line(exc_info) -> str:
    line = str(exc_info.value)
    assert line and "\n" not in line and isinstance(exc_info.value, ValueError)
    return line


def test_every_bad_input_is_one_line(tmp_path, data):  # noqa: F811
    ids, vectors, labels = data
    cases = []
    good = write_npz(tmp_path / "e.npz", data)
    cases.append((f"{good}", {"dim": 8}, "holds 16-d vectors, not the 8-d expected"))
    bad = vectors.copy()
    bad[17, 3] = np.nan
    nan = write_npz(tmp_path / "nan.npz", (ids, bad, labels))
    cases.append((f"{nan}", {}, rf"item {ids[17]} \(row 17\) has a NaN or infinite value"))
    inf_pq = tmp_path / "inf.parquet"
    bad_inf = vectors.copy()
    bad_inf[3, 0] = np.inf
    write_parquet(inf_pq, (ids, bad_inf, labels))
    cases.append((f"{inf_pq}#id=doc_id&vector=emb&label=cls", {}, r"\(row 3\) has a NaN or infinite value"))
    cases.append((f"{good}#vector=emb", {}, r"has no array 'emb' \(arrays: ids, vectors, labels\)"))
    pq_path = write_parquet(tmp_path / "e.parquet", data)
    cases.append((f"{pq_path}#id=doc_id", {}, r"has no vector column 'vector' \(columns: doc_id, emb, cls\)"))
    ragged = tmp_path / "ragged.parquet"
    pq.write_table(pa.table({"id": [1, 2], "vector": pa.array([[1.0, 2.0], [1.0]], pa.list_(pa.float32()))}), ragged)
    cases.append((str(ragged), {}, r"vectors of 1 to 2 numbers \(ragged\)"))
    db = tmp_path / "ragged.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (id INTEGER, vector TEXT)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(1, "[1, 2]"), (2, "[1]"), (3, "not a vector")])
    conn.close()
    cases.append((f"sqlite:///{db}#query=SELECT * FROM t WHERE id < 3", {}, r"vectors of 1 to 2 numbers \(ragged\)"))
    cases.append((f"sqlite:///{db}#query=SELECT * FROM t WHERE id = 3", {},
                  r"a vector is str, not an array of numbers \(its value is not shown\)"))
    cases.append((f"sqlite:///{db}#table=t&label=cls", {}, "the result has no label column 'cls'"))
    cases.append((f"sqlite:///{db}", {}, "give exactly one of #query=SELECT... or #table=NAME"))
    cases.append((f"sqlite:///{tmp_path / 'absent.db'}#table=t", {}, "does not exist"))
    cases.append(("/etc/passwd.npz", {}, "outside the data roots"))
    cases.append((str(tmp_path / "what.txt"), {}, "cannot tell what kind of source"))
    cases.append(("postgresql+psycopg://lab:hunter2@127.0.0.1:8801/x#table=t", {}, "cannot be reached"))
    cases.append(("qdrant:http://127.0.0.1:8802#collection=c&api_key=sekrit", {}, "cannot be reached|qdrant extra"))
    cases.append(("parquet:http://lab:hunter2@127.0.0.1:8803/e.parquet", {}, "cannot be read: .*cannot be reached"))
    for text, kwargs, pattern in cases:
        with pytest.raises(SourceError) as info:
            source = open_source(text, what="old gallery", **kwargs)
            list(source.blocks(64))
        line = one_line(info)
        assert "hunter2" not in line and "sekrit" not in line, line
        assert line.startswith(("old gallery", "reading old gallery")) or "data roots" in line or "kind" in line, line
        import re

        assert re.search(pattern, line), (pattern, line)


@pytest.mark.parametrize("module, text, extra", [
    ("lancedb", "lance:{tmp}#table=items", "lancedb"),
    ("qdrant_client", "qdrant:http://127.0.0.1:8804#collection=items", "qdrant"),
    ("psycopg", "postgresql+psycopg://lab:hunter2@127.0.0.1:8805/x#table=t", "postgresql"),
])
def test_a_missing_optional_library_names_its_extra(monkeypatch, tmp_path, module, text, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as when the extra is not installed
    with pytest.raises(SourceError) as info:
        open_source(text.format(tmp=tmp_path), what="old gallery")
    line = one_line(info)
    assert line.endswith(f"needs the {extra} extra: pip install -e .[{extra}]") and "hunter2" not in line, line


def test_importing_the_readers_loads_no_torch():
    """The dashboard will import engine.sources (the page wiring comes later): no torch, no store client."""
    import subprocess

    code = ("import sys, engine.sources\n"
            "print(sorted(m for m in ('torch', 'lancedb', 'qdrant_client', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_credentials_are_masked():
    assert mask_url("postgresql+psycopg://lab:hunter2@db:5432/x") == "postgresql+psycopg://lab:***@db:5432/x"
    assert mask_url("https://me:hunter2@host/a.parquet?api_key=k1&x=2") == \
        "https://me:***@host/a.parquet?api_key=***&x=2"
    assert mask_url("s3://bucket/a.parquet") == "s3://bucket/a.parquet"
    assert mask_url("failed for s3://key:secret@host/b and http://u:p@h") == \
        "failed for s3://key:***@host/b and http://u:***@h"
    from engine.sources.text import parse

    text = parse("qdrant:https://u:pw@q.example:6333#collection=c&api_key=abc&vector=v")
    assert text.masked() == "qdrant:https://u:***@q.example:6333#collection=c&api_key=***&vector=v"
    assert text.options == {"collection": "c", "api_key": "abc", "vector": "v"}
    assert parse("sql:sqlite:///a.db#query=SELECT a%26b, c+d").options == {"query": "SELECT a&b, c+d"}
