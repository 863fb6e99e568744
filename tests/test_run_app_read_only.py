"""run_app.py on a read-only database: it starts the dashboard alone (stored results shown, Launch disabled),
no worker, and queues nothing. Tests run as root, which writes through chmod 0444, so the database is opened
read-only by SQLite's ``?mode=ro`` URI (as tests/test_db_errors.py does)."""
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

import run_app
from engine.cli import main as engine_main
from storage import get_engine, session_scope
from storage.models import Base

ROOT = Path(__file__).resolve().parents[1]


class _Exited:
    """A child that has already exited with code 0 (the dashboard closing at once ends supervise)."""

    pid = 12345

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


def _kind(cmd: list[str]) -> str:
    """"worker" for ``python -m engine worker ...``, "dashboard" for the Streamlit launch of app/main.py."""
    if cmd[1:4] == ["-m", "engine", "worker"]:
        return "worker"
    assert str(ROOT / "app" / "main.py") in cmd, cmd
    return "dashboard"


def _counts(url: str) -> dict[str, int]:
    with session_scope(get_engine(url)) as s:
        return {t.name: s.scalar(select(func.count()).select_from(t)) for t in Base.metadata.sorted_tables}


@pytest.fixture
def stored_read_only(tmp_path) -> tuple[str, str]:
    """(writable URL, read-only URL) of one SQLite file holding one stored evaluation."""
    folder = tmp_path / "f"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for t in (1, 2):
        np.savez(folder / f"step_{t}.npz", query_features=rng.normal(size=(6, 3)).astype(np.float32),
                 query_labels=np.arange(6) % 2, gallery_features=rng.normal(size=(6, 3)).astype(np.float32),
                 gallery_labels=np.arange(6) % 2)
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    assert engine_main(["evaluate", "--features", str(folder), "--db", url]) == 0
    get_engine(url).dispose()
    return url, url.replace("sqlite:///", "sqlite:///file:") + "?mode=ro&uri=true"


def test_run_app_on_a_read_only_database_starts_the_dashboard_alone(stored_read_only, monkeypatch, capsys):
    url, ro = stored_read_only
    before = _counts(url)
    started: list[tuple[list[str], dict]] = []
    monkeypatch.setattr(run_app.subprocess, "Popen", lambda cmd, **kw: started.append((cmd, kw)) or _Exited())
    run_app.main(["--db", ro, "--no-browser", "--port", "8681"])  # queues no demo although it may: read-only
    out = capsys.readouterr().out
    assert [_kind(cmd) for cmd, _ in started] == ["dashboard"]  # streamlit run app/main.py: no worker
    assert started[0][1]["env"]["COMPATLAB_DB_URL"] == ro
    assert "is read-only" in out and "showing the stored results with Launch disabled (no workers started)" in out
    assert "queued the quick-demo" not in out
    assert _counts(url) == before


def test_run_app_on_a_writable_database_still_starts_both_workers(stored_read_only, monkeypatch, capsys):
    url, _ = stored_read_only
    started: list[list[str]] = []
    monkeypatch.setattr(run_app.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or _Exited())
    run_app.main(["--db", url, "--no-browser", "--port", "8682", "--no-demo"])
    assert sorted(_kind(cmd) for cmd in started) == ["dashboard", "worker", "worker"]
    assert "Launch disabled" not in capsys.readouterr().out
