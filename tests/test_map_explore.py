"""The explorer's feature map: stored per-point retrieval and drift, selection/sampling helpers, and the page.

Expectations are hand-computed (top-1 on four points, a box, a search) or computed independently
(scikit-learn's paired cosine distances, a full similarity matrix instead of the blocked search).
"""
from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
from sklearn.metrics.pairwise import paired_cosine_distances

import engine.analysis.map as map_analysis
from app import charts
from app import map_explore as mx
from engine.jobs.analysis import run_analysis
from engine.analysis.views import load_experiment, load_view, version_of_step
from engine.core.contract import CLASS_MEAN, PROTOTYPE, SAMPLE, analysis_key
from storage import get_engine, load_analysis, save_analysis, session_scope
from support.app_pages import open_page, texts
from support.app_synthetic import fill_study
from support.map_explore import drawn, map_layer

PCA = {"step_a": 2, "step_b": 3, "view": "encoder", "split": "gallery", "method": "pca", "max_points": 2000}
OLD, NEW = "step 2 (old)", "step 3 (new)"  # the page's model names for PCA's steps


# ------------------------------------------------------------------------------------------ engine


@pytest.mark.parametrize("block_bytes", [1 << 26, 8])  # one block, and one query per block
def test_top1_hits_by_hand(monkeypatch, block_bytes):
    monkeypatch.setattr(map_analysis, "SIMILARITY_BYTES", block_bytes)
    gallery = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, 0.0]])
    labels = np.array([0, 0, 1, 1])
    rows = np.array([0, 2, 3])
    # row 0: nearest other is row 1 (class 0) -> hit; row 2: row 1 (cos 0.11) -> miss; row 3: row 2 (cos 0) -> hit
    hits = map_analysis.top1_hits(gallery[rows], gallery, labels, rows)
    np.testing.assert_array_equal(hits, [True, False, True])


def test_projection_stores_hit_and_drift(db_url):
    out = fill_study(db_url, steps=2, analyses=False)
    db, exp = get_engine(db_url), out["experiments"]["independent"]
    params = {"step_a": 1, "step_b": 2, "method": "pca", "max_points": 40, "seed": 1}
    run_analysis(db, exp, "projection", params)
    with session_scope(db) as s:
        stored = load_analysis(s, exp, "projection", analysis_key("projection", params))
        columns, array = stored.payload["columns"], np.asarray(stored.array)
    frame = pd.DataFrame(array, columns=columns)
    _, versions = load_experiment(db, exp)
    f_old, labels, _ = load_view(db, version_of_step(versions, 1), "gallery", "encoder")
    f_new, _, _ = load_view(db, version_of_step(versions, 2), "gallery", "encoder")

    def full_top1(queries: np.ndarray) -> np.ndarray:  # the whole similarity matrix, own image masked
        q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
        g = f_old / np.linalg.norm(f_old, axis=1, keepdims=True)
        sims = q @ g.T
        np.fill_diagonal(sims, -np.inf)
        return (labels[sims.argmax(axis=1)] == labels).astype(float)

    samples = frame[frame["kind"] == SAMPLE]
    for model, feats in ((0, f_old), (1, f_new)):
        points = samples[samples["model"] == model]
        rows = points["row"].astype(int).to_numpy()
        np.testing.assert_array_equal(points["hit"], full_top1(feats)[rows])
        expected = paired_cosine_distances(f_old[rows], f_new[rows])
        np.testing.assert_allclose(points["drift"], expected, atol=1e-6)  # float32 features
    assert 0 < samples["hit"].mean() < 1  # the synthetic study has hits and misses
    marks = frame[frame["kind"].isin([CLASS_MEAN, PROTOTYPE])]
    assert (marks[["row", "hit", "drift"]] == -1).all().all()


# ------------------------------------------------------------------------------------------ pure helpers


def sample_points(per_class: dict[str, int]) -> pd.DataFrame:
    """Two models' points of images grouped by class (rows numbered in class order), x = row, y = -row."""
    names = [c for c, n in per_class.items() for _ in range(n)]
    image = pd.DataFrame({"row": np.arange(len(names)), "class": names,
                          "label": [list(per_class).index(c) for c in names]})
    return pd.concat([image.assign(model=m, x=image["row"] * 1.0, y=-image["row"] * 1.0) for m in (OLD, NEW)],
                     ignore_index=True)


def test_clicked_row_and_boxed_points():
    assert mx.clicked_row(None) is None
    assert mx.clicked_row({"selection": {"pick": [], "box": {}}}) is None
    assert mx.clicked_row({"selection": {"pick": [{"row": 12, "model": NEW}]}}) == 12
    points = sample_points({"a": 5, "b": 5})
    inside = mx.boxed_points({"selection": {"box": {"x": [3.5, 1.5], "y": [-4.0, 0.0]}}}, points)
    assert sorted(inside["row"]) == [2, 2, 3, 3]  # x in [1.5, 3.5] and y in [-4, 0], both models
    assert mx.boxed_points({"selection": {"box": {}}}, points).empty
    table = mx.selection_table(inside, image_uris=lambda t: [f"img/{r}.png" for r in t["row"]])
    assert list(table.columns) == ["image", "class", "model", "row"]
    assert list(table["image"]) == ["img/2.png", "img/2.png", "img/3.png", "img/3.png"]


def test_matching_classes():
    classes = ["cat", "Wildcat", "dog", "hotdog"]
    assert mx.matching_classes(classes, " CAT ") == ["cat", "Wildcat"]
    assert mx.matching_classes(classes, "") == []
    assert mx.matching_classes(classes, "zebra") == []


def test_display_sample_keeps_every_class_and_the_same_images():
    points = sample_points({"big": 900, "mid": 90, "tiny": 1})
    shown, note = mx.display_sample(points, limit=100, seed=0)
    per_model = shown.groupby("model")["row"].apply(lambda r: sorted(r))
    assert per_model[OLD] == per_model[NEW]  # the same images for both models
    counts = shown[shown["model"] == OLD]["class"].value_counts()
    assert counts.to_dict() == {"big": 91, "mid": 9, "tiny": 1}  # quotas 90.8, 9.1, 0.1: 90 + 9 + 0, one to the
    # largest remainder (big), and the tiny class keeps its one image
    assert note.startswith("showing 101 of 991 points per model, sampled per class")
    small = sample_points({"a": 3})
    same, note = mx.display_sample(small, limit=100)
    assert same is small and note == ""


def test_retrieval_categories():
    points = sample_points({"a": 4})
    # image 0: both hit; 1: old hit, new miss; 2: old miss, new hit; 3: both miss
    points["hit"] = [1, 1, 0, 0] + [1, 0, 1, 0]
    points["drift"] = [0.1, 0.2, 0.3, -1.0] * 2
    out = mx.with_colour_columns(points, [OLD, NEW])
    assert list(out["retrieval"][:4]) == list(mx.RETRIEVAL_ORDER)
    assert list(out["retrieval"][4:]) == list(mx.RETRIEVAL_ORDER)
    assert out["drift"].isna().sum() == 2  # -1 is "not defined"
    legacy = mx.with_colour_columns(sample_points({"a": 2}), [OLD, NEW])
    assert set(legacy["retrieval"]) == {"not stored"}


def test_class_palette_many_classes_and_legend():
    for n in (3, 20, 35, 100):
        palette = charts.class_palette(n)
        assert len(palette) == n == len(set(palette))
    points = sample_points({f"c{i}": 2 for i in range(35)})
    spec = charts.projection_chart(points, points.iloc[:0], points.iloc[:0], points.iloc[:0], model_names=[OLD, NEW],
                                   title="t", facet=False).to_dict()
    colour = map_layer(spec)["encoding"]["color"]["condition"]
    assert len(colour["scale"]["range"]) == 35 and colour["legend"]["symbolLimit"] >= 35
    assert colour["legend"]["columns"] == 2  # 20 entries per column: nothing is cut


# ------------------------------------------------------------------------------------------ the page






def open_map(study_url: str):
    at = open_page("geometry")
    at.selectbox(key="geo_experiment").set_value(1).run()
    at.radio(key="geo_method").set_value("pca").run()
    assert not at.exception, at.exception
    return at


@pytest.fixture
def study(app_db) -> dict:
    return {"url": app_db, **fill_study(app_db, steps=3)}


def test_colour_by_options(study):
    at = open_map(study["url"])
    expected = {"class": "class", "model": "model", "retrieved across models": "retrieval", "drift magnitude": "drift"}
    assert at.selectbox(key="geo_colour").options == list(expected)
    for option, field in expected.items():
        at.selectbox(key="geo_colour").set_value(option).run()
        assert not at.exception, at.exception
        spec, frame = drawn(at)
        assert map_layer(spec)["encoding"]["color"]["condition"]["field"] == field
    assert set(frame["retrieval"]) <= set(mx.RETRIEVAL_ORDER) and frame["drift"].between(0, 2).all()


def test_search_and_highlight_fade_the_other_classes(study):
    at = open_map(study["url"])
    at.text_input(key="geo_search").input("CLASS-1").run()
    assert "1 class(es) match 'CLASS-1': class-1" in texts(at)
    _, frame = drawn(at)
    assert set(frame[frame["highlighted"]]["class"]) == {"class-1"}
    at.selectbox(key="geo_highlight").set_value("class-4").run()
    _, frame = drawn(at)
    assert set(frame[frame["highlighted"]]["class"]) == {"class-1", "class-4"}
    at.text_input(key="geo_search").input("zebra").run()
    assert "No class matches 'zebra'" in texts(at)


def test_a_large_stored_map_is_sampled_for_display_with_a_note(study):
    n, classes = 12_000, 30
    rng = np.random.default_rng(0)
    labels = np.arange(n) % classes
    exp = study["experiments"]["independent"]
    key = analysis_key("projection", PCA)
    with session_scope(get_engine(study["url"])) as s:
        payload = dict(load_analysis(s, exp, "projection", key).payload)
        payload.update(n_rows=n, n_sampled=n,
                       classes=[{"label": c, "name": f"class-{c}", "seen_old": True, "seen_new": True}
                                for c in range(classes)])
        blocks = [np.column_stack([rng.normal(size=(n, 2)), np.full(n, m), np.full(n, SAMPLE), labels, np.arange(n),
                                   rng.integers(0, 2, n), rng.uniform(0, 1, n)]) for m in (0, 1)]
        save_analysis(s, exp, "projection", key, payload, np.vstack(blocks))
    at = open_map(study["url"])
    assert "Showing 5,000 of 12,000 points per model, sampled per class" in texts(at)
    spec, frame = drawn(at)
    per_class = frame.groupby("class")["row"].nunique()  # 400 x 5000 / 12000 = 166.7: 20 classes get 167
    assert len(frame) == 2 * 5000 and sorted(per_class.value_counts().items()) == [(166, 10), (167, 20)]
    colour = map_layer(spec)["encoding"]["color"]["condition"]
    assert len(colour["scale"]["range"]) == classes and colour["legend"]["columns"] == 2


def test_click_makes_the_query_and_a_box_lists_the_points(study):
    at = open_map(study["url"])
    _, frame = drawn(at)
    row = int(frame["row"].iloc[3])
    at.session_state["geo_map"] = {"selection": {"pick": [{"row": row, "model": NEW}], "box": {}}}
    at.run()
    assert not at.exception, at.exception
    assert at.session_state["geometry_query"] == row and at.session_state["geometry_query_split"] == "gallery"
    assert f"Query: gallery image #{row} (class-{row // 15})" in texts(at)  # fill_study: 15 images per class
    spec, _ = drawn(at)
    ring = [layer for layer in spec["layer"] if layer.get("mark", {}).get("size") == 420]
    assert len(ring) == 1, "the query's points are ringed"
    box = {"x": [float(frame["x"].min()), float(frame["x"].median())], "y": [-1e9, 1e9]}
    at.session_state["geo_map"] = {"selection": {"pick": [{"row": row, "model": NEW}], "box": box}}
    at.run()
    listed = at.dataframe[0].value
    inside = frame[frame["x"] <= frame["x"].median()]
    assert len(listed) == len(inside) and set(listed["row"]) == set(inside["row"])
    assert list(listed.columns[:3]) == ["class", "model", "row"]
    assert f"**Selected in the box**: {inside['row'].nunique():,} images, {len(inside):,} points" in texts(at)
