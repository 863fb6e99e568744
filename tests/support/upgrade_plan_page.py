"""Shared by several test modules; moved from tests/test_upgrade_plan_page.py."""
from __future__ import annotations

from engine.core.contract import analysis_key
from engine.jobs.analysis import run_analysis
from storage import get_engine, load_analysis, session_scope, set_experiment_status
from support.upgrade_cli import store_pair
from support.upgrade_page import PARAMS


def stored_plan(url: str, pair) -> dict:
    exp = store_pair(url, *pair(), names=("v1", "v2"))
    with session_scope(get_engine(url)) as s:
        set_experiment_status(s, exp, "done")
    run_analysis(get_engine(url), exp, "upgrade", PARAMS)
    with session_scope(get_engine(url)) as s:
        return dict(load_analysis(s, exp, "upgrade", analysis_key("upgrade", PARAMS)).payload)

