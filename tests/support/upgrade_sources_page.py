"""Shared by several test modules; moved from tests/test_upgrade_sources_page.py."""
from __future__ import annotations


def fill(at, specs, *, relevance="labels", margin=None, ties=None, rank_ties=None):
    at.radio(key="up_mode").set_value("From a table or store").run()
    for side in ("old_gallery", "new_gallery", "old_queries", "new_queries"):
        at.text_input(key=f"up_src_{side}").input(getattr(specs, side) or "")
    at.selectbox(key="up_src_relevance").set_value(relevance)
    if margin is not None:
        at.number_input(key="up_src_margin").set_value(margin)
    if ties is not None:
        at.selectbox(key="up_src_ties").set_value(ties)
    if rank_ties is not None:
        at.selectbox(key="up_src_rank_ties").set_value(rank_ties)
    at.button[0].click().run()  # the form's submit button
    assert not at.exception, at.exception
    return at

