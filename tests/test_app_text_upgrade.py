"""The text-upgrade summary in the dashboard (issue 28): the Checkpoints page's "Text-embedding upgrade results" reads
a text comparison's stored ``text_upgrade`` analysis and shows a verdict per pair, the T x T matrix with each cross
cell marked by its pair's verdict, every metric per pair, the adapters per pair and the notes; the Upgrade check page
links to it; the Feature geometry page replaces its class-based parts by one line on the qrels task.

The comparison is real (MiniLM L3, L6 and L6 int8 on a small WordNet sample, stored by the engine as the worker
would); the summary is a hand-made payload saved through storage, so every number the page shows is checked against
numbers written here by hand (percentages with one decimal, differences in points).
"""
from __future__ import annotations

import copy

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app import text_upgrade_view as tv
from app.checkpoint_form import PREFIX
from engine.checkpoints.request import comparison_spec
from engine.core.contract import analysis_key
from engine.data.wordnet import WORDNET_ROOT
from storage import enqueue_job, get_engine, list_jobs, save_analysis, session_scope
from support.app_text_upgrade import ADAPTERS, METRICS, MODELS, NOTES, SPEC, summary_payload

PAGE = Path(__file__).resolve().parents[1] / "app" / "app_pages" / "checkpoints.py"
TIMEOUT = 120




# ------------------------------------------------------------------------------------------ pure parts


def test_text_task_names_the_corpus_task_of_text_comparisons_only():
    assert tv.text_task({"source": "checkpoints", "spec": {"dataset": "wordnet:task=qrels,queries=5,gallery=9"}}) == "qrels"
    assert tv.text_task({"source": "checkpoints", "spec": {"dataset": "wordnet:task=class"}}) == "class"
    assert tv.text_task({"source": "checkpoints", "spec": {"dataset": "wordnet"}}) == "qrels"  # the default task
    assert tv.text_task({"source": "checkpoints", "spec": {"dataset": "digits"}}) is None
    assert tv.text_task({"source": "checkpoints", "spec": {"query_dataset": "imagefolder:/a"}}) is None
    assert tv.text_task({"methods": ["bct"], "dataset": {"name": "wordnet"}}) is None  # not a comparison


def test_headline_in_words_and_points():
    payload = summary_payload()
    assert tv.headline(payload, payload["pairs"][0]) == (
        "minilm_l6 queries on the minilm_l3 index: not compatible, Recall@1 6.3% vs 20.0% for minilm_l3 alone "
        "(-13.7 points, 95% CI -16.0 to -11.4 over 40 queries); minilm_l6 alone 23.0%.")
    assert tv.headline(payload, payload["pairs"][2]) == (
        "minilm_l6_int8 queries on the minilm_l6 index: too close to call, Recall@1 22.5% vs 23.0% for minilm_l6 alone "
        "(-0.5 points, 95% CI -2.0 to +1.0 over 40 queries); minilm_l6_int8 alone 22.8%.")
    label_free = tv.headline(payload, payload["pairs"][0], "neighbour_recall@10")
    assert label_free.endswith("neighbour recall@10 2.0% vs 21.0% for minilm_l3 alone (-19.0 points, 95% CI -20.0 to "
                               "-18.0 over 40 queries).")  # no "alone" for the new model: new/new is the reference
    two_way = copy.deepcopy(payload)  # a Recall@k interval that resampled the gallery items too says so
    two_way["pairs"][0]["rows"][0]["interval"] = "two-way"
    assert tv.headline(two_way, two_way["pairs"][0]).endswith(
        "(-13.7 points, 95% CI -16.0 to -11.4 over 40 queries and 120 gallery items); minilm_l6 alone 23.0%.")
    line = tv.corpus_line(payload)
    assert "for Recall@k also over the gallery items" in line and "strict ECC" in line and "1,000 resamples" in line


def test_matrix_cells_carry_their_pairs_verdicts():
    C, ecc, paired = tv.matrix_arrays(summary_payload(), "recall@1")
    expected = np.array([[0.200, np.nan, np.nan], [0.063, 0.230, np.nan], [0.070, 0.225, 0.228]])
    np.testing.assert_array_equal(np.isnan(C), np.isnan(expected))
    np.testing.assert_allclose(C[~np.isnan(C)], expected[~np.isnan(expected)])
    assert paired["verdict"] == [[None, None, None], ["fail", None, None], ["fail", "unresolved", None]]
    assert ecc.tolist() == [[1, 1, 1], [0, 1, 1], [0, 1, 1]]  # red only where the pair is not compatible
    assert paired["lo"][2][1] == -0.020 and paired["hi"][2][1] == 0.010
    assert tv.matrix_arrays(summary_payload(), "supersense_recall@1")[2]["verdict"][2][1] == "pass"


def test_pairs_and_adapters_tables_in_percent_and_points():
    frame = tv.pairs_frame(summary_payload())
    assert len(frame) == 3 * 6 and list(frame["pair"][:6]) == ["minilm_l3 → minilm_l6"] * 6
    assert list(frame["metric"][:6]) == ["Recall@1", "Recall@10", "mAP@10", "nDCG@10", "supersense Recall@1",
                                         "neighbour recall@10"]
    first = frame.iloc[0]
    assert (first["old/old %"], first["new/old %"], first["new/new %"]) == pytest.approx((20.0, 6.3, 23.0))
    assert first["difference (points)"] == pytest.approx(-13.7) and first["95% CI (points)"] == "-16.0 to -11.4"
    assert first["verdict"] == "✗ not compatible"
    assert np.isnan(frame.iloc[5]["new/new %"])  # label-free: new/new is the reference
    assert frame.iloc[16]["verdict"] == "✓ compatible" and frame.iloc[12]["verdict"] == "? too close to call"
    adapters = tv.adapters_frame(ADAPTERS[0]["rows"], 0.95)
    assert adapters[["family", "kind", "pairs"]].values.tolist() == [["post-hoc", "procrustes", 1000],
                                                                     ["paper 004", "B⊥ + F", 1000]]
    assert adapters["Recall@1 %"].tolist() == pytest.approx([11.8, 21.0])
    assert adapters["share of new/new %"].tolist() == pytest.approx([51.3, 91.3])
    assert adapters["95% CI (points)"].tolist() == ["-10.0 to -6.0", "-1.0 to +3.0"]
    assert adapters["verdict"].tolist() == ["✗ not compatible", "? too close to call"]


def test_every_metric_says_what_it_means():
    line = tv.meanings_line(METRICS)
    assert line.split(" · ")[0] == "Recall@1: share of sentences with its own definition as the top hit"
    assert "Recall@10: share of sentences with its own definition among the top 10" in line
    assert "supersense Recall@1: the top hit is a definition of the sentence's supersense" in line
    assert "neighbour recall@10: label-free" in line and "mAP@10: mean average precision in the top 10" in line
    assert tv.meaning("recall@1", "class") == "Recall@1: share of sentences with a definition of its supersense as the top hit"


# ------------------------------------------------------------------------------------------ the pages


@pytest.fixture(scope="module")
def stored_comparison(tmp_path_factory) -> Path:
    """MiniLM L3 -> L6 -> L6 int8 on a small WordNet sample, compared and stored once (copied for each test)."""
    pytest.importorskip("onnxruntime", reason="pip install -r requirements-text.txt")
    pytest.importorskip("tokenizers", reason="pip install -r requirements-text.txt")
    from engine.checkpoints.store import run_checkpoint_comparison
    from engine.models.text_models import missing_text_models

    missing = missing_text_models(tuple(MODELS))
    if missing or not (WORDNET_ROOT / "data.noun").is_file():
        pytest.skip(f"needs WordNet and the offline text models: {'; '.join(missing) or 'apt-get install wordnet-base'}")
    path = tmp_path_factory.mktemp("text_upgrade") / "study.db"
    db = get_engine(f"sqlite:///{path}")
    assert run_checkpoint_comparison(db, SPEC) == 1
    db.dispose()
    return path


@pytest.fixture
def study(stored_comparison, tmp_path, monkeypatch) -> str:
    """The stored comparison in this test's own database and feature store (the pages read COMPATLAB_DB_URL)."""
    shutil.copytree(stored_comparison.parent / "features", tmp_path / "features")  # the store beside the database
    path = tmp_path / "app.db"
    with sqlite3.connect(stored_comparison) as source, sqlite3.connect(path) as copy:
        source.backup(copy)
    url = f"sqlite:///{path}"
    monkeypatch.setenv("COMPATLAB_DB_URL", url)
    return url


def save_summary(url: str, payload: dict) -> None:
    with session_scope(get_engine(url)) as s:
        save_analysis(s, 1, "text_upgrade", analysis_key("text_upgrade", {}), payload)


def jobs(url: str) -> list[dict]:
    with session_scope(get_engine(url)) as s:
        return [{"id": j.id, "kind": j.kind, "payload": dict(j.payload), "experiment_id": j.experiment_id}
                for j in list_jobs(s)]


def checkpoints_page() -> AppTest:
    at = AppTest.from_file(str(PAGE), default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    return at


def cell_labels(at: AppTest) -> dict[tuple[str, str], str]:
    """The heatmap's cell labels by (query model, gallery model), as the page sent them."""
    import json

    import pyarrow as pa

    chart = at.get("vega_lite_chart")[0].proto
    frames = [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.datasets]
    frame = next(f for f in frames if "label" in f)
    assert json.loads(chart.spec)["layer"]  # the heatmap's layers
    return {(q, g): label for q, g, label in zip(frame["query"], frame["gallery"], frame["label"])}


def unplain_all(elements) -> list[str]:
    from support.app_pages import unplain

    return [unplain(e.value) for e in elements]


def test_the_section_shows_the_stored_summary(study):
    save_summary(study, summary_payload())
    at = checkpoints_page()
    assert at.expander[0].label == "Text-embedding upgrade results"
    assert at.selectbox(key=PREFIX + "text_experiment").value == 1
    errors, warnings = unplain_all(at.error), unplain_all(at.warning)
    assert errors == [tv.headline(summary_payload(), p) for p in summary_payload()["pairs"][:2]]
    assert errors[0].startswith("minilm_l6 queries on the minilm_l3 index: not compatible, Recall@1 6.3% vs 20.0%")
    assert warnings == ["minilm_l6_int8 queries on the minilm_l6 index: too close to call, Recall@1 22.5% vs 23.0% for "
                        "minilm_l6 alone (-0.5 points, 95% CI -2.0 to +1.0 over 40 queries); minilm_l6_int8 alone 22.8%."]
    assert [t.label for t in at.tabs] == ["Matrix", "Every metric per pair", "Adapters", "Notes (2)"]
    # the matrix: each cross cell marked by its pair's verdict, the self-tests unmarked
    assert cell_labels(at) == {("minilm_l3", "minilm_l3"): "20.0", ("minilm_l6", "minilm_l3"): "6.3 ✗",
                               ("minilm_l6", "minilm_l6"): "23.0", ("minilm_l6_int8", "minilm_l3"): "7.0 ✗",
                               ("minilm_l6_int8", "minilm_l6"): "22.5 ?", ("minilm_l6_int8", "minilm_l6_int8"): "22.8"}
    metric = at.selectbox(key=PREFIX + "tu_metric")
    assert metric.options == ["Recall@1", "Recall@10", "mAP@10", "nDCG@10", "supersense Recall@1"]  # no label-free one
    metric.set_value("supersense_recall@1").run()
    assert not at.exception, at.exception
    labels = cell_labels(at)
    assert labels[("minilm_l6_int8", "minilm_l6")] == "63.0 ✓" and labels[("minilm_l6", "minilm_l3")] == "40.0 ✗"
    # every metric per pair, then the adapters of the two pairs that have some
    pairs, first, second = (d.value for d in at.dataframe)
    assert len(pairs) == 18 and pairs.iloc[0]["new/old %"] == pytest.approx(6.3)
    assert pairs.iloc[0]["difference (points)"] == pytest.approx(-13.7) and pairs.iloc[0]["verdict"] == "✗ not compatible"
    assert pairs.iloc[16][["metric", "verdict"]].tolist() == ["supersense Recall@1", "✓ compatible"]
    assert np.isnan(pairs.iloc[5]["new/new %"])
    assert first["kind"].tolist() == ["procrustes", "B⊥ + F"] and first["Recall@1 %"].tolist() == pytest.approx([11.8, 21.0])
    assert second[["family", "kind", "verdict"]].values.tolist() == [["post-hoc", "affine", "✓ compatible"]]
    assert second["share of new/new %"].tolist() == pytest.approx([105.3])
    shown = "\n".join(unplain_all([*at.markdown, *at.caption]))
    assert "**minilm_l3 → minilm_l6**" in shown and "**minilm_l3 → minilm_l6_int8**" in shown
    assert "minilm_l6 → minilm_l6_int8**" not in shown  # a pair without adapters gets no empty table
    assert all(f"- {note}" in shown for note in NOTES)
    assert tv.PSP_LSP_LINE in shown and tv.meanings_line(METRICS) in shown
    assert "40 example sentences (queries) against 120 definitions (gallery), sample seed 1 · 1,000 training texts" in shown


def test_a_summary_without_adapters_or_notes_says_so(study):
    save_summary(study, {**summary_payload(), "adapters": [], "notes": []})
    at = checkpoints_page()
    assert [t.label for t in at.tabs][-1] == "Notes (0)" and len(at.dataframe) == 1  # the pairs table alone
    captions = [c.value for c in at.caption]
    assert any(c.startswith("No adapters in this summary") for c in captions)
    assert "The engine left no notes on this summary." in captions


def test_without_a_summary_compute_queues_it(study):
    at = checkpoints_page()
    assert any("Not computed yet" in i.value for i in at.info)
    at.button(key=PREFIX + "text_summary_compute").click().run()
    assert not at.exception, at.exception
    queued = [j for j in jobs(study) if j["kind"] == "analysis"]
    assert [(j["payload"]["kind"], j["payload"]["experiment_id"], j["experiment_id"]) for j in queued] == \
        [("text_upgrade", 1, 1)]


def test_a_text_comparisons_job_queues_its_summary_and_an_image_comparisons_does_not(study, monkeypatch):
    """The worker's ``checkpoints`` job queues the ``text_upgrade`` summary of the text comparison it stored (the
    comparison itself is stubbed: what is tested is the queuing; the summary's numbers are tests/test_text_upgrade.py's)."""
    from engine.checkpoints import store
    from engine.jobs.job_handlers import JobContext, checkpoints_job

    monkeypatch.setattr(store, "run_checkpoint_comparison", lambda db, spec, **kw: 1)
    db = get_engine(study)
    context = JobContext(progress=lambda f, m: None, should_stop=lambda: False, checkpoint_dir=None)
    message = checkpoints_job(db, {"spec": SPEC}, context)
    queued = [j for j in jobs(study) if j["kind"] == "analysis"]
    assert [(j["payload"], j["experiment_id"]) for j in queued] == [({"experiment_id": 1, "kind": "text_upgrade",
                                                                      "params": {}}, 1)]
    assert message == f"experiment 1; its text-upgrade summary is job #{queued[0]['id']}"
    image = {"models": [{"path": "pretrained:efficientnet_lite0"}], "dataset": "digits", "views": ["encoder"]}
    assert checkpoints_job(db, {"spec": image}, context) == "experiment 1"
    assert len([j for j in jobs(study) if j["kind"] == "analysis"]) == 1


def test_while_this_sessions_comparison_runs_the_section_follows_it(app_db):
    with session_scope(get_engine(app_db)) as s:
        job_id = enqueue_job(s, "checkpoints", {"spec": SPEC})
    at = AppTest.from_file(str(PAGE), default_timeout=TIMEOUT)
    at.session_state[PREFIX + "result"] = {"spec": comparison_spec(SPEC).to_dict(), "job_id": job_id}
    at.run()
    assert not at.exception, at.exception
    assert at.expander[0].label == "Text-embedding upgrade results"
    assert any(i.value.startswith(f"Queued as job #{job_id}") for i in at.info)
    assert "Its summary is queued as soon as the comparison is stored (the worker does it), and shown here." in \
        [c.value for c in at.caption]
    assert [j["kind"] for j in jobs(app_db)] == ["checkpoints"]  # nothing queued before the comparison is stored


def test_no_section_without_a_text_comparison(app_db):
    at = checkpoints_page()
    assert not at.expander or at.expander[0].label != "Text-embedding upgrade results"
    assert not at.get("selectbox") or all(s.key != PREFIX + "text_experiment" for s in at.selectbox)


def test_the_upgrade_page_links_a_text_comparison_to_its_summary(study):
    from support.app_pages import open_page

    at = open_page("upgrade")
    links = [e.proto for e in at.get("page_link")]
    assert any(link.page == "checkpoints" and "Text-embedding upgrade results" in link.label for link in links)


def test_geometry_on_qrels_replaces_class_parts_by_one_line(study):
    from support.app_pages import open_page, texts

    from engine.jobs.analysis import run_analysis

    params = {"step_a": 2, "step_b": 3, "view": "encoder", "split": "gallery", "method": "pca", "max_points": 2000}
    run_analysis(get_engine(study), 1, "projection", params)
    at = open_page("geometry")
    at.radio(key="geo_method").set_value("pca").run()
    assert not at.exception, at.exception
    shown = texts(at)
    assert "Class-based geometry does not apply here" in shown and "**Neural collapse**" not in shown
    assert "**Definition 1** (Shen" not in shown and "**Stationarity probe**" not in shown
    assert len(at.get("vega_lite_chart")) == 1 and not at.dataframe  # the map; no drift, angles or collapse table
    assert "Nearest neighbours across models" in shown and at.selectbox(key="nn_text_row").value == 0  # kept
    assert not any(b.key == "geo_all_compute" for b in at.button)  # nothing class-based to compute
    # the one number kept: the mean cosine of each text under the two models, against numpy on the stored features
    from support.app_text import stored_encoder

    old, new = (stored_encoder(study, 1, step, "gallery") for step in (2, 3))  # the page's default: the last two
    cos = (old * new).sum(1) / np.linalg.norm(old, axis=1) / np.linalg.norm(new, axis=1)
    assert at.metric[0].label == "Mean cosine of the same text, old vs new model"
    assert at.metric[0].value == f"{cos.mean():.3f}"
    assert not pd.isna(cos.mean())
