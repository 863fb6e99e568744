"""The offline text sequence through compare-checkpoints and check-upgrade --model (engine.checkpoints.text_compare):
WordNet example sentences against definitions, the matrices checked against a numpy cosine search."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="pip install -r requirements-text.txt")
pytest.importorskip("tokenizers", reason="pip install -r requirements-text.txt")

from engine.checkpoints.compare import compare_checkpoints
from engine.checkpoints.request import comparison_spec
from engine.checkpoints.text_compare import NO_HEAD_NOTE
from engine.cli import main
from engine.data.wordnet import WORDNET_ROOT, wordnet_task
from engine.data.text_model_files import TEXT_SEQUENCE
from engine.models.text_models import missing_text_models

MISSING = missing_text_models(("minilm_l3", "minilm_l6_int8"))
pytestmark = [pytest.mark.skipif(bool(MISSING), reason=f"the offline text models are not installed: {'; '.join(MISSING)}"),
              pytest.mark.skipif(not (WORDNET_ROOT / "data.noun").is_file(),
                                 reason="WordNet's files are absent: apt-get install wordnet-base")]
SMALL = "wordnet:queries=40,gallery=120,seed=1"


@pytest.fixture(autouse=True)
def own_data_folder(tmp_path, monkeypatch):
    """Each test runs in its own folder, so ./data (the first data root: the text embedding cache) starts empty."""
    monkeypatch.chdir(tmp_path)


def recall_at_1(query: np.ndarray, gallery: np.ndarray, q_labels: np.ndarray, g_labels: np.ndarray) -> float:
    """Recall@1 by plain cosine argmax (no ties on these real-valued embeddings)."""
    q = query / np.linalg.norm(query, axis=1, keepdims=True)
    g = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    return float(np.mean(g_labels[np.argmax(q @ g.T, axis=1)] == q_labels))


def test_qrels_matrix_equals_a_numpy_search_and_psp_is_explained():
    spec = {"models": [{"path": "pretrained:minilm_l3"}, {"path": "pretrained:minilm_l6_int8"}], "dataset": SMALL,
            "metrics": ["recall@1"]}
    cmp = compare_checkpoints(spec)
    assert cmp.labels == ["minilm_l3", "minilm_l6_int8"] and list(cmp.results) == ["encoder"]
    assert NO_HEAD_NOTE in cmp.notes  # the default views ask for psp/lsp: said, not hidden
    task = wordnet_task(queries=40, gallery=120, seed=1)
    ql, gl = cmp.split_labels["query"], cmp.split_labels["gallery"]
    assert [task.gallery_ids[i] for i in ql] == task.query_ids  # each query's one relevant item: its own synset
    matrix = cmp.results["encoder"].values["recall@1"]
    for t in range(2):
        for k in range(t + 1):
            expected = recall_at_1(cmp.outputs[t]["query"]["encoder"], cmp.outputs[k]["gallery"]["encoder"], ql, gl)
            assert matrix[t, k] == pytest.approx(expected, abs=1e-9)
    assert matrix[1, 1] > 0.2 and matrix[1, 0] < matrix[0, 0]  # L3 -> L6 int8: a real incompatible upgrade
    assert [(e["model"], e["unit"], e["items"], e["cached"]) for e in cmp.embedding] == [
        ("minilm_l3", "texts", 160, 0), ("minilm_l6_int8", "texts", 160, 0)]  # 40 queries + 120 definitions, timed
    again = compare_checkpoints(spec)  # the same texts again: read from the cache, so nothing is timed
    assert [(e["items"], e["cached"], e["seconds"]) for e in again.embedding] == [(0, 160, 0.0), (0, 160, 0.0)]


def test_class_task_uses_supersenses():
    cmp = compare_checkpoints({"models": [{"path": "pretrained:minilm_l3"}], "dataset": SMALL.replace("wordnet:", "wordnet:task=class,"),
                               "views": ["encoder"], "metrics": ["recall@1"]})
    task = wordnet_task(queries=40, gallery=120, seed=1)
    assert np.array_equal(cmp.split_labels["query"], task.query_labels)
    assert cmp.dataset_classes == task.class_names and not any(n == NO_HEAD_NOTE for n in cmp.notes)


def test_text_and_images_do_not_mix():
    with pytest.raises(ValueError, match="text models only"):  # refused when the request is checked, before any load
        comparison_spec({"models": [{"path": "pretrained:efficientnet_lite0"}], "dataset": "wordnet"})
    with pytest.raises(ValueError, match="text models only"):
        compare_checkpoints({"models": [{"path": "pretrained:minilm_l3"}], "dataset": "digits"})
    with pytest.raises(ValueError, match="wordnet option"):
        compare_checkpoints({"models": [{"path": "pretrained:minilm_l3"}], "dataset": "wordnet:size=3"})


@pytest.mark.slow
def test_cli_stores_and_check_upgrade_reads_the_text_pair(tmp_path, db_url, capsys):
    out = tmp_path / "text.json"
    assert main(["compare-checkpoints", "--model", "pretrained:minilm_l3", "--model", "pretrained:minilm_l6_int8",
                 "--dataset", SMALL, "--metric", "recall@1", "--json", str(out), "--db", db_url]) == 0
    data = json.loads(out.read_text())
    assert [(m["architecture"], m["kind"], m["feature_dim"]) for m in data["models"]] == [
        ("minilm_l3", "text", 384), ("minilm_l6_int8", "text", 384)]
    printed = capsys.readouterr().out
    assert "stored as experiment" in printed and NO_HEAD_NOTE in printed
    cross = data["views"]["encoder"]["metrics"]["recall@1"]["matrix"][1][0]
    code = main(["check-upgrade", "--model", "pretrained:minilm_l3", "--model", "pretrained:minilm_l6_int8",
                 "--dataset", SMALL, "--metric", "recall@1"])  # the matrix's metric
    report = capsys.readouterr().out
    assert code in (1, 3)  # not compatible or, on 40 queries, too close to call; never compatible (exit 0)
    assert f"minilm_l6_int8/minilm_l3 {cross:.4f}" in report  # the same cross-test as compare-checkpoints' matrix


def test_a_users_onnx_folder_is_the_same_model_as_its_pinned_copy(tmp_path):
    from engine.data.text_model_files import MINILM_L3_ONNX, MINILM_TOKENIZER, installed_path, read_pinned

    folder = tmp_path / "my-l3"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(installed_path(MINILM_L3_ONNX).read_bytes())
    (folder / "tokenizer.json").write_bytes(read_pinned(MINILM_TOKENIZER))
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": 128}')
    cmp = compare_checkpoints({"models": [{"path": "pretrained:minilm_l3"}, {"path": str(folder), "arch": "text"}],
                               "dataset": SMALL, "views": ["encoder"], "metrics": ["recall@1"]})
    assert cmp.labels == ["minilm_l3", "my-l3"] and cmp.models[1].sha256 == MINILM_L3_ONNX.sha256
    a, b = cmp.outputs[0]["query"]["encoder"], cmp.outputs[1]["query"]["encoder"]
    assert np.allclose(a / np.linalg.norm(a, axis=1, keepdims=True), b, atol=1e-6)  # no modules.json: normalised
    matrix = cmp.results["encoder"].values["recall@1"]
    assert matrix[1, 0] == matrix[0, 0] == matrix[1, 1]  # one model under two names is compatible with itself
    with pytest.raises(ValueError, match="a text model folder holds"):
        compare_checkpoints({"models": [{"path": str(tmp_path), "arch": "text"}], "dataset": SMALL})


@pytest.mark.slow
def test_a_train_split_is_stored_for_the_adapters_and_adapt_runs_on_it(db_url, capsys):
    from storage import feature_set_fingerprint, get_engine, list_model_versions, load_feature_set, session_scope
    from engine.checkpoints.store import store_comparison

    spec = {"models": [{"path": "pretrained:minilm_l3"}, {"path": "pretrained:minilm_l6_int8"}],
            "dataset": SMALL + ",train=60", "views": ["encoder"], "metrics": ["recall@1", "map"]}
    cmp = compare_checkpoints(spec)
    messages = []
    plain = compare_checkpoints({**spec, "dataset": SMALL}, progress=lambda f, m: messages.append(m))
    assert sum(m.endswith(("query texts cached", "gallery texts cached")) for m in messages) == 4  # the same sample
    for metric in ("recall@1", "map"):  # the matrices use the queries and the gallery only
        assert np.array_equal(cmp.results["encoder"].values[metric], plain.results["encoder"].values[metric], equal_nan=True)
    ql, gl = cmp.split_labels["query"], cmp.split_labels["gallery"]
    assert cmp.results["encoder"].values["recall@1"][1, 0] == pytest.approx(
        recall_at_1(cmp.outputs[1]["query"]["encoder"], cmp.outputs[0]["gallery"]["encoder"], ql, gl), abs=1e-9)
    task = wordnet_task(queries=40, gallery=120, seed=1, train=60)
    experiment = store_comparison(get_engine(db_url), cmp)
    with session_scope(get_engine(db_url)) as s:
        versions = list_model_versions(s, experiment)
        stored = [load_feature_set(s, v.id, "train", "encoder") for v in versions]
        query = load_feature_set(s, versions[0].id, "query", "encoder")
        prints = [feature_set_fingerprint(s, v.id, "query", "encoder") for v in versions]
    assert len(stored) == 2
    # each model's fingerprint: its weights' sha256, its stored name, 384-d, unit rows or not (L3 does not normalise,
    # L6 does: measured here with numpy), mean pooling
    unit = [bool(np.allclose(np.linalg.norm(out["query"]["encoder"], axis=1), 1, atol=1e-3)) for out in cmp.outputs]
    assert unit == [False, True]
    assert [(p["sha256"], p["name"], p["dim"], p["normalisation"], p["pooling"]) for p in prints] == [
        (m.sha256, f"{arch} checkpoints, experiment {experiment} step {step}", 384, "unit" if u else "raw", "mean")
        for step, (m, arch, u) in enumerate(zip(cmp.models, ("minilm_l3", "minilm_l6_int8"), unit), start=1)]
    for (features, labels, ids), out in zip(stored, cmp.outputs):
        assert features.shape == (120, 384) and np.array_equal(labels, task.train_labels)  # supersenses
        assert np.allclose(features, out["train"]["encoder"]) and np.array_equal(ids, np.arange(120))
    assert np.array_equal(query[1], cmp.split_labels["query"])  # qrels labels stay on the queries
    assert main(["adapt", "--experiment", str(experiment), "--old-step", "1", "--new-step", "2", "--kind", "perp",
                 "--epochs", "20", "--db", db_url]) == 0
    printed = capsys.readouterr().out
    assert "query/gallery" in printed and "backfill random" in printed


def test_the_text_upgrade_preset_on_the_command_line(capsys):
    import argparse

    from engine.checkpoints.presets import COMPARISON_PRESETS, comparison_preset
    from engine.cli.checkpoints import add_arguments, spec_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    spec = comparison_spec(spec_from_args(parser.parse_args(["--preset", "text-upgrade"])))
    assert [m.pretrained for m in spec.models] == list(TEXT_SEQUENCE)
    assert spec.dataset == "wordnet:task=qrels,queries=500,gallery=2000,seed=0,train=1000" and spec.views == ("encoder",)
    mine = spec_from_args(parser.parse_args(["--preset", "text-upgrade", "--dataset", SMALL, "--metric", "map"]))
    assert mine["dataset"] == SMALL and mine["metrics"] == ["map"] and len(mine["models"]) == 3
    with pytest.raises(SystemExit):  # --preset and --model exclude each other (argparse's one line, exit 2)
        parser.parse_args(["--preset", "text-upgrade", "--model", "pretrained:minilm_l3"])
    with pytest.raises(ValueError, match="no comparison preset 'nope'; known: text-upgrade"):
        comparison_preset("nope")
    copy = comparison_preset("text-upgrade")
    copy["models"].clear()
    assert len(COMPARISON_PRESETS["text-upgrade"]["models"]) == 3  # a copy: the registry is untouched
    assert main(["presets"]) == 0
    assert "text-upgrade     comparison: pretrained:minilm_l3 -> pretrained:minilm_l6 -> pretrained:minilm_l6_int8" \
        in capsys.readouterr().out
