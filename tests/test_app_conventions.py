"""Conventions on every number, and user-provided names shown as plain text.

``engine.core.conventions`` on hand-made configs (expected lines written out by hand), ``app.widgets.plain``
on markdown/HTML, and the pages under AppTest: their convention captions for a hand-made stored config,
and names / labels / messages with markdown in them reaching the page escaped.
"""
from __future__ import annotations

import re

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from app.widgets import plain
from engine.core.conventions import annotate, convention, metric_name
from storage import enqueue_job, fail_job, get_engine, session_scope, update_job_progress
from storage.jobs import claim_next_job
from storage.models import Experiment, ModelVersion, Study
from support.app_pages import MAIN, TIMEOUT, texts, unplain
from support.app_synthetic import fill_study

RUN = {"name": "hand", "methods": ["psp"], "seed": 7,
       "eval": {"protocol": "closed-set", "gallery": "template", "eval_classes": "seen", "topk": None},
       "scenario": {"class_order_seed": 3}, "model": {"init_seed": "per_step"}}
SEEDS = "seed 7, class order 3, new initial weights every step"
BEACON = "![b](http://127.0.0.1:9/beacon.png)"
MARKDOWN = f"{BEACON} **bold** <img src=x> $x$ :red[r]"


def markdown_free(text: str) -> bool:
    """No image, link or HTML tag can form in ``text`` (each needs an unescaped ``![``, ``](`` or ``<``)."""
    return re.search(r"(?<!\\)!\[|(?<!\\)\]\(|(?<!\\)<[a-z]", text) is None


# ------------------------------------------------------------------------------------------ engine.core.conventions


def test_convention_of_a_run_config():
    line = convention(RUN, metrics="recall@1", views=["encoder", "psp", "lsp"])
    assert line == ("Convention: Recall@1 · encoder view · PSP view (first C^k softmax, centred, L2-normalised) · "
                    "LSP view (first C^k logits, centred, L2-normalised) · closed-set, own image excluded · "
                    "template gallery (class means) · seen classes only · ECC strict > (a tie fails) · " + SEEDS)


def test_a_stored_matrix_overrides_gallery_and_classes_and_parts_can_be_left_out():
    line = convention(RUN, metrics=["recall@1", "map@10"], views="encoder", gallery="instance", eval_classes="all")
    assert "Recall@1 / mAP@10" in line and "instance gallery · all test classes" in line
    geometry = convention(RUN, views="lsp", retrieval=False, ecc=False)
    assert geometry == "Convention: LSP view (first C^k logits, centred, L2-normalised) · " + SEEDS


def test_lsp_centring_top_k_and_several_seeds():
    cfg = {**RUN, "seeds": [0, 1, 2], "eval": {"topk": 5}}  # centring is always on: no config key turns it off
    line = convention(cfg, views="lsp")
    assert "LSP view (first C^k logits, centred, top-5, L2-normalised)" in line
    assert "seeds 0, 1, 2, class order 3" in line
    assert "instance gallery · all test classes" in line  # the engine's defaults for missing keys


def test_convention_of_checkpoint_and_feature_configs():
    ckpt = {"source": "checkpoints", "spec": {"protocol": "instance", "ties": "pass"}, "protocol": "open-set"}
    assert convention(ckpt, metrics="map", views="psp") == (
        "Convention: mAP · PSP view (first C^k softmax, centred, L2-normalised) · open-set · instance gallery · "
        "all test classes · ECC >= (a tie passes) · given checkpoints (no training seed)")
    feats = {"source": "features", "protocol": "template", "same_set": True}
    assert convention(feats) == ("Convention: closed-set, own image excluded · template gallery (class means) · "
                                 "all test classes · ECC strict > (a tie fails) · given features (no training seed)")


def test_gallery_kind_is_read_under_its_new_and_its_old_key():
    """New rows store ``gallery_kind``; rows stored before the rename say ``protocol`` (tested above): same line."""
    old_ckpt = {"source": "checkpoints", "spec": {"protocol": "template"}, "protocol": "open-set"}
    new_ckpt = {"source": "checkpoints", "spec": {"gallery_kind": "template"}, "protocol": "open-set"}
    assert convention(new_ckpt) == convention(old_ckpt)
    assert "open-set · template gallery (class means) ·" in convention(new_ckpt)
    old_feats = {"source": "features", "protocol": "template", "same_set": False}
    new_feats = {"source": "features", "gallery_kind": "template", "same_set": False}
    assert convention(new_feats) == convention(old_feats) and "open-set · template gallery" in convention(new_feats)


def test_annotate_puts_the_line_first_as_a_comment():
    assert annotate("a,b\n", "csv", "Convention: x") == "# Convention: x\na,b\n"
    assert annotate("\\begin{tabular}", "latex", "C") == "% C\n\\begin{tabular}"
    assert annotate("| a |\n", "markdown", "C") == "C\n\n| a |\n"
    with pytest.raises(ValueError, match="unknown format 'pdf'"):
        annotate("", "pdf", "C")
    assert [metric_name(m) for m in ("recall@5", "map", "map@100", "ndcg")] == ["Recall@5", "mAP", "mAP@100", "ndcg"]


# ------------------------------------------------------------------------------------------ plain


@pytest.mark.parametrize("text", [BEACON, MARKDOWN, "[l](javascript:alert(1))", "# head\n- item\n===",
                                  "a_b_c & &amp; \\ ` ~~s~~ | x |", "www.example.com mail@example.com"])
def test_plain_escapes_markdown_and_keeps_the_text(text):
    shown = plain(text)
    assert unplain(shown) == text
    assert markdown_free(shown)
    assert "://" not in shown.replace("\\", "") and "www." not in shown.replace("\\", "")  # no bare autolink


# ------------------------------------------------------------------------------------------ pages


@pytest.fixture
def hand_study(app_db) -> dict:
    """The synthetic study with a hand-made run config, markdown in its names, class names and a job message."""
    out = fill_study(app_db, steps=3)
    with session_scope(get_engine(app_db)) as s:
        for e in s.query(Experiment).all():
            e.config = {**RUN, "methods": [e.method]}
            e.name = f"{MARKDOWN}/{e.method}"
        s.get(Study, out["study_id"]).name = MARKDOWN
        for v in s.query(ModelVersion).all():
            v.class_names = [f"{BEACON} c{c}" for c in range(len(v.classes))]
    return {"url": app_db, **out}


def open_page(page: str) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT).run()
    at.switch_page(f"app_pages/{page}.py").run()
    assert not at.exception, at.exception
    return at


def captions(at: AppTest) -> list[str]:
    return [unplain(c.value) for c in at.caption if c.value.startswith("Convention")]


def test_compatibility_states_the_convention_of_the_table_and_each_matrix(hand_study):
    at = open_page("compatibility")
    stored = "Convention: Recall@1 · encoder view · closed-set, own image excluded · instance gallery · " \
             "all test classes · ECC strict > (a tie fails) · " + SEEDS  # the matrices record instance / all
    assert captions(at) == [stored]  # above the table; each matrix shares it, so it is not repeated
    charts = at.get("vega_lite_chart")
    assert len(charts) == 4  # AC_t, AA_t, two heatmaps: each carries the convention, so its exports do too
    for chart in charts:
        spec = chart.proto.spec
        assert "Convention: Recall@1" in spec and "new initial weights every step" in spec
    with session_scope(get_engine(hand_study["url"])) as s:  # a matrix whose convention differs is captioned
        bct = s.get(Experiment, hand_study["experiments"]["bct"])
        bct.config = {**bct.config, "seed": 8}
    st.cache_data.clear()  # the experiment list is cached for a few seconds
    at = open_page("compatibility")
    assert captions(at) == [stored, stored.replace("seed 7", "seed 8")]
    assert any(MARKDOWN in o for o in at.selectbox(key="cm_group").options)  # options are plain text already


def test_geometry_and_backfilling_state_their_conventions(hand_study):
    at = open_page("geometry")
    at.selectbox(key="geo_experiment").set_value(1).run()  # the experiment with stored analyses (independent)
    at.radio(key="geo_method").set_value("pca").run()
    assert not at.exception
    seeds = f"{SEEDS} · gallery split · sampling seed 0"
    assert captions(at) == [
        f"Convention: encoder view · {seeds}",  # map, drift, angles, neural collapse, Definition 1
        "Convention: cosine similarity · encoder view · closed-set, own image excluded · instance gallery · "
        f"all test classes · {SEEDS}",  # nearest neighbours
        f"Convention: encoder view · {seeds}"]  # across all steps
    (query,) = [c.value for c in at.caption if "· model step" in c.value]  # under the query image
    assert unplain(query).startswith(f"{BEACON} c") and BEACON not in query  # the class name, escaped

    at = open_page("backfilling")
    at.selectbox(key="bf_experiment").set_value(1).run()
    assert captions(at) == ["Convention: Recall@1 / mAP · encoder view · closed-set, own image excluded · "
                            f"instance gallery · seen classes only · {SEEDS} · random-order seed 0"]


def test_overview_shows_names_and_messages_as_plain_text(hand_study):
    db = get_engine(hand_study["url"])
    with session_scope(db) as s:
        enqueue_job(s, "run", {"config": {"name": MARKDOWN, "methods": ["bct"]}})
    job = claim_next_job(db, 1)
    with session_scope(db) as s:
        update_job_progress(s, job.id, 0.5, f"epoch 1 {MARKDOWN}", lease=job.lease)
        failed = enqueue_job(s, "run", {"config": {"name": "later", "methods": ["bct"]}})
    second = claim_next_job(db, 2)
    with session_scope(db) as s:
        fail_job(s, failed, "Traceback", message=f"died {MARKDOWN}", lease=second.lease)
        e = s.query(Experiment).first()
        e.status, e.error = "failed", f"boom {MARKDOWN}"
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT).run()
    assert not at.exception
    shown = [e.value for kind in ("markdown", "caption") for e in getattr(at, kind)]
    shown += [p.proto.text for p in at.get("progress")]
    literal = [unplain(v) for v in shown]
    assert any(f"#{job.id} · {MARKDOWN} (bct on ?)" in v for v in literal), "the running job's label"
    assert any(f"epoch 1 {MARKDOWN}" in v for v in literal), "the running job's message"
    assert any(f"Last message: died {MARKDOWN}" in v for v in literal), "the failed job's message"
    assert any(f"{MARKDOWN}/independent failed: boom {MARKDOWN}" in v for v in literal), "the failed experiment"
    for v in shown:
        assert markdown_free(v), f"unescaped user text reached markdown: {v!r}"
    assert "bold" in texts(at)


def test_a_config_without_init_seed_reads_as_the_config_default():
    from engine.core.config import RunConfig
    from engine.core.conventions import settings

    assert RunConfig().model.init_seed == "auto"
    for config in ({"seed": 1}, {"seed": 1, "model": {"init_seed": "auto"}}):
        assert settings(config).seeds == "seed 1, class order 0, initial weights as each method's paper prescribes"
