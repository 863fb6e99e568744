"""The text_upgrade analysis (engine.upgrade.text_upgrade) on a small stored text comparison: WordNet's real texts
(queries=40, gallery=120) with synthetic embeddings stored through engine.results.record, every number checked
against a brute-force numpy search (sklearn's nDCG), the Recall@1 interval against check_upgrade's, an exact rotation
recovered by Procrustes, the refusals in one line, and the analysis stored by run_analysis."""
from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import ndcg_score

from engine.cli import main
from engine.core.contract import analysis_key, normalize_params
from engine.data.samples import text_refs
from engine.data.wordnet import WORDNET_ROOT, wordnet_task
from engine.jobs.analysis import run_analysis
from engine.metrics.compatibility import CellFeatures
from engine.results.record import NewVersion, record_experiment
from engine.upgrade.text_upgrade import PAPER_KINDS, POSTHOC_KINDS, compute_text_upgrade, metric_names
from engine.upgrade.verdict import check_upgrade
from storage import load_analysis, session_scope

pytestmark = pytest.mark.skipif(not (WORDNET_ROOT / "data.noun").is_file(),
                                reason="WordNet's files are absent: apt-get install wordnet-base")
DATASET = "wordnet:queries=40,gallery=120,seed=1"
K, D = 5, 16
NAMES = ("old", "noisy", "rotated")


@pytest.fixture(scope="module")
def task():
    return wordnet_task(queries=40, gallery=120, seed=1)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def embeddings(task, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Three models: a random old one (queries near their own definition), a noisy copy and an exact rotation."""
    rng = np.random.default_rng(seed)
    q_pos = np.array([task.gallery_ids.index(q) for q in task.query_ids])
    gallery = rng.normal(size=(len(task.gallery_ids), D))
    queries = gallery[q_pos] + 1.2 * rng.normal(size=(len(q_pos), D))
    train = rng.normal(size=(60, D))
    old = {"query": queries, "gallery": gallery, "train": train}
    noisy = {s: x + 0.8 * rng.normal(size=x.shape) for s, x in old.items()}
    rotation, _ = np.linalg.qr(rng.normal(size=(D, D)))
    rotated = {s: x @ rotation for s, x in old.items()}
    return [{s: x.astype(np.float32) for s, x in m.items()} for m in (old, noisy, rotated)]


def store(db_url: str, task, models, *, dataset: str = DATASET, train: bool = False, query_texts=None,
          source: str = "checkpoints") -> tuple[object, int]:
    """A text comparison stored as compare-checkpoints stores one: encoder features, labels, texts as refs."""
    from storage import get_engine

    db = get_engine(db_url)
    q_labels, g_labels = task.relevance_labels("qrels")
    train_labels = np.repeat(np.arange(3), 20)  # supersense indices
    labels = {"query": q_labels, "gallery": g_labels, **({"train": train_labels} if train else {})}
    refs = {"query": text_refs("wordnet", query_texts or task.query_texts), "gallery": text_refs("wordnet", task.gallery_texts)}
    versions = [NewVersion(architecture=name, method="checkpoints", classes=[], num_outputs=0, feature_dim=D,
                           outputs={s: {"encoder": m[s]} for s in labels}, labels=labels, name=name, refs=refs)
                for name, m in zip(NAMES, models)]
    config = {"source": source, "spec": {"dataset": dataset}}
    return db, record_experiment(db, name="text", method="checkpoints", config=config, versions=versions, results={},
                                 gallery_kind="instance")


def brute(query: np.ndarray, gallery: np.ndarray, q_labels: np.ndarray, g_labels: np.ndarray, q_sup, g_sup) -> dict:
    """Per-query metrics of one cell by a full cosine ranking (one relevant definition per query)."""
    sims = _unit(query.astype(np.float64)) @ _unit(gallery.astype(np.float64)).T
    order = np.argsort(-sims, axis=1, kind="stable")
    rank = np.argmax(order == q_labels[:, None], axis=1) + 1  # the own definition's rank
    truth = np.zeros_like(sims)
    truth[np.arange(len(q_labels)), q_labels] = 1
    ndcg = [ndcg_score(truth[i: i + 1], sims[i: i + 1], k=K) for i in range(len(sims))]
    return {"recall@1": np.mean(rank <= 1), f"recall@{K}": np.mean(rank <= K),
            f"map@{K}": np.mean(np.where(rank <= K, 1 / rank, 0)), f"ndcg@{K}": np.mean(ndcg),
            "supersense_recall@1": np.mean(g_sup[order[:, 0]] == q_sup), "top": order[:, :K]}


PARAMS = {"k": K, "resamples": 200, "level": 0.95, "seed": 0, "adapters": True}


def test_every_number_equals_a_numpy_search_and_check_upgrade(db_url, task):
    models = embeddings(task)
    db, exp_id = store(db_url, task, models)
    seen = []
    got = compute_text_upgrade(db, exp_id, PARAMS, lambda f, m: seen.append((f, m)))
    assert json.loads(json.dumps(got, allow_nan=False)) == got  # JSON-ready
    assert got["models"] == list(NAMES) and got["steps"] == [1, 2, 3] and got["metrics"] == metric_names(K)
    assert got["corpus"] == {"task": "qrels", "queries": 40, "gallery": 120, "train_texts": 0, "seed": 1}
    assert [f for f, _ in seen] == sorted(f for f, _ in seen) and any("paired verdicts" in m for _, m in seen)
    q_labels, g_labels = task.relevance_labels("qrels")
    cell = {(t, g): brute(models[t]["query"], models[g]["gallery"], q_labels, g_labels, task.query_labels,
                          task.gallery_labels) for t in range(3) for g in range(t + 1)}
    for metric, matrix in got["matrices"].items():
        for t in range(3):
            for g in range(3):
                assert matrix[t][g] is None if g > t else matrix[t][g] == pytest.approx(cell[(t, g)][metric], abs=1e-9)
    assert "neighbour_recall@5" not in got["matrices"]
    assert [(p["old"], p["new"]) for p in got["pairs"]] == [(0, 1), (0, 2), (1, 2)]
    for pair in got["pairs"]:
        o, n = pair["old"], pair["new"]
        rows = {r["metric"]: r for r in pair["rows"]}
        assert list(rows) == metric_names(K)
        for metric in metric_names(K)[:-1]:
            assert (rows[metric]["old_old"], rows[metric]["new_old"], rows[metric]["new_new"]) == pytest.approx(
                (cell[(o, o)][metric], cell[(n, o)][metric], cell[(n, n)][metric]), abs=1e-9)
        ref = cell[(n, n)]["top"]  # label-free: overlap with each query's new/new top-k
        overlap = lambda top: np.mean([len(set(a) & set(b)) / K for a, b in zip(top, ref)])  # noqa: E731
        nr = rows[f"neighbour_recall@{K}"]
        assert (nr["old_old"], nr["new_old"], nr["new_new"]) == pytest.approx(
            (overlap(cell[(o, o)]["top"]), overlap(cell[(n, o)]["top"]), 1.0))
        assert nr["better"] is None
        report = check_upgrade(CellFeatures(models[o]["query"], q_labels, models[o]["gallery"], g_labels),
                               CellFeatures(models[n]["query"], q_labels, models[n]["gallery"], g_labels),
                               resamples=200, seed=0, orderings=())
        r1 = rows["recall@1"]
        c = report.compatibility
        assert (r1["diff"], r1["lo"], r1["hi"], r1["verdict"], r1["interval"]) == (c.diff, c.lo, c.hi, c.verdict,
                                                                                  report.interval)
        assert r1["better"] == report.better.verdict
    notes = " ".join(got["notes"])
    assert "no train split stored" in notes and "1 by definition" in notes


def test_an_exact_rotation_is_undone_by_procrustes_and_paper_004_trains_on_the_train_split(db_url, task):
    models = embeddings(task)
    db, exp_id = store(db_url, task, models, train=True)
    got = compute_text_upgrade(db, exp_id, PARAMS, lambda f, m: None)
    assert got["corpus"]["train_texts"] == 60
    rotated = next(p for p in got["adapters"] if (p["old"], p["new"]) == (0, 2))
    old_old = next(p for p in got["pairs"] if (p["old"], p["new"]) == (0, 2))["rows"][0]
    assert old_old["metric"] == "recall@1" and old_old["new_new"] == pytest.approx(old_old["old_old"])
    rows = {(r["family"], r["kind"]): r for r in rotated["rows"]}
    assert [k for f, k in rows if f == "post-hoc"] == list(POSTHOC_KINDS)
    assert [k for f, k in rows if f == "paper 004"] == list(PAPER_KINDS)
    procrustes = rows[("post-hoc", "procrustes")]
    assert procrustes["recall@1"] == pytest.approx(old_old["old_old"], abs=1e-12)
    assert procrustes["share_of_new_new"] == pytest.approx(1.0) and procrustes["diff"] == 0
    assert procrustes["pairs"] == 60 and procrustes["fitted_on"] == "60 gallery definitions embedded by both models"
    perp = rows[("paper 004", "perp")]
    assert perp["pairs"] == 60 and "training texts" in perp["fitted_on"]
    assert perp["recall@1"] == pytest.approx(perp["share_of_new_new"] * old_old["new_new"])


def test_refusals_in_one_line(db_url, task, tmp_path, capsys):
    models = embeddings(task)
    changed = list(task.query_texts)
    changed[3] = changed[3] + " (edited)"
    db, exp_id = store(db_url, task, models, query_texts=changed)
    with pytest.raises(ValueError, match=r"^WordNet changed since experiment \d+ was embedded: query text 3 ") as err:
        compute_text_upgrade(db, exp_id, PARAMS, lambda f, m: None)
    assert "\n" not in str(err.value)
    _, image_id = store(db_url, task, models, dataset="digits", source="checkpoints")
    _, run_id = store(db_url, task, models, source="training")
    for eid in (image_id, run_id):
        with pytest.raises(ValueError, match=rf"^experiment {eid} is not a text comparison") as err:
            compute_text_upgrade(db, eid, PARAMS, lambda f, m: None)
        assert "\n" not in str(err.value)
    out = tmp_path / "summary.json"
    assert main(["check-upgrade", "--experiment", str(image_id), "--text-summary", "--db", db_url,
                 "--json", str(out)]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and "is not a text comparison" in err_lines[0] and not out.exists()
    assert main(["check-upgrade", "--experiment", str(image_id), "--text-summary", "--old-step", "1", "--db", db_url]) == 2


def test_run_analysis_stores_it_and_the_cli_prints_it(db_url, task, tmp_path, capsys, monkeypatch):
    db, exp_id = store(db_url, task, embeddings(task))
    params = {"k": K, "resamples": 100, "adapters": False}
    run_analysis(db, exp_id, "text_upgrade", params)
    with session_scope(db) as s:
        row = load_analysis(s, exp_id, "text_upgrade", analysis_key("text_upgrade", normalize_params("text_upgrade", params)))
        payload = dict(row.payload)
    assert payload["adapters"] == [] and payload["resamples"] == 100 and len(payload["pairs"]) == 3
    out = tmp_path / "summary.json"
    assert main(["check-upgrade", "--experiment", str(exp_id), "--text-summary", "--k", str(K), "--resamples", "100",
                 "--db", db_url, "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    bare = lambda pairs: [{k: v for k, v in p.items() if k != "decision"} for p in pairs]  # noqa: E731
    # the stored run fitted no adapter and the command line's did, so only their decisions may differ
    assert written["matrices"] == payload["matrices"] and bare(written["pairs"]) == bare(payload["pairs"])
    assert all(p["decision"]["decision"] in ("do not ship", "do not ship yet", "ship as is", "ship with adapter",
                                             "re-embed the gallery")  # no backfill measured: nothing cheaper passes
               for p in written["pairs"])
    printed = capsys.readouterr().out
    assert "old -> noisy" in printed and "post-hoc procrustes" in printed and "no train split stored" in printed
    monkeypatch.setattr("engine.jobs.analysis.normalize_params", lambda kind, params: params)  # a kind without a branch
    with pytest.raises(ValueError, match="no computation for analysis kind 'made_up'"):
        run_analysis(db, exp_id, "made_up", {})


def test_class_task_labels_are_the_supersenses(db_url, task):
    """task=class: the stored relevance is the supersense, so Recall@1 and the supersense Recall@1 are one number."""
    from storage import get_engine

    models = embeddings(task, seed=3)
    labels = {"query": task.query_labels, "gallery": task.gallery_labels}
    refs = {"query": text_refs("wordnet", task.query_texts), "gallery": text_refs("wordnet", task.gallery_texts)}
    versions = [NewVersion(architecture=name, method="checkpoints", classes=[], num_outputs=0, feature_dim=D,
                           outputs={s: {"encoder": m[s]} for s in labels}, labels=labels, name=name, refs=refs)
                for name, m in zip(NAMES[:2], models)]
    db = get_engine(db_url)
    exp_id = record_experiment(db, name="text", method="checkpoints", results={}, gallery_kind="instance",
                               config={"source": "checkpoints", "spec": {"dataset": DATASET.replace(":", ":task=class,")}},
                               versions=versions)
    got = compute_text_upgrade(db, exp_id, {**PARAMS, "adapters": False}, lambda f, m: None)
    assert got["corpus"]["task"] == "class" and got["matrices"]["recall@1"] == got["matrices"]["supersense_recall@1"]
    sims = _unit(models[1]["query"].astype(np.float64)) @ _unit(models[0]["gallery"].astype(np.float64)).T
    assert got["matrices"]["recall@1"][1][0] == pytest.approx(np.mean(task.gallery_labels[sims.argmax(1)] == task.query_labels))
    assert any("coincide" in n for n in got["notes"])


def test_an_unchanged_model_is_a_tie_as_check_upgrade_says(db_url, task):
    """The same embeddings twice: every difference is 0, the interval [0, 0] and the verdict check_upgrade's."""
    old = embeddings(task)[0]
    db, exp_id = store(db_url, task, [old, {s: x.copy() for s, x in old.items()}, old])
    got = compute_text_upgrade(db, exp_id, PARAMS, lambda f, m: None)
    q_labels, g_labels = task.relevance_labels("qrels")
    cell = CellFeatures(old["query"], q_labels, old["gallery"], g_labels)
    c = check_upgrade(cell, cell, resamples=200, seed=0, orderings=()).compatibility
    r1 = got["pairs"][0]["rows"][0]
    assert (r1["diff"], r1["lo"], r1["hi"], r1["verdict"]) == (c.diff, c.lo, c.hi, c.verdict) == (0, 0, 0, "too close to call")
    assert {r["verdict"] for p in got["adapters"] for r in p["rows"] if r["kind"] == "procrustes"} == {"too close to call"}
