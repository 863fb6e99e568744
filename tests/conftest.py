"""Shared fixtures: a throw-away SQLite database per test, and CPU-only torch with few threads."""
import pytest
import torch

from storage import get_engine, init_db

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def data_root(tmp_path, monkeypatch):
    """Each test's temporary folder is a data root (engine.data.roots), as ./data is for the dashboard."""
    monkeypatch.setenv("COMPATLAB_DATA_ROOTS", str(tmp_path))
    return tmp_path


@pytest.fixture
def db_url(tmp_path) -> str:
    """URL of an empty SQLite file in the test's temporary folder."""
    return f"sqlite:///{tmp_path / 'compatlab.db'}"


@pytest.fixture
def app_db(tmp_path, monkeypatch) -> str:
    """An empty, initialised SQLite database that the Streamlit pages pick up through COMPATLAB_DB_URL."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    monkeypatch.setenv("COMPATLAB_DB_URL", url)
    init_db(get_engine(url))
    return url


@pytest.fixture
def engine(tmp_path):
    """An initialised SQLAlchemy engine on a fresh SQLite file (disposed after the test)."""
    engine = get_engine(f"sqlite:///{tmp_path / 'test.db'}")
    init_db(engine)
    yield engine
    engine.dispose()
