"""Hostile names (markdown, HTML, javascript links, very long) stored in a hand-made database never reach a page's
markdown raw (issue 24, item 4): every page is walked and every element that Streamlit renders as markdown is read;
its tables draw missing values as a dash, never None (issue 23, item 7)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from engine.jobs.analysis import run_analysis
from storage import enqueue_job, get_engine, list_model_versions, rename_model_version, session_scope
from storage.models import CompatibilityMatrix, Experiment, Study
from app.widgets import MISSING
from support.app_pages import unplain
from support.app_synthetic import fill_study

MAIN = Path(__file__).resolve().parents[1] / "app" / "main.py"
IMG = '<img src="http://127.0.0.1:9/x.png">'
LINK = "[x](javascript:alert(1))"
MODEL_NAMES = ("**v1**_<b>x</b>", "[v2](javascript:a)")  # model names: printable, at most 40 characters
STUDY = f"{IMG} {LINK} :red[study] $x$ " + "long " * 30
EXPERIMENT = f"# {LINK} <script>alert(1)</script> " + "w" * 100
PAGES = ("overview", "new_experiment", "compatibility", "geometry", "backfilling", "upgrade", "checkpoints")
RAW = ("<img", "<script", "<b>", "](javascript:", "**v1**", ":red[")


@pytest.fixture
def hostile(app_db) -> dict:
    out = fill_study(app_db, steps=3)
    db = get_engine(app_db)
    first = out["experiments"]["independent"]
    with session_scope(db) as s:
        s.get(Study, out["study_id"]).name = STUDY
        for e in s.query(Experiment).all():
            e.name = EXPERIMENT
        versions = list_model_versions(s, first)
        rename_model_version(s, versions[1].id, MODEL_NAMES[0])
        rename_model_version(s, versions[2].id, MODEL_NAMES[1])
        for m in s.query(CompatibilityMatrix).filter(CompatibilityMatrix.experiment_id == first).all():
            # update gain Γ of M2 -> M1: (0.6 - 0.5) / (0.7 - 0.5) = 50 % (the page computes it from the matrix)
            m.values = np.array([[0.5, np.nan, np.nan], [0.6, 0.7, np.nan], [0.45, 0.8, 0.9]])
        enqueue_job(s, "run", {"config": {"name": STUDY, "methods": ["bct"]}})
    run_analysis(db, first, "upgrade", {"step_a": 2, "step_b": 3, "view": "encoder", "metric": "map"})
    return out


def markdown_texts(at: AppTest) -> list[str]:
    """Every string the page hands to Streamlit's markdown renderer: text elements, labels of metrics, buttons,
    expanders and tabs, progress texts."""
    parts = [str(e.value) for kind in ("markdown", "caption", "info", "warning", "error", "success", "title",
                                       "subheader", "header", "toast") for e in getattr(at, kind)]
    parts += [m.label for m in at.metric] + [b.label for b in at.button] + [x.label for x in at.expander]
    parts += [t.label for t in at.tabs] + [p.proto.text for p in at.get("progress")]
    return parts


@pytest.mark.parametrize("page", PAGES)
def test_no_raw_markup_reaches_markdown(hostile, page):
    at = AppTest.from_file(str(MAIN), default_timeout=120).run()
    if page != "overview":
        at.switch_page(f"app_pages/{page}.py").run()
    assert not at.exception, at.exception
    texts = markdown_texts(at)
    pickers = [b for b in at.selectbox if b.key in ("up_experiment", "geo_experiment", "bf_experiment")]
    if pickers:  # the experiment whose models carry the names (and the stored analyses)
        pickers[0].set_value(next(i for i, o in enumerate(pickers[0].options) if "(independent)" in o)).run()
        assert not at.exception, at.exception
        texts += markdown_texts(at)
    for frame in at.dataframe:  # tables: a missing value is drawn as a dash, never the word None
        assert frame.proto.placeholder == MISSING, f"{page}: a table without the dash placeholder"
        assert not frame.value.map(lambda v: isinstance(v, str) and v.strip() == "None").any(axis=None), page
    for text in texts:
        for raw in RAW:  # unescaped: not right after plain()'s backslash
            assert not re.search(r"(?<!\\)" + re.escape(raw), text), f"{page}: raw {raw!r} in {text[:300]!r}"
        assert not re.search(r"(?<![\\\u2060])https?://", text), f"{page}: a bare URL would be linked: {text[:200]!r}"


def test_the_names_are_shown_as_written(hostile):
    """The walk above is not vacuous: the names do reach the pages, escaped, and read back as written."""
    at = AppTest.from_file(str(MAIN), default_timeout=120).run()
    overview = unplain("\n".join(markdown_texts(at)))
    assert STUDY.strip() in overview  # the queued run's job card
    at.switch_page("app_pages/compatibility.py").run()
    compat = unplain("\n".join(markdown_texts(at)))
    assert f"{MODEL_NAMES[0]}→M1 50.0 %" in compat  # the "Update gain" caption of issue 24
    at.switch_page("app_pages/upgrade.py").run()
    pick = at.selectbox(key="up_experiment")
    pick.set_value(next(i for i, o in enumerate(pick.options) if "(independent)" in o)).run()  # the named models
    labels = unplain(" ".join(m.label for m in at.metric))
    assert f"{MODEL_NAMES[1]} (step 3) on its own vs {MODEL_NAMES[0]} (step 2)" in labels
