"""In a real browser (headless Chromium, as ``tests/test_browser.py``): a stored text comparison's neighbours show
sentences. The engine compares paraphrase-MiniLM-L3-v2 and all-MiniLM-L6-v2 int8 on a small WordNet sample and
stores it in the dashboard's database; the Feature geometry page then finds a query sentence by substring and shows
it with the definitions each gallery retrieves, hits marked (``geometry_text_neighbours.png``); the worker computes
the feature map and a hovered point's tooltip shows its definition (``geometry_text_hover.png``). A comparison of the
three MiniLM models with a hand-made ``text_upgrade`` summary stored beside it shows, on the Checkpoints page, its
verdicts, 3 x 3 matrix, every metric and the adapters (``text_upgrade_summary.png``, ``text_upgrade_pairs.png``,
``text_upgrade_adapters.png``)."""
from __future__ import annotations

import pytest

from engine.data.wordnet import WORDNET_ROOT, wordnet_task
from support.browser import (ANALYSIS_TIMEOUT_S, UI_TIMEOUT_MS, PlaywrightTimeout, browser, charts_drawn,  # noqa: F401
                          expect, hover_spots, result_shown, server, settle, shots, wait_for_job)

QUERIES, GALLERY, SEED = 40, 120, 1
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (WORDNET_ROOT / "data.noun").is_file(),
                                 reason="WordNet's files are absent: apt-get install wordnet-base")]


def test_a_text_comparison_shows_sentences_in_the_neighbours(server, browser, shots):  # noqa: F811
    pytest.importorskip("onnxruntime", reason="pip install -r requirements-text.txt")
    from engine.checkpoints.store import run_checkpoint_comparison
    from engine.models.text_models import missing_text_models
    from storage import get_engine

    missing = missing_text_models(("minilm_l3", "minilm_l6_int8"))
    if missing:
        pytest.skip(f"the offline text models are not installed: {'; '.join(missing)}")
    run_checkpoint_comparison(get_engine(server["db"]), {
        "models": [{"path": "pretrained:minilm_l3"}, {"path": "pretrained:minilm_l6_int8"}],
        "dataset": f"wordnet:queries={QUERIES},gallery={GALLERY},seed={SEED}", "views": ["encoder"],
        "metrics": ["recall@1"], "name": "text neighbours in a browser"})
    task = wordnet_task(queries=QUERIES, gallery=GALLERY, seed=SEED)
    row = 7
    word = max(task.query_texts[row].split(), key=len)
    page = browser.new_page(viewport={"width": 1500, "height": 3000})
    try:
        page.goto(f"{server['base']}/geometry", timeout=UI_TIMEOUT_MS)
        settle(page)
        search = page.get_by_role("textbox", name="Find a query sentence")
        expect(search).to_be_visible(timeout=UI_TIMEOUT_MS)
        search.fill(word)
        search.press("Enter")
        settle(page)
        matches = [r for r, t in enumerate(task.query_texts) if word.casefold() in t.casefold()]
        sentence = task.query_texts[matches[0]]
        query = page.locator('[data-testid="stMarkdownContainer"]').filter(has_text=sentence)
        expect(query.first).to_be_visible(timeout=UI_TIMEOUT_MS)  # the query sentence, shown as text
        expect(page.get_by_text("old gallery", exact=False).first).to_be_visible(timeout=UI_TIMEOUT_MS)
        marks = page.get_by_text("✓ hit").count() + page.get_by_text("✗ miss").count()
        assert marks == 10, f"expected 5 marked neighbours per gallery, saw {marks}"
        shown = page.locator('[data-testid="stMain"]').inner_text()
        assert sum(definition in shown for definition in task.gallery_texts) >= 5  # retrieved definitions, as text
        page.locator('[data-testid="stHeading"]').filter(has_text="Nearest neighbours across models").first \
            .scroll_into_view_if_needed()
        page.screenshot(path=str(shots / "geometry_text_neighbours.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0

        geometry = f"{server['base']}/geometry"  # the feature map (PCA), computed by the server's worker

        def pick_pca() -> None:
            page.get_by_text("PCA", exact=True).click()
            settle(page)

        pick_pca()
        page.get_by_role("button", name="Compute the feature map").click()
        wait_for_job(server["db"], "analysis", ANALYSIS_TIMEOUT_S, server["log"], analysis="projection")
        result_shown(page, geometry, "Class-based geometry does not apply here", pick_pca)  # qrels: one text a class
        chart = page.locator(".st-key-geo_map")
        chart.scroll_into_view_if_needed()
        expect(chart.locator("canvas, svg").first).to_be_visible(timeout=UI_TIMEOUT_MS)
        tooltip = page.locator("#vg-tooltip-element")
        for x, y in hover_spots(chart):
            page.mouse.move(x, y)
            try:  # Vega draws the tooltip on the next frame
                expect(tooltip).to_contain_text("text", timeout=250)
                break
            except AssertionError:
                continue
        shown = tooltip.inner_text()
        assert any(definition[:40] in shown for definition in task.gallery_texts), shown[:300]
        page.screenshot(path=str(shots / "geometry_text_hover.png"))
    finally:
        page.close()


def test_the_checkpoints_page_shows_a_text_upgrade_summary(server, browser, shots):  # noqa: F811
    pytest.importorskip("onnxruntime", reason="pip install -r requirements-text.txt")
    from engine.checkpoints.store import run_checkpoint_comparison
    from engine.core.contract import analysis_key
    from engine.models.text_models import missing_text_models
    from storage import get_engine, save_analysis, session_scope
    from app import text_upgrade_view as tv
    from support.app_text_upgrade import MODELS, SPEC, summary_payload

    missing = missing_text_models(tuple(MODELS))
    if missing:
        pytest.skip(f"the offline text models are not installed: {'; '.join(missing)}")
    db = get_engine(server["db"])
    experiment = run_checkpoint_comparison(db, {**SPEC, "name": "text upgrade in a browser"})
    payload = summary_payload()
    with session_scope(db) as s:  # the summary the worker's text_upgrade analysis stores, with hand-made numbers
        save_analysis(s, experiment, "text_upgrade", analysis_key("text_upgrade", {}), payload)
    page = browser.new_page(viewport={"width": 1500, "height": 1800})
    try:
        page.goto(f"{server['base']}/checkpoints", timeout=UI_TIMEOUT_MS)
        settle(page)
        section = page.locator('[data-testid="stExpander"]').filter(has_text="Text-embedding upgrade results").first
        expect(section).to_be_visible(timeout=UI_TIMEOUT_MS)
        # the headlines (app.widgets.plain puts an invisible word joiner after '@': matched around it)
        first = tv.headline(payload, payload["pairs"][0]).split("@")
        expect(section.get_by_text(first[0], exact=False)).to_be_visible(timeout=UI_TIMEOUT_MS)
        expect(section.get_by_text("6.3% vs 20.0% for minilm_l3 alone (-13.7 points, 95% CI -16.0 to -11.4 over 40 "
                                   "queries)", exact=False)).to_be_visible()
        expect(section.get_by_text("22.5% vs 23.0% for minilm_l6 alone", exact=False)).to_be_visible()
        charts_drawn(page)
        section.scroll_into_view_if_needed()
        section.screenshot(path=str(shots / "text_upgrade_summary.png"))
        for tab, shot, seen in (("Every metric per pair", "text_upgrade_pairs.png", "the top hit is a definition of the sentence"),
                                ("Adapters", "text_upgrade_adapters.png", "minilm_l3 → minilm_l6_int8")):
            section.get_by_role("tab", name=tab).click()
            expect(section.get_by_text(seen, exact=False).first).to_be_visible(timeout=UI_TIMEOUT_MS)
            expect(section.locator('[data-testid="stDataFrame"]:visible').first).to_be_visible(timeout=UI_TIMEOUT_MS)
            section.screenshot(path=str(shots / shot))
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()
