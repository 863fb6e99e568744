"""Shared fixtures: a throw-away SQLite database per test, and CPU-only torch with few threads."""
import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture
def db_url(tmp_path) -> str:
    """URL of an empty SQLite file in the test's temporary folder."""
    return f"sqlite:///{tmp_path / 'compatlab.db'}"
