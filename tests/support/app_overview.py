"""Shared by several test modules; moved from tests/test_app_overview.py."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from support.app_pages import MAIN, TIMEOUT


def overview() -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    return at

