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


def _char_device(path) -> bool:
    """A character device like /dev/null (1, 3) made in the test's folder; False where mknod is not allowed."""
    import stat

    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        return False
    return True


def test_a_fifo_a_folder_and_a_device_are_refused_and_left_as_they_are(tmp_path):
    import stat

    fifo, folder, dev = tmp_path / "pipe", tmp_path / "dir", tmp_path / "null"
    os.mkfifo(fifo)
    folder.mkdir()
    targets = {fifo: "a FIFO", folder: "a folder"}
    if _char_device(dev):
        targets[dev] = "a character device"
    for path, kind in targets.items():
        with pytest.raises(ValueError, match=f"is {kind}, not a regular file"):
            write_json_atomic(path, {"a": 1})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and folder.is_dir() and not list(folder.iterdir())
    if dev in targets:
        assert stat.S_ISCHR(os.lstat(dev).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in targets)  # no temporary left


def test_a_link_to_dev_null_is_refused_and_neither_the_link_nor_dev_null_changes(tmp_path):
    import stat

    link = tmp_path / "out.json"
    link.symlink_to("/dev/null")
    with pytest.raises(ValueError, match="--json .*out.json is a character device"):
        write_json_atomic(link, {"a": 1})
    assert os.readlink(link) == "/dev/null" and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_link_to_a_regular_file_replaces_the_file_and_keeps_the_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "out.json"
    link.symlink_to(real)
    write_json_atomic(link, {"a": 1})
    assert link.is_symlink() and json.loads(real.read_text()) == {"a": 1}


def test_a_file_where_the_folder_should_be_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is not a folder"):
        write_json_atomic(tmp_path / "f" / "out.json", {"a": 1})


def test_cli_json_to_a_device_is_refused_before_any_work(tmp_path, capsys):
    import stat

    from engine.cli import main

    link = tmp_path / "null.json"
    link.symlink_to("/dev/null")
    code = main(["evaluate", "--features", str(tmp_path / "missing"), "--no-store", "--json", str(link)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is a character device, not a regular file" in err, err
    assert os.readlink(link) == "/dev/null" and stat.S_ISCHR(os.stat("/dev/null").st_mode)
