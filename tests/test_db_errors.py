"""Database problems in one line with the password masked: storage, the CLI, run_app.py and the dashboard."""
import os
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from engine.cli import main
from storage import DatabaseUnavailable, get_engine, init_db, session_scope, write_problem
from storage.models import Base

ROOT = Path(__file__).resolve().parents[1]


def _features(folder: Path) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for t in (1, 2):
        np.savez(folder / f"step_{t}.npz", query_features=rng.normal(size=(8, 3)).astype(np.float32),
                 query_labels=np.arange(8) % 2, gallery_features=rng.normal(size=(8, 3)).astype(np.float32),
                 gallery_labels=np.arange(8) % 2)
    return folder


def _counts(url: str) -> dict[str, int]:
    with session_scope(get_engine(url)) as s:
        return {t.name: s.scalar(select(func.count()).select_from(t)) for t in Base.metadata.sorted_tables}


def _cli_one_line(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: database "), captured.err
    return lines[0]


@pytest.fixture
def stored(tmp_path) -> str:
    """A SQLite file holding one stored evaluation."""
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    assert main(["evaluate", "--features", str(_features(tmp_path / "f")), "--db", url]) == 0
    get_engine(url).dispose()
    return url


@pytest.mark.parametrize("url, state", [
    ("notaurl", "is not a valid database URL"),
    ("nosuchdb://u:secret@host/db", "unknown database kind or a driver that is not installed"),
    ("postgresql+asyncpg://u:secret@host/db", "a driver that is not installed: No module named 'asyncpg'"),
])
def test_bad_url_and_missing_driver(url, state, tmp_path, capsys):
    line = _cli_one_line(["evaluate", "--features", str(_features(tmp_path / "f")), "--db", url], capsys)
    assert state in line and "secret" not in line
    assert "secret" not in line and ("***" in line or "@" not in url)


def test_read_only_database_is_refused_before_anything_is_computed(stored, tmp_path, capsys):
    ro = stored.replace("sqlite:///", "sqlite:///file:") + "?mode=ro&uri=true"  # read-only even for root
    before = _counts(stored)
    with pytest.raises(DatabaseUnavailable, match="is read-only: attempt to write a readonly database"):
        init_db(get_engine(ro))
    init_db(get_engine(ro), writable=False)  # the dashboard still opens it to show stored results
    assert "is read-only" in write_problem(get_engine(ro)) and write_problem(get_engine(stored)) is None
    line = _cli_one_line(["evaluate", "--features", str(_features(tmp_path / "g")), "--db", ro], capsys)
    assert "is read-only" in line
    assert _counts(stored) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod 0444; the ?mode=ro test covers read-only for root")
def test_chmod_read_only_file_and_folder(stored, tmp_path, capsys):
    path = Path(stored.removeprefix("sqlite:///"))
    before = _counts(stored)
    get_engine(stored).dispose()
    path.chmod(0o444)
    path.parent.chmod(0o555)
    try:
        line = _cli_one_line(["evaluate", "--features", str(tmp_path / "f"), "--db", stored], capsys)
        assert "is read-only" in line or "cannot be opened" in line
    finally:
        path.parent.chmod(0o755)
        path.chmod(0o644)
    assert _counts(stored) == before


def test_corrupt_and_truncated_files(stored, tmp_path, capsys):
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"this is not sqlite" * 500)
    line = _cli_one_line(["evaluate", "--features", str(tmp_path / "f"), "--db", f"sqlite:///{bad}"], capsys)
    assert "is corrupt or not a database file: file is not a database" in line
    path = Path(stored.removeprefix("sqlite:///"))
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    data = path.read_bytes()
    cut = tmp_path / "cut.db"
    cut.write_bytes(data[: len(data) // 2])
    line = _cli_one_line(["evaluate", "--features", str(tmp_path / "f"), "--db", f"sqlite:///{cut}"], capsys)
    assert "is corrupt or not a database file" in line


def test_run_app_refuses_a_bad_database_in_one_line(tmp_path, capsys, monkeypatch):
    import run_app

    monkeypatch.setattr(run_app.subprocess, "Popen", lambda *a, **k: pytest.fail("nothing may start"))
    assert run_app.main(["--db", "postgresql+asyncpg://u:secret@host/db", "--no-browser"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "u:***@host" in err[0] and "secret" not in err[0]


def test_dashboard_on_a_read_only_database_shows_one_line_and_disables_launch(stored, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMPATLAB_DB_URL", stored.replace("sqlite:///", "sqlite:///file:") + "?mode=ro&uri=true")
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120).run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "is read-only" in errors[0] and "launching is disabled" in errors[0]
    at.switch_page("app_pages/new_experiment.py").run()
    assert not at.exception, at.exception
    launch = [b for b in at.button if b.label == "Launch"]
    assert launch and all(b.disabled for b in launch)


@pytest.mark.parametrize("page", ["app_pages/upgrade.py", "app_pages/compatibility.py", "learn/stationarity.py"])
def test_dashboard_on_a_corrupt_file_shows_one_line_on_every_page(tmp_path, monkeypatch, page):
    """Issue 44: a corrupt SQLite file showed a stack trace in the browser. 4 KB of random bytes: every page shows the
    one line and stops, no exception."""
    from streamlit.testing.v1 import AppTest

    bad = tmp_path / "lab.db"
    bad.write_bytes(np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    monkeypatch.setenv("COMPATLAB_DB_URL", f"sqlite:///{bad}")
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120).run()
    at.switch_page(page).run()
    assert not at.exception, at.exception
    assert [e.value for e in at.error] == [f"database sqlite:///{bad} is corrupt or not a database file: file is not a "
                                          "database"]
