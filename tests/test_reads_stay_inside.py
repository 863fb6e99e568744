"""No file outside the data roots is read (issue 39, "reads outside the data roots"): dataset members that are links
leading out, fsspec schemes that read local files and URL chains, a LanceDB folder whose table links out, an adapter
whose weights link out, qrels through local://. Each is refused in one line, before the outside file is read."""
from __future__ import annotations

import os
import shutil

import pytest
from support.adapters_export import small_map
from support.sources import data, write_parquet  # noqa: F401 (the fixture)

from engine.adapters.artifact import AdapterFileError, load_adapter, save_adapter
from engine.sources import SourceError, open_source
from engine.sources.qrels import read_qrels

OPTS = "#id=doc_id&vector=emb&label=cls"


@pytest.fixture
def outside(tmp_path_factory):
    """A folder outside the data roots (the test's own tmp_path is the only root)."""
    return tmp_path_factory.mktemp("outside")


def test_a_dataset_member_linking_out_is_refused(tmp_path, outside, data):  # noqa: F811
    lake = tmp_path / "lake"
    lake.mkdir()
    write_parquet(lake / "a.parquet", data)
    write_parquet(outside / "b.parquet", data)
    os.symlink(outside / "b.parquet", lake / "b.parquet")
    with pytest.raises(SourceError, match="member .*b.parquet is outside the data roots"):
        open_source(f"parquet:{lake}{OPTS}", what="old gallery")
    os.unlink(lake / "b.parquet")
    os.symlink(outside, lake / "part")  # a folder member leading out
    with pytest.raises(SourceError, match="member .*part is outside the data roots"):
        open_source(f"parquet:{lake}{OPTS}", what="old gallery")


def test_a_link_inside_the_roots_is_followed_once(tmp_path, data):  # noqa: F811
    lake = tmp_path / "lake"
    (lake / "x").mkdir(parents=True)
    write_parquet(lake / "x" / "a.parquet", data)
    os.symlink(lake, lake / "x" / "loop")  # a link back up the tree: each folder read once
    got = open_source(f"parquet:{lake}{OPTS}", what="old gallery")
    assert got.count == len(data[0])


@pytest.mark.parametrize("url", ["local://{p}", "simplecache::file://{p}", "filecache::file://{p}",
                                 "zip://a.parquet::file://{p}", "reference://{p}", "file-like://{p}"])
def test_schemes_that_read_local_files_and_chains_are_refused(outside, data, url):  # noqa: F811
    path = write_parquet(outside / "e.parquet", data)
    with pytest.raises(SourceError, match=r"chains URLs|is not read; give a plain path") as exc:
        open_source(f"parquet:{url.format(p=path)}{OPTS}", what="old gallery")
    assert "\n" not in str(exc.value)


def test_qrels_through_local_are_refused(outside):
    (outside / "q.parquet").write_bytes(b"PAR1")
    with pytest.raises(SourceError, match=r"the scheme local:// is not read"):
        read_qrels(f"parquet:local://{outside / 'q.parquet'}")


def test_a_lance_table_linking_out_is_refused(tmp_path, outside, data):  # noqa: F811
    lancedb = pytest.importorskip("lancedb")
    import pyarrow as pa
    from support.sources import fixed_list

    ids, vectors, labels = data
    lancedb.connect(str(outside / "db")).create_table("items", pa.table({"id": ids, "vector": fixed_list(vectors),
                                                                        "label": labels}))
    (tmp_path / "db").mkdir()
    os.symlink(outside / "db" / "items.lance", tmp_path / "db" / "items.lance")
    with pytest.raises(SourceError, match="items.lance is outside the data roots"):
        open_source(f"lance:{tmp_path / 'db'}#table=items", what="old gallery")


def test_an_adapter_whose_weights_link_out_is_refused(tmp_path, outside):
    save_adapter(small_map(), tmp_path / "ad", onnx=False)
    shutil.move(tmp_path / "ad" / "adapter.safetensors", outside / "w.safetensors")
    os.symlink(outside / "w.safetensors", tmp_path / "ad" / "adapter.safetensors")
    with pytest.raises(AdapterFileError, match="adapter.safetensors is a symbolic link"):
        load_adapter(tmp_path / "ad")


def test_a_deeply_nested_adapter_description_is_one_line(tmp_path):
    save_adapter(small_map(), tmp_path / "ad", onnx=False)
    (tmp_path / "ad" / "adapter.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(AdapterFileError, match="nests too deeply|is not valid JSON|is .* bytes"):
        load_adapter(tmp_path / "ad")


def test_a_qdrant_folder_whose_points_are_an_endless_view_is_refused(tmp_path):
    import json
    import sqlite3

    folder = tmp_path / "qd"
    (folder / "collection" / "items").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"collections": {"items": {"vectors": {"size": 2, "distance": "Cosine"}}}}))
    with sqlite3.connect(folder / "collection" / "items" / "storage.sqlite") as conn:
        conn.execute("CREATE VIEW points AS WITH RECURSIVE n(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n) "
                     "SELECT id, x'00' AS point FROM n")
    conn.close()
    with pytest.raises(SourceError, match="storage.sqlite's points is view, not Qdrant's table"):
        open_source(f"qdrant:{folder}#collection=items", what="old gallery")
