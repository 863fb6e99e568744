"""Shared by several test modules; moved from tests/test_app_pages.py."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from storage import get_engine, list_jobs, session_scope
from support.app_synthetic import fill_study

MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"


TIMEOUT = 120  # the first run imports torch and compiles numba kernels


@pytest.fixture
def study(app_db) -> dict:
    return {"url": app_db, **fill_study(app_db, steps=3)}


def open_page(page: str) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT).run()
    if page != "overview":
        at.switch_page(f"app_pages/{page}.py").run()
    assert not at.exception, at.exception
    return at


def unplain(text: str) -> str:
    """What a reader sees of app.widgets.plain's output: without its backslash escapes and word joiners."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text).replace("\u2060", "")


def texts(at: AppTest) -> str:
    """The page's text elements, with user-provided text unescaped."""
    parts = [e.value for kind in ("markdown", "caption", "info", "warning", "error", "success", "title", "subheader")
             for e in getattr(at, kind)]
    return unplain("\n".join(str(p) for p in parts))


def jobs(url: str) -> list:
    with session_scope(get_engine(url)) as s:
        return list_jobs(s)

