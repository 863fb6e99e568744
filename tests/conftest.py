"""Shared fixtures: a throw-away database per test (SQLite; PostgreSQL too for tests marked ``both_databases``),
and CPU-only torch with few threads."""
import pytest
import torch

from storage import get_engine, init_db
import pgserver  # tests/pgserver.py (pytest puts this folder on sys.path for its conftest)

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def data_root(tmp_path, monkeypatch):
    """Each test's temporary folder is a data root (engine.data.roots), as ./data is for the dashboard."""
    monkeypatch.setenv("COMPATLAB_DATA_ROOTS", str(tmp_path))
    monkeypatch.setenv("COMPATLAB_TEXT_CACHE", str(tmp_path / "text-cache"))  # never the checkout's ./data/cache
    return tmp_path


def pytest_configure(config):
    config.addinivalue_line("markers", "both_databases: run the test on SQLite and on a throw-away PostgreSQL server "
                                       "(the `db_url` and `engine` fixtures follow the backend)")


def pytest_generate_tests(metafunc):
    if "db_backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_databases"):
        metafunc.parametrize("db_backend", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture(scope="session")
def pg_server():
    """One PostgreSQL cluster for the whole session (tests/pgserver.py); skipped, with the reason, when none starts."""
    try:
        server = pgserver.start()
    except pgserver.Unavailable as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")
    yield server
    server.stop()


@pytest.fixture
def db_backend(request) -> str:
    """``sqlite`` unless the test is marked ``both_databases`` (then each backend in turn)."""
    return getattr(request, "param", "sqlite")


@pytest.fixture
def db_url(tmp_path, db_backend, request):
    """URL of an empty database: a SQLite file in the test's temporary folder, or a new PostgreSQL database."""
    if db_backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'compatlab.db'}"
        return
    server = request.getfixturevalue("pg_server")
    url = server.create_database()
    yield url
    get_engine(url).dispose()
    server.drop_database(url)


@pytest.fixture
def app_db(tmp_path, monkeypatch) -> str:
    """An empty, initialised SQLite database that the Streamlit pages pick up through COMPATLAB_DB_URL."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    monkeypatch.setenv("COMPATLAB_DB_URL", url)
    init_db(get_engine(url))
    return url


@pytest.fixture
def engine(db_url):
    """An initialised SQLAlchemy engine on a fresh database (see ``db_url``)."""
    engine = get_engine(db_url)
    init_db(engine)
    yield engine
    engine.dispose()
