"""The Upgrade check page offers the release report of a stored check (the same HTML as ``check-upgrade --report``;
a check from a store: tests/test_upgrade_plan_page.py)."""
from __future__ import annotations

import re

from support.release_report import EXTERNAL
from support.upgrade_plan_cli import rotated_back_pair
from support.upgrade_page import open_upgrade
from support.upgrade_plan_page import stored_plan

from app.report_download import report_bytes

LABEL = "Download the release report (HTML)"


def test_a_stored_check_offers_its_release_report(app_db):
    payload = stored_plan(app_db, rotated_back_pair)
    at = open_upgrade()
    assert not at.exception
    assert LABEL in [b.proto.label for b in at.get("download_button")]
    page = report_bytes(payload["plan"], payload["report"], {"experiment": "#1 pair", "view": "encoder"}).decode()
    body = page[page.index("<body>"):]
    assert body.index("Decision: ship with adapter procrustes.") < body.index("<h2>Inputs</h2>")
    assert "<td>experiment</td><td>#1 pair</td>" in page and "Throughput unknown: this report was built from a stored" in page
    assert page.count("<svg") == 2 and not EXTERNAL.search(page) and not re.search("<script", page, re.IGNORECASE)

