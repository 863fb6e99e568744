"""Text comparisons in the dashboard (issue 28): the Checkpoints page's "check a text-embedding upgrade" entry (the
text-upgrade preset) queues the offline MiniLM sequence on WordNet as a ``checkpoints`` job, and a stored text
comparison shows texts where image comparisons show images: the neighbours view (query sentence, retrieved
definitions, hits marked, found by substring), the map's tooltip, its text search and its box list.

Expectations are computed independently: the texts from ``engine.data.wordnet.wordnet_task`` on the same options,
the neighbours by a numpy cosine search over the stored features, the hits from the synset ids.
"""
from __future__ import annotations

import argparse

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app import map_explore as mx
from app.checkpoint_form import TEXT_UPGRADE
from engine.checkpoints.request import TEXT_ARCH, comparison_spec
from engine.data.samples import SampleRefs, sample_texts, text_refs
from engine.data.text_model_files import TEXT_SEQUENCE
from engine.data.wordnet import WORDNET_ROOT, wordnet_task
from storage import get_engine, list_jobs, session_scope
from support.app_text import stored_encoder

PAGE = Path(__file__).resolve().parents[1] / "app" / "app_pages" / "checkpoints.py"
TIMEOUT = 120
WORDNET = pytest.mark.skipif(not (WORDNET_ROOT / "data.noun").is_file(),
                             reason="WordNet's files are absent: apt-get install wordnet-base")
QUERIES, GALLERY, SEED = 40, 120, 1  # small: two models embed 160 texts each in seconds


def jobs(url: str) -> list[dict]:
    with session_scope(get_engine(url)) as s:
        return [{"kind": j.kind, "payload": dict(j.payload)} for j in list_jobs(s)]


def checkpoints_page() -> AppTest:
    at = AppTest.from_file(str(PAGE), default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    return at


# ------------------------------------------------------------------------------------------ pure parts


def test_text_refs_keep_the_texts_and_check_ids():
    refs = text_refs("wordnet", ["a cat", "the dog", "a bird"])
    assert refs.source == {"dataset": "wordnet", "texts": ["a cat", "the dog", "a bird"]}
    assert refs.ids.tolist() == [0, 1, 2] and refs.compact() is refs  # nothing to cut: every text is an item
    assert sample_texts(refs.source, [2, 0]) == ["a bird", "a cat"]
    assert sample_texts({"dataset": "digits"}, [0]) is None and sample_texts(None, [0]) is None
    with pytest.raises(ValueError, match="text ids must lie in 0..2"):
        sample_texts(refs.source, [3])
    assert isinstance(refs.take([1]), SampleRefs) and sample_texts(refs.source, refs.take([1]).ids) == ["the dog"]


def test_matching_rows_short_and_the_box_list_with_texts():
    texts = ["The cat sat", "a dog barked", "CATALOGUE of stars", ""]
    assert mx.matching_rows(texts, " cat") == [0, 2] and mx.matching_rows(texts, "  ") == []
    assert mx.short("a  b\nc") == "a b c" and mx.short("x" * 130, 10) == "x" * 9 + "…"
    points = pd.DataFrame({"class": ["c0", "c2", "c0"], "model": ["old", "old", "new"], "row": [0, 2, 0]})
    table = mx.selection_table(points, None, texts)
    assert table.to_dict("list") == {"text": ["The cat sat", "The cat sat", "CATALOGUE of stars"],
                                     "class": ["c0", "c0", "c2"], "model": ["new", "old", "old"], "row": [0, 0, 2]}


# ------------------------------------------------------------------------------------------ the Checkpoints page


def test_text_upgrade_entry_queues_the_minilm_sequence_on_wordnet(app_db):
    at = checkpoints_page()
    at.button(key="ck_use_text").click().run()
    assert not at.exception, at.exception
    assert at.subheader[0].value == "Models (3, oldest first)"
    assert at.selectbox(key="ck_dataset").value == "wordnet" and at.multiselect(key="ck_views").value == ["encoder"]
    at.button(key="ck_launch").click().run()
    assert not at.error, [e.value for e in at.error]
    # the results section (drawn above the button) follows the new job at once, so its summary shows when done
    assert any(i.value.startswith("Queued as job #1") for i in at.info), [i.value for i in at.info]
    queued = jobs(app_db)
    assert [j["kind"] for j in queued] == ["checkpoints"]  # the job kind the image comparison uses
    spec = queued[0]["payload"]["spec"]
    assert [m["path"] for m in spec["models"]] == [f"pretrained:{name}" for name in TEXT_SEQUENCE]
    assert [m["label"] for m in spec["models"]] == ["minilm_l3", "minilm_l6", "minilm_l6_int8"]
    assert spec["dataset"] == "wordnet:task=qrels,queries=500,gallery=2000,seed=0,train=1000"  # the preset's default
    assert spec["views"] == ["encoder"] and spec["metrics"] == ["recall@1", "recall@10", "map"]
    assert spec["name"] == TEXT_UPGRADE["name"] and comparison_spec(spec).to_dict() == spec
    # the same comparison as `compare-checkpoints --preset text-upgrade` (engine.checkpoints.presets)
    from engine.cli.checkpoints import add_arguments, spec_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cli = comparison_spec(spec_from_args(parser.parse_args(["--preset", "text-upgrade"]))).to_dict()
    assert {k: cli[k] for k in ("dataset", "views", "metrics", "name")} == {k: spec[k] for k in ("dataset", "views", "metrics", "name")}
    assert [m["path"] for m in cli["models"]] == [m["path"] for m in spec["models"]]


def test_the_image_entry_after_the_text_entry_goes_back_to_images(app_db):
    at = checkpoints_page()
    at.button(key="ck_use_text").click().run()
    at.button(key="ck_use_pretrained").click().run()
    assert not at.exception, at.exception
    assert at.selectbox(key="ck_dataset").value == "imagefolder"
    assert at.multiselect(key="ck_views").value == ["encoder", "psp", "lsp"]


def test_corpus_sizes_and_task_are_options(app_db):
    at = checkpoints_page()
    at.button(key="ck_use_text").click().run()
    at.radio(key="ck_wn_task").set_value("class")
    at.selectbox(key="ck_wn_queries").set_value(200)
    at.selectbox(key="ck_wn_gallery").set_value(800)
    at.number_input(key="ck_wn_seed").set_value(3).run()
    at.button(key="ck_launch").click().run()
    assert not at.error, [e.value for e in at.error]
    assert jobs(app_db)[0]["payload"]["spec"]["dataset"] == "wordnet:task=class,queries=200,gallery=800,seed=3,train=1000"


def test_more_queries_than_gallery_and_image_models_on_text_are_refused_in_one_line(app_db):
    at = checkpoints_page()
    at.button(key="ck_use_text").click().run()
    at.selectbox(key="ck_wn_queries").set_value(5000).run()
    at.button(key="ck_launch").click().run()
    assert len(at.error) == 1 and "queries=5000, gallery=2000" in at.error[0].value.replace("\\", "")
    at.selectbox(key="ck_wn_queries").set_value(500)
    at.selectbox(key="ck_2_pretrained").set_value("efficientnet_lite0")  # ids 0, 1: the first visit's two.run()
    at.button(key="ck_launch").click().run()
    assert len(at.error) == 1 and "text models only" in at.error[0].value.replace("\\", "")
    assert "\n" not in at.error[0].value and jobs(app_db) == []


def test_the_distilled_static_model_is_offered_and_says_what_it_needs(app_db):
    at = checkpoints_page()
    at.button(key="ck_use_text").click().run()
    box = at.selectbox(key="ck_4_pretrained")  # the third model of the entry (ids 2, 3, 4 after the first visit's two)
    assert "minilm_l6_static" in box.options and box.value == "minilm_l6_int8"
    box.set_value("minilm_l6_static").run()
    assert any("distilled from minilm_l6 by model2vec" in c.value for c in at.caption)
    at.button(key="ck_launch").click().run()
    assert not at.error, [e.value for e in at.error]
    assert jobs(app_db)[0]["payload"]["spec"]["models"][2]["path"] == "pretrained:minilm_l6_static"


def test_a_users_own_text_encoder_from_a_server_path(app_db, data_root):
    """A text encoder folder (tokenizer.json + safetensors) on the server, architecture "text encoder": checked without
    loading, queued as ``PATH:text``; a folder without its tokenizer, or outside the data roots, gets one line."""
    from support.text_encoders import write_tiny_folder  # the tiny BERT folder the encoder tests load

    write_tiny_folder(data_root / "my-encoder")
    (data_root / "broken").mkdir()
    (data_root / "broken" / "model.onnx").write_bytes(b"not really")
    at = checkpoints_page()
    at.button(key="ck_use_text").click().run()
    at.radio(key="ck_3_source").set_value("Server path").run()  # the second model of the entry (ids 2, 3, 4)
    assert "text encoder (folder or zip: tokenizer.json + safetensors or ONNX)" in at.selectbox(key="ck_3_arch").options
    at.text_input(key="ck_3_path").set_value(str(data_root / "my-encoder"))
    at.selectbox(key="ck_3_arch").set_value(TEXT_ARCH).run()
    assert not at.get("number_input") or all(n.key != "ck_3_num_classes" for n in at.number_input)  # no classes
    at.button(key="ck_launch").click().run()
    assert not at.error, [e.value for e in at.error]
    model = jobs(app_db)[0]["payload"]["spec"]["models"][1]
    assert (model["path"], model["arch"]) == (str(data_root / "my-encoder"), TEXT_ARCH)
    for bad, expected in ((data_root / "broken", "a text model folder holds tokenizer.json"),
                          ("/etc", "outside the data roots")):
        at.text_input(key="ck_3_path").set_value(str(bad)).run()
        at.button(key="ck_check").click().run()
        assert len(at.error) == 1 and expected in at.error[0].value.replace("\\", ""), [e.value for e in at.error]
        assert "\n" not in at.error[0].value


# ------------------------------------------------------------------------------------------ a stored comparison


@pytest.fixture
def text_study(app_db) -> dict:
    """L3 -> L6 int8 on a small WordNet sample, compared and stored by the engine as the worker would."""
    pytest.importorskip("onnxruntime", reason="pip install -r requirements-text.txt")
    pytest.importorskip("tokenizers", reason="pip install -r requirements-text.txt")
    from engine.checkpoints.store import run_checkpoint_comparison
    from engine.models.text_models import missing_text_models

    missing = missing_text_models(("minilm_l3", "minilm_l6_int8"))
    if missing or not (WORDNET_ROOT / "data.noun").is_file():
        pytest.skip(f"needs WordNet and the offline text models: {'; '.join(missing) or 'apt-get install wordnet-base'}")
    spec = {"models": [{"path": "pretrained:minilm_l3"}, {"path": "pretrained:minilm_l6_int8"}],
            "dataset": f"wordnet:queries={QUERIES},gallery={GALLERY},seed={SEED}", "views": ["encoder"],
            "metrics": ["recall@1"], "text_cache": False}  # the checkout's ./data keeps no test embeddings
    experiment = run_checkpoint_comparison(get_engine(app_db), spec)
    return {"url": app_db, "experiment": experiment, "task": wordnet_task(queries=QUERIES, gallery=GALLERY, seed=SEED)}




def expected_neighbours(study: dict, query_step: int, gallery_step: int, row: int, k: int) -> list[tuple[str, bool]]:
    """(definition, hit) of the ``k`` nearest definitions by numpy cosine over the stored features."""
    q = stored_encoder(study["url"], study["experiment"], query_step, "query")[row]
    g = stored_encoder(study["url"], study["experiment"], gallery_step, "gallery")
    sims = (g / np.linalg.norm(g, axis=1, keepdims=True)) @ (q / np.linalg.norm(q))
    task = study["task"]
    return [(task.gallery_texts[i], task.gallery_ids[i] == task.query_ids[row]) for i in np.argsort(-sims)[:k]]


def neighbour_lines(at: AppTest) -> list[str]:
    from support.app_pages import unplain

    return [unplain(m.value) for m in at.markdown if m.value.startswith("**#")]


@WORDNET
def test_neighbours_show_the_query_sentence_and_the_retrieved_definitions(text_study):
    from support.app_pages import open_page, texts

    task = text_study["task"]
    at = open_page("geometry")
    at.selectbox(key="geo_experiment").set_value(0).run()  # the one stored experiment
    assert not at.exception, at.exception
    assert at.selectbox(key="nn_text_row").value == 0 and task.query_texts[0] in texts(at)
    lines = neighbour_lines(at)
    assert len(lines) == 10  # 5 neighbours in the old gallery, 5 in the new one
    for part, gallery_step in ((lines[:5], 1), (lines[5:], 2)):
        for line, (definition, hit) in zip(part, expected_neighbours(text_study, 2, gallery_step, 0, 5)):
            assert line.endswith(definition) and (("✓ hit" in line) == hit) and (("✗ miss" in line) == (not hit))
    # search by substring: a word of query 7 finds it (and only sentences holding it)
    word = max(task.query_texts[7].split(), key=len)
    at.text_input(key="nn_text_search").input(word).run()
    found = at.selectbox(key="nn_text_row").options
    assert found and all(word.casefold() in o.casefold() for o in found)
    at.selectbox(key="nn_text_row").set_value(7).run()
    assert task.query_texts[7] in texts(at)
    for line, (definition, hit) in zip(neighbour_lines(at)[5:], expected_neighbours(text_study, 2, 2, 7, 5)):
        assert line.endswith(definition) and (("✓ hit" in line) == hit)
    at.text_input(key="nn_text_search").input("zzqqxx").run()
    assert "No query text contains zzqqxx" in texts(at)


@WORDNET
def test_the_map_tooltip_search_and_box_show_texts(text_study):
    import json

    from support.app_pages import open_page, texts
    from support.map_explore import drawn, map_layer

    from engine.jobs.analysis import run_analysis

    params = {"step_a": 1, "step_b": 2, "view": "encoder", "split": "gallery", "method": "pca", "max_points": 2000}
    run_analysis(get_engine(text_study["url"]), text_study["experiment"], "projection", params)
    task = text_study["task"]
    at = open_page("geometry")
    at.selectbox(key="geo_experiment").set_value(0).run()  # the one stored experiment
    at.radio(key="geo_method").set_value("pca").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="geo_colour").value == "model"  # 120 one-item classes: no legend could hold them
    spec, frame = drawn(at)
    assert any(t == "text" or (isinstance(t, dict) and t.get("field") == "text")
               for t in map_layer(spec)["encoding"]["tooltip"])
    assert all(mx.short(task.gallery_texts[r]) == t for r, t in zip(frame["row"], frame["text"]))
    # qrels: gallery text r is its own class, named by its synset id (stored in the comparison's config)
    assert all(task.gallery_ids[r] == c for r, c in zip(frame["row"], frame["class"]))
    assert "120 of 120 gallery texts per model" in json.dumps(spec)  # the map's title counts texts
    assert not at.checkbox[1].value and at.checkbox[1].label == "Class means"  # one text per class: off
    word = max(task.gallery_texts[5].split(), key=len)
    at.text_input(key="geo_text_search").input(word).run()
    rows = [r for r, t in enumerate(task.gallery_texts) if word.casefold() in t.casefold()]
    assert f"{len(rows):,} text(s) contain {word}" in texts(at)
    assert at.dataframe[0].value["row"].tolist() == rows
    _, frame = drawn(at)
    assert sorted(set(frame.loc[frame["highlighted"], "row"])) == rows
    box = {"x": [float(frame["x"].min()), float(frame["x"].median())], "y": [-1e9, 1e9]}
    at.session_state["geo_map"] = {"selection": {"pick": [], "box": box}}
    at.run()
    listed = next(d.value for d in at.dataframe if list(d.value.columns[:2]) == ["text", "class"])
    assert len(listed) and "texts," in texts(at)
    assert all(task.gallery_texts[r] == t for r, t in zip(listed["row"], listed["text"]))
