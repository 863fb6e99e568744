"""The IR toolchain's formats: TREC and BEIR qrels read to the same judgements (ids as text, graded), the format
told from the file or named, and a malformed row named by FILE:LINE in one line."""
from __future__ import annotations

import numpy as np
import pytest

from engine.sources import SourceError
from engine.sources.qrels import read_qrels

# graded judgements with ids a number parser would spoil (leading zeros, dots, a hash)
JUDGED = [("q007", "d0010", 2), ("q007", "d.11", 0), ("q007", "doc#3", 1), ("1e3", "001", 3), ("1e3", "d0010", 1)]


def write_trec(path, rows=JUDGED):
    path.write_text("".join(f"{q} 0 {d} {g}\n" for q, d, g in rows))
    return path


def write_beir(path, rows=JUDGED):
    path.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{g}\n" for q, d, g in rows))
    return path


def as_dict(table) -> dict:
    out: dict = {}
    for q, d, g in zip(table.query.tolist(), table.item.tolist(), table.grade.tolist()):
        out.setdefault(q, {})[d] = g
    return out


def test_trec_and_beir_files_of_the_same_judgements_read_the_same(tmp_path):
    want = {"q007": {"d0010": 2.0, "d.11": 0.0, "doc#3": 1.0}, "1e3": {"001": 3.0, "d0010": 1.0}}
    trec, beir = write_trec(tmp_path / "j.txt"), write_beir(tmp_path / "j.tsv")
    write_trec(tmp_path / "trec.tsv")  # a TREC file with a .tsv name: told from its first line
    write_beir(tmp_path / "beir.qrels")
    (tmp_path / "beir.txt").write_text("query-id corpus-id score\n" + "".join(f"{q} {d} {g}\n" for q, d, g in JUDGED))
    for text in (trec, beir, tmp_path / "trec.tsv", tmp_path / "beir.txt", f"trec:{trec}", f"beir:{beir}",
                 f"beir:{tmp_path / 'beir.qrels'}"):
        got = read_qrels(str(text))
        assert as_dict(got) == want, text
        assert got.query.dtype.kind == "U" and got.grade.dtype == np.float64
    a, b = read_qrels(str(trec)), read_qrels(str(beir))
    for name in ("query", "item", "grade"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("name, text, message", [
    ("short.txt", "q1 0 d1 1\nq1 0 d2\n", r"short.txt:2: a TREC qrels row is 'query-id 0 doc-id grade' \(4 fields\), "
                                         "this one has 3"),
    ("grade.txt", "q1 0 d1 1\n\nq1 0 d2 high\n", r"grade.txt:3: a grade is not a number"),
    ("nan.txt", "q1 0 d1 1\nq1 0 d2 nan\n", r"nan.txt:2: a grade is NaN or infinite"),
    ("fields.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\n", r"fields.tsv:3: 2 fields, the header 3"),
    ("grade.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\tx\n", r"grade.tsv:3: a grade is not a number"),
    ("blank.tsv", "query-id\tcorpus-id\tscore\nq1\t\t1\n", r"blank.tsv:2: a judgement without a query or item id"),
])
def test_a_malformed_row_is_one_line_naming_file_and_line(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(SourceError, match=message) as err:
        read_qrels(str(tmp_path / name))
    assert "\n" not in str(err.value)


def test_a_named_format_overrides_the_guess(tmp_path):
    """``beir:`` reads the first line as a header even when it looks like a TREC row; ``trec:`` refuses a header."""
    (tmp_path / "h.tsv").write_text("q\t0\td\t1\nq1\t0\td1\t2\n")
    got = read_qrels(f"beir:{tmp_path / 'h.tsv'}#query=q&item=d&grade=1")
    assert as_dict(got) == {"q1": {"d1": 2.0}}
    write_beir(tmp_path / "b.tsv")
    with pytest.raises(SourceError, match=r"b.tsv:1: a TREC qrels row .* has 3"):
        read_qrels(f"trec:{tmp_path / 'b.tsv'}")
