"""Shared by several test modules; moved from tests/test_upgrade_page.py."""
from __future__ import annotations

from support.app_pages import open_page

PARAMS = {"step_a": 1, "step_b": 2, "view": "encoder", "metric": "recall@1"}


def open_upgrade(metric: str = PARAMS["metric"]):
    """The Upgrade check page on a stored experiment with ``metric`` picked (the page opens on the decision's, mAP;
    these tests check Recall@1's hits by hand)."""
    at = open_page("upgrade")
    if at.selectbox(key="up_metric").value != metric:
        at.selectbox(key="up_metric").set_value(metric).run()
    return at

