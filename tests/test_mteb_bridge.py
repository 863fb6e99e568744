"""The MTEB bridge (issue 43): MTEB's own retrieval evaluator, fed by :class:`CrossTestEncoder` (queries by one model,
the corpus by another), scores each cell as pytrec_eval does on the same vectors and as the product's check-upgrade
does on the same store; the local task folder is read as BEIR lays it out, TREC qrels alike, bad rows one line.

MTEB rounds its scores to 5 decimals, so its numbers are compared to 6e-6; the vectors have no two scores within 2e-6
of each other in any query's top 11 (5.4e-6 at the closest), and float32's error on a 12-term cosine stays below
1e-6, so float32 (MTEB, torch) and float64 (numpy) rank them the same."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.cli import main
from engine.sources.text import SourceError
from support.offline_text import needs_text_models
from support.upgrade_sources import NG, NQ, embeddings, ids_for, tables, write_all

mteb = pytest.importorskip("mteb")
pytrec_eval = pytest.importorskip("pytrec_eval")

from engine.checkpoints.mteb_bridge import (CrossTestEncoder, local_retrieval_task, mteb_cross_tests,  # noqa: E402
                                            mteb_score_key)
from engine.sources.beir_folder import read_retrieval_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MTEB_TOL = 6e-6  # MTEB's round(x, 5), and nothing else between the two computations
MEASURES = {"ndcg_at_10": "ndcg_cut_10", "map_at_10": "map_cut_10", "recall_at_10": "recall_10",
            "precision_at_10": "P_10"}


class TableEncoder:
    """A text encoder whose vector of a text is looked up in a table (the text is an id of the store)."""

    def __init__(self, name: str, table: dict[str, np.ndarray]) -> None:
        self.name, self.table, self.sha256 = name, table, ""  # no weights' hash: never cached
        self.dim = len(next(iter(table.values())))
        self.calls: list[int] = []

    def encode(self, texts, *, batch_size: int = 64, progress=None) -> np.ndarray:
        self.calls.append(len(texts))
        return np.stack([self.table[t] for t in texts]).astype(np.float32)

    def close(self) -> None:
        pass


def judgements(seed: int = 8) -> dict[str, dict[str, int]]:
    """Graded qrels 1..3, every query judged: one to three of its 20 nearest documents by the old model, and up to
    three others (so the old model scores well and a drifted one less)."""
    e = embeddings()
    g_ids, q_ids = ids_for(e, text=True)
    rng = np.random.default_rng(seed)
    near = np.argsort(-(e["old_queries"] @ e["old_gallery"].T), axis=1)[:, :20]
    return {str(q): {str(g_ids[j]): int(rng.integers(1, 4))
                     for j in (*rng.choice(near[i], rng.integers(1, 4), replace=False),
                               *rng.choice(len(g_ids), rng.integers(0, 4), replace=False))}
            for i, q in enumerate(q_ids)}


def write_folder(folder, qrels, *, trec: bool = False, titles: bool = False):
    g_ids, q_ids = ids_for(None, text=True)
    (folder / "qrels").mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w") as f:
        for g in g_ids:
            f.write(json.dumps({"_id": str(g), "text": str(g), **({"title": f"title of {g}"} if titles else {})}) + "\n")
    with open(folder / "queries.jsonl", "w") as f:
        for q in q_ids:
            f.write(json.dumps({"id": str(q), "text": str(q)}) + "\n")  # MTEB v2's "id" as well as BEIR's "_id"
    rows = [f"{q} 0 {d} {g}" if trec else f"{q}\t{d}\t{g}" for q, docs in qrels.items() for d, g in docs.items()]
    (folder / "qrels" / "test.tsv").write_text("\n".join(rows if trec else ["query-id\tcorpus-id\tscore", *rows]) + "\n")
    return folder


def encoders(e) -> tuple[TableEncoder, TableEncoder]:
    g_ids, q_ids = ids_for(e, text=True)
    return tuple(TableEncoder(side, {**dict(zip(g_ids, e[f"{side}_gallery"])), **dict(zip(q_ids, e[f"{side}_queries"]))})
                 for side in ("old", "new"))


def pytrec_means(queries: np.ndarray, docs: np.ndarray, qrels) -> dict[str, float]:
    """pytrec_eval on the full float64 cosine ranking of every query (independent of MTEB's search)."""
    g_ids, q_ids = ids_for(None, text=True)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    scores = unit(queries.astype(np.float64)) @ unit(docs.astype(np.float64)).T
    top = -np.sort(-scores, axis=1)[:, :11]  # the @10 measures read the top 10 and where the 11th falls
    assert (-np.diff(top, axis=1) > 2e-6).all(), "a near-tie: float32 and float64 could rank differently"
    run = {str(q): {str(g): float(s) for g, s in zip(g_ids, row)} for q, row in zip(q_ids, scores)}
    got = pytrec_eval.RelevanceEvaluator(qrels, set(MEASURES.values())).evaluate(run)
    return {mteb_key: float(np.mean([v[trec] for v in got.values()])) for mteb_key, trec in MEASURES.items()}


def test_mteb_scores_each_cell_as_pytrec_eval_does_on_the_same_vectors(tmp_path):
    e, qrels = embeddings(), judgements()
    task = local_retrieval_task(read_retrieval_folder(write_folder(tmp_path / "task", qrels)))
    old, new = encoders(e)
    result = mteb_cross_tests(task, [old, new], ["old", "new"])
    C = result.matrix("nDCG@10")
    assert C[1, 0] == result.scores[1][0]["ndcg_at_10"] and np.isnan(C[0, 1])
    assert result.scores[0][1] is None  # above the diagonal: not run
    for (t, k), (q_side, d_side) in {(0, 0): ("old", "old"), (1, 0): ("new", "old"), (1, 1): ("new", "new")}.items():
        want = pytrec_means(e[f"{q_side}_queries"], e[f"{d_side}_gallery"], qrels)
        for key, value in want.items():
            assert result.scores[t][k][key] == pytest.approx(value, abs=MTEB_TOL), (q_side, d_side, key)
    # each side went to its model: old embedded the queries of old->old and the corpus of old->old and new->old
    assert sorted(old.calls) == [NQ, NG, NG] and sorted(new.calls) == [NQ, NQ, NG]
    assert C[1, 0] < C[0, 0] - 0.05  # the drifted model's queries lose on the old corpus
    assert result.summary("ndcg_cut_10")["AC"] == float(C[1, 0] > C[0, 0])


def test_mteb_and_check_upgrade_give_the_same_cells_on_one_store(tmp_path):
    """The product's own nDCG@10 / P@10 / mAP@10 of each cell (check-upgrade on the store) equal MTEB's."""
    e, qrels = embeddings(), judgements()
    specs = write_all("parquet", tmp_path / "s", tables(e, text=True))
    folder = write_folder(tmp_path / "task", qrels)
    assert main(["check-upgrade", "--old-gallery", specs.old_gallery, "--new-gallery", specs.new_gallery,
                 "--old-queries", specs.old_queries, "--new-queries", specs.new_queries,
                 "--qrels", str(folder / "qrels" / "test.tsv"), "--k", "10", "--resamples", "20",
                 "--json", str(tmp_path / "c.json")]) in (0, 1, 3)
    means = json.loads((tmp_path / "c.json").read_text())["means"]
    result = mteb_cross_tests(local_retrieval_task(read_retrieval_folder(folder)), list(encoders(e)), ["old", "new"])
    for (t, k), cell in {(0, 0): "old/old", (1, 0): "new/old", (1, 1): "new/new"}.items():
        for ours, theirs in (("ndcg@10", "ndcg_at_10"), ("precision@10", "precision_at_10"), ("map@10", "map_at_10")):
            assert means[cell][ours] == pytest.approx(result.scores[t][k][theirs], abs=MTEB_TOL), (cell, ours)


def test_trec_and_beir_qrels_of_one_task_read_the_same(tmp_path):
    qrels = judgements()
    beir = read_retrieval_folder(write_folder(tmp_path / "beir", qrels, titles=True))
    trec = read_retrieval_folder(write_folder(tmp_path / "trec", qrels, trec=True))
    assert beir.qrels == trec.qrels == qrels
    assert beir.query_ids == trec.query_ids and beir.corpus_texts == trec.corpus_texts
    assert beir.corpus_titles[0] == f"title of {beir.corpus_ids[0]}" and not any(trec.corpus_titles)


def test_queries_without_a_judgement_are_left_out_as_mteb_does(tmp_path):
    qrels = judgements()
    dropped = sorted(qrels)[:5]
    data = read_retrieval_folder(write_folder(tmp_path / "t", {q: d for q, d in qrels.items() if q not in dropped}))
    assert len(data.query_ids) == NQ - 5 and not set(dropped) & set(data.query_ids)


@pytest.mark.parametrize("break_it, message", [
    (lambda f: f.joinpath("corpus.jsonl").write_text('{"_id": "a", "text": "x"}\n{"_id": "b", "text": \n'),
     "corpus.jsonl:2: not a JSON object"),
    (lambda f: f.joinpath("corpus.jsonl").write_text('{"_id": "a", "text": "x"}\n{"_id": "a", "text": "y"}\n'),
     "corpus.jsonl:2: the id 'a' is given twice"),
    (lambda f: f.joinpath("queries.jsonl").write_text('{"_id": "q/0", "body": "x"}\n'),
     'queries.jsonl:1: a row is a JSON object with "_id" and "text"'),
    (lambda f: f.joinpath("qrels", "test.tsv").write_text("query-id\tcorpus-id\tscore\nq/0\tdoc-0000\t1.5\n"),
     "a grade is not a whole number"),
    (lambda f: f.joinpath("qrels", "test.tsv").write_text("query-id\tcorpus-id\tscore\nq/0\tdoc-9999\t1\n"),
     "judges the document 'doc-9999', which the folder does not hold"),
    (lambda f: f.joinpath("qrels", "test.tsv").write_text("query-id\tcorpus-id\tscore\nq/0\tdoc-0000\tmany\n"),
     "test.tsv:2: a grade is not a number"),
    (lambda f: f.joinpath("qrels", "test.tsv").rename(f / "qrels" / "dev.tsv"), "has no qrels/test.tsv (splits there: dev)"),
    (lambda f: f.joinpath("queries.jsonl").unlink(), "queries.jsonl cannot be read: no such file"),
])
def test_a_bad_task_folder_is_one_line(tmp_path, break_it, message):
    folder = write_folder(tmp_path / "t", judgements())
    break_it(folder)
    with pytest.raises(SourceError) as info:
        read_retrieval_folder(folder)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_split_is_a_plain_name_and_the_folder_in_the_roots(tmp_path):
    folder = write_folder(tmp_path / "t", judgements())
    with pytest.raises(SourceError, match="a split is a plain name"):
        read_retrieval_folder(folder, split="../t")
    with pytest.raises(SourceError, match="outside the data roots"):
        read_retrieval_folder("/usr/share")


def test_the_encoder_refuses_two_spaces_and_an_unsided_task():
    e = embeddings()
    old, _ = encoders(e)
    wide = TableEncoder("wide", {"x": np.ones(old.dim + 1)})
    with pytest.raises(ValueError, match=r"old gives 12-d vectors and wide 13-d: a cross-test searches one space"):
        CrossTestEncoder(old, wide)
    meta = type("Meta", (), {"name": "SomeSTS", "type": "STS"})()  # what MTEB passes: a task's name and type
    with pytest.raises(ValueError, match="without saying queries or documents"):
        CrossTestEncoder(old, old).encode([{"text": ["a"]}], task_metadata=meta, hf_split="test", hf_subset="default",
                                          prompt_type=None)


def test_metric_names_map_to_mteb_keys():
    for name in ("nDCG@10", "ndcg_cut_10", "ndcg_at_10", "NDCG@10"):
        assert mteb_score_key(name) == "ndcg_at_10"
    assert mteb_score_key("recall_100") == "recall_at_100" and mteb_score_key("RR@10") == "mrr_at_10"
    for bad in ("ndcg@7", "map", "map_capped@10", "neighbour_recall@10"):
        with pytest.raises(ValueError, match="MTEB reports"):
            mteb_score_key(bad)


def test_the_cli_refuses_bad_requests_in_one_line(tmp_path, capsys):
    folder = write_folder(tmp_path / "t", judgements())
    for args, message in ((["--model", "pretrained:minilm_l3"], "give at least two --model"),
                          (["--model", "pretrained:minilm_l3", "--model", "pretrained:minilm_l6", "--metric", "map"],
                           "MTEB reports"),
                          (["--model", "pretrained:efficientnet_lite0", "--model", "pretrained:minilm_l6"],
                           "is not a text encoder")):
        assert main(["mteb", str(folder), *args]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and err.count("\n") == 0, (args, err)


@pytest.mark.slow
def test_the_docs_mteb_example_runs_as_written(tmp_path):
    """docs/reference.md's MTEB example (real MiniLM L3 -> L6 on a WordNet task, a Procrustes adapter) runs as written
    and prints what the page says; its new->old and adapted->old cells equal pytrec_eval on the same models' vectors
    (to 1e-3: MiniLM's float32 cosines may hold near-ties that float64 orders the other way)."""
    if why := needs_text_models():
        pytest.skip(why)
    page = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    script = re.search(r"<!-- example: mteb -->\n```bash\n(.*?)```", page, re.DOTALL).group(1)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "COMPATLAB_DATA_ROOTS": str(tmp_path), "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "minilm_l6 → minilm_l3: ndcg_at_10" in out.stdout and "AC=" in out.stdout, out.stdout
    report = json.loads((tmp_path / "data" / "mteb.json").read_text())
    C = np.array(report["matrix"], dtype=float)
    assert C[1, 0] < C[0, 0] < C[1, 1]  # the page's reading: L6 alone best, its queries on L3's corpus worst
    adapted = report["adapter"]["scores"]["ndcg_at_10"]
    assert C[1, 0] < adapted < C[0, 0] and "minilm_l6 adapted → minilm_l3 (procrustes adapter)" in out.stdout
    from engine.adapters.artifact import load_adapter
    from engine.models.text_models import load_text_model

    data = read_retrieval_folder(tmp_path / "data" / "wordnet-task")
    l3, l6 = load_text_model("minilm_l3", device="cpu"), load_text_model("minilm_l6", device="cpu")
    q, d = l6.encode(data.query_texts), l3.encode(data.corpus_texts)
    mapped = load_adapter(tmp_path / "data" / "adapter").apply(q)
    for queries, value in ((q, C[1, 0]), (mapped, adapted)):
        x, y = queries.astype(np.float64), d.astype(np.float64)
        scores = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (y / np.linalg.norm(y, axis=1, keepdims=True)).T
        run = {qid: dict(zip(data.corpus_ids, map(float, row))) for qid, row in zip(data.query_ids, scores)}
        got = pytrec_eval.RelevanceEvaluator(data.qrels, {"ndcg_cut_10"}).evaluate(run)
        assert value == pytest.approx(np.mean([v["ndcg_cut_10"] for v in got.values()]), abs=1e-3)


def test_the_cli_scores_two_text_folders_and_writes_the_matrix(tmp_path, capsys):
    """``python -m engine mteb`` with two of the user's own text encoders (``PATH:text``; tiny BERTs, mean and CLS
    pooled): the printed matrix and ECC lines, and the JSON's matrix read off its per-cell scores."""
    from support.text_encoders import write_tiny_folder

    write_tiny_folder(tmp_path / "mean", pooling="mean")
    write_tiny_folder(tmp_path / "cls", pooling="cls")
    words = ["the", "cat", "sat", "on", "mat", "dog"]
    rng = np.random.default_rng(0)
    docs = {f"d{i}": " ".join(rng.choice(words, 4)) for i in range(40)}
    (tmp_path / "t" / "qrels").mkdir(parents=True)
    (tmp_path / "t" / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "text": t}) + "\n" for d, t in docs.items()))
    (tmp_path / "t" / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": docs[f"d{i}"][:7]}) + "\n"
                                                          for i in range(10)))
    (tmp_path / "t" / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                                      + "".join(f"q{i}\td{i}\t1\n" for i in range(10)))
    args = ["mteb", str(tmp_path / "t"), "--model", f"{tmp_path / 'mean'}:text", "--model", f"{tmp_path / 'cls'}:text",
            "--metric", "recall_at_10", "--no-cache", "--json", str(tmp_path / "m.json")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "recall_at_10: rows query model, columns corpus model" in out and "cls → mean: recall_at_10" in out
    report = json.loads((tmp_path / "m.json").read_text())
    assert report["labels"] == ["mean", "cls"] and report["matrix"][0][1] is None
    assert report["matrix"][1][0] == report["scores"][1][0]["recall_at_10"]
    assert 0 <= report["summary"]["AC"] <= 1
    assert main([*args[:2], "--model", args[3], "--model", args[5], "--model", args[3], "--adapter",
                 str(tmp_path)]) == 2
    assert "give exactly two --model" in capsys.readouterr().err


def write_hub_snapshot(folder, qrels, *, splits=("test",), titles: bool = False):
    """The same task as :func:`write_folder` laid out as a local snapshot of an MTEB v2 hub dataset (three Parquet
    configs: corpus/, queries/, data/ for the qrels), a shard per config."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    g_ids, q_ids = ids_for(None, text=True)
    for name in ("corpus", "queries", "data"):
        (folder / name).mkdir(parents=True)
    corpus = {"_id": [str(g) for g in g_ids], "text": [str(g) for g in g_ids],
              **({"title": [f"title of {g}" for g in g_ids]} if titles else {})}
    pq.write_table(pa.table(corpus), folder / "corpus" / "corpus-00000-of-00001.parquet",
                   row_group_size=50)  # several row groups: read a batch at a time
    pq.write_table(pa.table({"id": [str(q) for q in q_ids], "text": [str(q) for q in q_ids]}),
                   folder / "queries" / "queries-00000-of-00001.parquet")
    rows = [(q, d, g) for q, docs in qrels.items() for d, g in docs.items()]
    for split in splits:
        pq.write_table(pa.table({"query-id": [r[0] for r in rows], "corpus-id": [r[1] for r in rows],
                                 "score": pa.array([r[2] for r in rows], pa.int64())}),
                       folder / "data" / f"{split}-00000-of-00001.parquet")
    return folder


def test_a_hub_snapshot_reads_as_the_same_task_as_its_beir_folder(tmp_path):
    qrels = judgements()
    beir = read_retrieval_folder(write_folder(tmp_path / "beir", qrels, titles=True))
    hub = read_retrieval_folder(write_hub_snapshot(tmp_path / "hub", qrels, splits=("dev", "test"), titles=True))
    for field in ("corpus_ids", "corpus_titles", "corpus_texts", "query_ids", "query_texts", "qrels"):
        assert getattr(hub, field) == getattr(beir, field), field
    old, new = encoders(embeddings())  # the table encoders know the bare texts: no titles for MTEB to prepend
    scores = [mteb_cross_tests(local_retrieval_task(read_retrieval_folder(folder)), [old, new], ["old", "new"])
              .scores[1][0]["ndcg_at_10"] for folder in (write_hub_snapshot(tmp_path / "h2", qrels),
                                                         write_folder(tmp_path / "b2", qrels))]
    assert scores[0] == scores[1]  # one task, two layouts, one number


def test_a_bad_hub_snapshot_is_one_line(tmp_path):
    folder = write_hub_snapshot(tmp_path / "h", judgements(), splits=("dev",))
    with pytest.raises(SourceError, match=r"has no qrels for split test in data/, qrels/, default/ \(splits there: dev\)"):
        read_retrieval_folder(folder)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"_id": ["q/0"], "body": ["x"]}), folder / "queries" / "queries-00000-of-00001.parquet")
    with pytest.raises(SourceError, match=r"queries-00000-of-00001.parquet has no '_id' or 'text' column"):
        read_retrieval_folder(folder, split="dev")
    (folder / "queries" / "queries-00000-of-00001.parquet").write_text("not parquet")
    with pytest.raises(SourceError, match="queries-00000-of-00001.parquet cannot be read") as info:
        read_retrieval_folder(folder, split="dev")
    assert "\n" not in str(info.value)


def test_an_adapter_of_another_model_is_refused_before_any_embedding(tmp_path, capsys, monkeypatch):
    """``mteb --adapter``: an adapter whose recorded input model (weights' hash) is not the new model is one line,
    exit 2, and MTEB never runs (the check comes before the matrix)."""
    from engine.adapters.artifact import save_adapter
    from engine.adapters.posthoc import fit_map
    from engine.checkpoints import mteb_bridge
    from engine.core.fingerprint import Fingerprint
    from support.text_encoders import write_tiny_folder

    write_tiny_folder(tmp_path / "mean", pooling="mean")
    write_tiny_folder(tmp_path / "cls", pooling="cls")
    rng = np.random.default_rng(1)
    m = fit_map("procrustes", rng.normal(size=(40, 8)), rng.normal(size=(40, 8)))
    save_adapter(m, tmp_path / "a", onnx=False, fingerprints={"input": Fingerprint(8, sha256="0" * 64),
                                                              "output": Fingerprint(8)})
    folder = write_folder(tmp_path / "t", judgements())
    monkeypatch.setattr(mteb_bridge, "mteb_cross_tests", lambda *a, **k: pytest.fail("MTEB ran before the check"))
    assert main(["mteb", str(folder), "--model", f"{tmp_path / 'mean'}:text", "--model", f"{tmp_path / 'cls'}:text",
                 "--adapter", str(tmp_path / "a"), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cls is not the model the adapter in" in err and "\n" not in err, err
