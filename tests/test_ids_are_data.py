"""One id rule for every reader (issue 39, "silently wrong numbers from bad ids"): unique per side (within a file,
across Parquet row groups), one type per source, integers exact, no null ids or labels; each refused in one line
with its count before any verdict."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.sources import fixed_list
from support.upgrade_sources import embeddings, run, tables, write_all

from engine.sources import SourceError
from engine.sources.base import as_ids, as_labels, check_unique_ids, join_ids


def refused(specs, message: str) -> str:
    with pytest.raises(SourceError, match=message) as exc:
        run(specs)
    assert "\n" not in str(exc.value)
    return str(exc.value)


@pytest.fixture
def tabs():
    return tables(embeddings())


def test_a_gallery_id_repeated_across_row_groups_is_refused_without_a_new_gallery(tmp_path, tabs):
    ids, vectors, labels = tabs["old_gallery"]
    ids = ids.copy()
    ids[-1] = ids[0]  # the last row group repeats the first row group's first id
    tabs["old_gallery"] = (ids, vectors, labels)
    specs = write_all("parquet", tmp_path / "s", tabs)
    got = refused(replace(specs, new_gallery=None), "has 1 ids that occur more than once")
    assert f"e.g. {ids[0]}" in got


def test_float_ids_beyond_2_53_are_refused_not_merged():
    with pytest.raises(SourceError, match="2 float ids that are not exact integers"):
        as_ids(np.array([1e19, 2e19, 3.0]), where="g")
    with pytest.raises(SourceError, match="1 float ids that are not exact integers"):
        as_ids(np.array([1.5, 2.0]), where="g")
    np.testing.assert_array_equal(as_ids(np.array([2.0 ** 53, -7.0]), where="g"), [2 ** 53, -7])


def test_unsigned_ids_above_int64_are_refused_not_wrapped():
    with pytest.raises(SourceError, match="1 unsigned ids above 2"):
        as_ids(np.array([2 ** 64 - 1, 5], np.uint64), where="g")
    np.testing.assert_array_equal(as_ids(np.array([2 ** 63 - 1], np.uint64), where="g"), [2 ** 63 - 1])
    with pytest.raises(SourceError, match="1 integer ids beyond 64 bits"):
        as_ids(np.array([2 ** 64 - 1, 3], dtype=object), where="g")


def test_one_type_per_source():
    with pytest.raises(SourceError, match=r"ids of two types \(1 integers, 1 others\)"):
        as_ids(np.array([3, "x"], dtype=object), where="g")
    with pytest.raises(SourceError, match="integers in some blocks, text in others"):
        join_ids([np.array([1, 2]), np.array(["3"])], where="g")


def test_a_parquet_file_of_text_ids_beside_integer_ids_is_refused(tmp_path, tabs):
    ids, vectors, labels = tabs["new_gallery"]
    tabs["new_gallery"] = (ids.astype(str), vectors, labels)  # "5003" is not the item 5003
    specs = write_all("parquet", tmp_path / "s", tabs)
    refused(specs, "has ids that are integers but .* has text; the same items need the same ids")


def test_dictionary_encoded_text_ids_are_read_as_their_text(tmp_path, tabs):
    """A dictionary-encoded id column reads as its values, not its codes: the check equals the plain one."""
    text = tables(embeddings(), text=True)
    plain = run(write_all("parquet", tmp_path / "a", text))
    specs = write_all("parquet", tmp_path / "b", text)
    ids, vectors, labels = text["old_gallery"]
    pq.write_table(pa.table({"doc": pa.array(ids).dictionary_encode(), "emb": fixed_list(vectors), "cls": labels}),
                   specs.old_gallery.split(":", 1)[1].split("#")[0], row_group_size=64)
    got = run(specs)
    assert got.report.compatibility.diff == pytest.approx(plain.report.compatibility.diff, abs=1e-12)
    assert got.report.n_gallery == plain.report.n_gallery


def test_null_labels_are_refused_with_their_count(tmp_path, tabs):
    with pytest.raises(SourceError, match="2 items without a label"):
        as_labels(np.array([1, None, None], dtype=object), where="g")
    with pytest.raises(SourceError, match="1 items without a label"):
        as_labels(np.array([1.0, np.nan]), where="g")
    ids, vectors, labels = tabs["old_gallery"]
    specs = write_all("parquet", tmp_path / "s", tabs)
    path = specs.old_gallery.split(":", 1)[1].split("#")[0]
    cls = pa.array([None if i < 3 else int(v) for i, v in enumerate(labels)], pa.int64())
    pq.write_table(pa.table({"doc": ids, "emb": fixed_list(vectors), "cls": cls}), path)
    refused(specs, "3 items without a label")


def test_check_unique_ids_counts_and_shows_a_few():
    with pytest.raises(SourceError, match=r"has 2 ids that occur more than once \(e.g. 1, 4\)"):
        check_unique_ids(np.array([1, 1, 4, 4, 5]), where="g")
    check_unique_ids(np.array(["a", "b"]), where="g")
