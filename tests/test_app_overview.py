"""The Overview's first minute under AppTest: what the tool answers, three ways in, tables without ``None``."""
from __future__ import annotations

import math

import pytest
from streamlit.proto.Block_pb2 import Block as BlockProto
from streamlit.testing.v1 import AppTest

from app.learn import LEARN_PAGES
from app.widgets import MISSING
from storage import create_experiment, enqueue_job, get_engine, session_scope
from support.app_pages import texts
from support.app_synthetic import fill_study
from support.app_overview import overview




def page_links(at: AppTest) -> dict[str, str]:
    """label -> target page of every st.page_link on the page."""
    return {e.proto.label: e.proto.page for e in at.get("page_link")}


def test_overview_says_what_it_answers_and_offers_three_ways_in(app_db):
    at = overview()
    page = texts(at)
    assert "without re-embedding" in page and "backfill" in page
    links = page_links(at)
    for heading in ("Run the demo", "Check my upgrade", "Learn"):
        assert f"**{heading}**" in [m.value for m in at.markdown], heading
    # the link's target is the page's URL path: its file name without .py
    assert links["New experiment"] == "new_experiment"
    assert links["Upgrade check"] == "upgrade"
    assert links[LEARN_PAGES[0][1]] == LEARN_PAGES[0][0].removesuffix(".py")
    assert len(links) == 3  # nothing else links away before there are results


def test_entry_links_open_their_pages(app_db):
    at = overview()
    targets = ["app_pages/new_experiment.py", "app_pages/upgrade.py", f"learn/{LEARN_PAGES[0][0]}"]
    for target in targets:
        at.switch_page(target).run()
        assert not at.exception, (target, at.exception)


def test_tables_show_dashes_not_none(app_db):
    """A finished study and one experiment without matrices yet: its AC / AA / ACA are missing, shown as dashes."""
    fill_study(app_db, steps=3)
    with session_scope(get_engine(app_db)) as s:
        create_experiment(s, name="just-started", method="bct", config={"dataset": {"name": "shapes"}},
                          config_hash="x")
        enqueue_job(s, "run", {"preset": "quick-demo"})
    at = overview()
    assert at.dataframe, "the experiments table is shown"
    for frame in at.dataframe:
        assert frame.proto.placeholder == MISSING
        values = frame.value
        # no cell holds the text None: missing values are real nulls, which the table draws as MISSING
        assert not values.map(lambda v: isinstance(v, str) and v.strip() == "None").any(axis=None)
    rows = {r["experiment"]: r for _, r in at.dataframe[0].value.iterrows()}
    fresh = rows["just-started"]
    assert all(fresh[c] is None or math.isnan(fresh[c]) for c in ("AC %", "AA %", "ACA %"))
    assert rows["synthetic/bct"]["AC %"] == pytest.approx(100.0)  # hand_matrix(good=True): every cross-test passes
    assert f"a dash ({MISSING}) means not computed yet" in texts(at)


def test_no_empty_bordered_boxes(app_db):
    """Every bordered container on the Overview holds something (the entry cards, the job cards)."""
    with session_scope(get_engine(app_db)) as s:
        enqueue_job(s, "run", {"preset": "quick-demo"})
    at = overview()
    blocks = _bordered(at._tree)
    assert len(blocks) == 4  # three entry points and the queued job's card
    for block in blocks:
        assert block.children, "a bordered box with nothing inside"


def _bordered(node) -> list:
    found = []
    for child in getattr(node, "children", {}).values():
        proto = getattr(child, "proto", None)
        if isinstance(proto, BlockProto) and any(proto.HasField(kind) and getattr(proto, kind).border
                                                 for kind in ("vertical", "flex_container")):
            found.append(child)
        found.extend(_bordered(child))
    return found
