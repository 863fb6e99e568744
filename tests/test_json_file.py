"""engine.results.json_file: a --json OUT is written whole or not at all."""
import json
import os

import pytest

import engine.results.json_file as json_file
from engine.results.json_file import write_json_atomic


def test_written_whole_in_a_new_folder(tmp_path):
    out = tmp_path / "new" / "summary.json"
    write_json_atomic(out, {"a": [1, 2.5], "b": float("nan")})
    assert json.loads(out.read_text().replace("NaN", "null")) == {"a": [1, 2.5], "b": None}
    assert [p.name for p in out.parent.iterdir()] == ["summary.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    out = tmp_path / "summary.json"
    out.write_text('{"old": true}')
    with pytest.raises(ValueError, match="Out of range float"):
        write_json_atomic(out, {"x": float("inf")}, allow_nan=False)

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(json_file.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_json_atomic(out, {"new": True})
    assert out.read_text() == '{"old": true}' and sorted(os.listdir(tmp_path)) == ["summary.json"]
