"""Database faults: a corrupt file or an unreachable server is one line in the dashboard and the worker, never a trace
(the outage of a running worker: tests/test_worker_database_outage.py)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORRUPT = "is corrupt or not a database file"
UNREACHABLE = "postgresql://u:secret@127.0.0.1:1/db"  # nothing listens on port 1: refused at once


@pytest.fixture(params=["corrupt", "unreachable"])
def bad(request, tmp_path: Path) -> tuple[str, str]:
    """A database URL that cannot be used, and the words its one line must hold."""
    if request.param == "unreachable":
        pytest.importorskip("psycopg")
        return UNREACHABLE, "u:***@127.0.0.1:1/db cannot be opened"
    path = tmp_path / "random.db"
    path.write_bytes(os.urandom(4096))
    return f"sqlite:///{path}", CORRUPT


def test_dashboard_on_a_bad_database_shows_one_line_and_stops(bad, monkeypatch):
    from streamlit.testing.v1 import AppTest

    url, words = bad
    monkeypatch.setenv("COMPATLAB_DB_URL", url)
    at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=120).run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and words in errors[0] and "\n" not in errors[0] and "secret" not in errors[0]


@pytest.mark.parametrize("by_flag", [False, True])
def test_worker_on_a_bad_database_exits_non_zero_in_one_line(bad, by_flag):
    url, words = bad
    env = {**os.environ, "COMPATLAB_DB_URL": "sqlite://" if by_flag else url}
    args = ["worker", "--once", *(["--db", url] if by_flag else [])]
    done = subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if words in line]
    assert len(lines) == 1, done.stderr
