"""Equal numbers with the IR toolchain: every metric a cell prints equals pytrec_eval's (trec_eval 9's code) and
ranx's on the TREC run and qrels files the check writes, to 1e-9, query by query where the tool gives them.

pytrec-eval-terrier 0.5.11 and ranx 0.3.21 are pinned in requirements-ir.txt (docs/setup.md)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from engine.cli import main
from engine.core.kinds import metric_parts
from engine.metrics.relevance import qrels_outcomes
from engine.metrics.topk import array_blocks, stream_topk
from engine.results.trec import qrels_text, run_text, tied_queries, write_trec
from support.upgrade_sources import NQ, embeddings, ids_for, tables, write_all

pytrec_eval = pytest.importorskip("pytrec_eval")
ranx = pytest.importorskip("ranx")

TOL = 1e-9
KS = (1, 3, 5, 10)
# the tools' measure -> the product's outcome key, through the one metric grammar (engine.core.kinds.metric_parts)
TREC_MEASURES = {"ndcg_cut": KS, "P": KS, "recall": KS, "map_cut": KS, "recip_rank": None}
RANX_MEASURES = [f"{m}@{k}" for m in ("ndcg", "precision", "recall", "map", "mrr") for k in KS]


def product_key(tool_name: str, depth: int) -> str:
    """``ndcg_cut_10`` / ``nDCG@10`` -> ``ndcg@10``; ``recip_rank`` -> ``mrr@depth`` (the run holds depth items)."""
    kind, k = metric_parts(tool_name)
    return f"{kind}@{depth if k is None else k}"


def trec_evaluate(qrels_file, run_file) -> dict[str, dict[str, float]]:
    with open(qrels_file) as f:
        qrels = pytrec_eval.parse_qrel(f)
    with open(run_file) as f:
        run = pytrec_eval.parse_run(f)
    measures = {m if ks is None else f"{m}.{','.join(map(str, ks))}" for m, ks in TREC_MEASURES.items()}
    return pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)


def ranx_evaluate(qrels_file, run_file, measures: list[str]) -> dict[str, float]:
    """ranx's means over the queries the qrels judge (``make_comparable``: the run's other queries left out)."""
    return ranx.evaluate(ranx.Qrels.from_file(str(qrels_file), kind="trec"), ranx.Run.from_file(str(run_file), kind="trec"),
                         measures, make_comparable=True)


def graded_case(seed: int = 4, n_q: int = 40, n_g: int = 300, depth: int = 12):
    """Random embeddings (no two scores tie) and graded judgements 1..3, some relevant items beyond the lists,
    one query without any relevant item (undefined in the product, absent from the written qrels)."""
    rng = np.random.default_rng(seed)
    q, g = rng.normal(size=(n_q, 16)).astype(np.float32), rng.normal(size=(n_g, 16)).astype(np.float32)
    gallery_ids = np.array([f"D{i:05d}" for i in rng.permutation(n_g)])
    query_ids = [f"q.{i}" for i in range(n_q)]
    top = stream_topk(q, array_blocks(np.arange(n_g), g, 64), k=depth)
    judged = {}
    for i, qid in enumerate(query_ids[1:], 1):
        listed = rng.choice(top.ids[i], size=int(rng.integers(0, 5)), replace=False)
        beyond = rng.choice(n_g, size=int(rng.integers(1, 6)), replace=False)
        judged[qid] = {int(j): int(rng.integers(1, 4)) for j in (*listed, *beyond)}
    judged[query_ids[0]] = {int(top.ids[0, 0]): 0}  # judged, none relevant
    return query_ids, gallery_ids, top, judged


def test_qrels_outcomes_equal_pytrec_eval_and_ranx_query_by_query(tmp_path):
    query_ids, gallery_ids, top, judged = graded_case()
    assert (np.diff(top.scores, axis=1) < 0).all()  # no ties: every tool reads the same order
    got = qrels_outcomes(top, query_ids, judged, np.arange(len(gallery_ids)), ks=(*KS, top.k))
    runs = {"new->old": run_text(query_ids, gallery_ids[top.ids], top.scores, "new->old")}
    by_id = {q: {gallery_ids[j]: g for j, g in items.items()} for q, items in judged.items()}
    paths = write_trec(tmp_path, runs, qrels_text(by_id))
    tool = trec_evaluate(paths[-1], paths[0])
    assert set(tool) == set(query_ids[1:])  # the query without a relevant item is left out, as the product does
    assert np.isnan([v[0] for v in got.values.values()]).all()
    for i, qid in enumerate(query_ids[1:], 1):
        for measure, value in tool[qid].items():
            assert got.values[product_key(measure, top.k)][i] == pytest.approx(value, abs=TOL), (qid, measure)
    means = ranx_evaluate(paths[-1], paths[0], RANX_MEASURES)
    for measure, value in means.items():
        assert got.means()[product_key(measure, top.k)] == pytest.approx(value, abs=TOL), measure


def tool_means(folder, cell: str, depth: int) -> dict[str, float]:
    """pytrec_eval's mean of each measure over the written run's queries, keyed as the product keys it."""
    per_query = trec_evaluate(folder / "qrels.txt", folder / f"{cell}.run")
    names = next(iter(per_query.values()))
    return {product_key(m, depth): float(np.mean([v[m] for v in per_query.values()])) for m in names}


@pytest.mark.parametrize("relevance", ["qrels", "labels"])
def test_check_upgrade_exports_trec_files_that_recompute_every_printed_number(tmp_path, relevance):
    """check-upgrade --export trec DIR: pytrec_eval and ranx on each written run file give every metric of that
    cell's printed means (labels: Recall@k is the hit rate, trec_eval's success_k; the others as with qrels)."""
    e = embeddings()
    specs = write_all("npz", tmp_path / "s", tables(e, text=True))
    g_ids, q_ids = ids_for(e, text=True)
    rng = np.random.default_rng(8)
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q_ids[i]}\t{g_ids[j]}\t{int(rng.integers(1, 4))}"
                                              for i in range(1, NQ) for j in rng.choice(len(g_ids), 6, replace=False)]
    (tmp_path / "s" / "qrels.tsv").write_text("\n".join(lines) + "\n")
    qrels = ["--qrels", str(tmp_path / "s" / "qrels.tsv")] if relevance == "qrels" else ["--relevance", "labels"]
    out = tmp_path / "trec"
    args = ["check-upgrade", "--old-gallery", specs.old_gallery, "--new-gallery", specs.new_gallery, "--old-queries",
            specs.old_queries, "--new-queries", specs.new_queries, *qrels, "--resamples", "50", "--k", "10",
            "--json", str(tmp_path / "c.json"), "--export", "trec", str(out), "--plan", str(tmp_path / "plan")]
    assert main(args) in (0, 1, 3)
    data = json.loads((tmp_path / "c.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["adapted_affine_old.run", "adapted_procrustes_old.run",
                                                     "new_new.run", "new_old.run", "old_old.run", "qrels.txt"]
    for row in json.loads((tmp_path / "plan.json").read_text())["adapters"]:  # adapted->old under the check's metric
        tool = tool_means(out, f"adapted_{row['name']}_old", 10)
        assert row["adapted_old"] == pytest.approx(tool[data["metric"]], abs=TOL), row["name"]
    for cell, name in (("old_old", "old/old"), ("new_old", "new/old"), ("new_new", "new/new")):
        printed, tool = data["means"][name], tool_means(out, cell, 10)
        if relevance == "labels":  # the hit rate: trec_eval's success_10, not its recall_10
            success = trec_success(out, cell)
            assert printed["recall@10"] == pytest.approx(success, abs=TOL)
            tool.pop("recall@10")
        compared = [key for key in printed if key in tool]
        assert len(compared) >= 4, compared
        for key in compared:
            assert printed[key] == pytest.approx(tool[key], abs=TOL), (cell, key)
        ranx_means = ranx_evaluate(out / "qrels.txt", out / f"{cell}.run", ["ndcg@10", "precision@10", "map@10", "mrr@10"])
        for measure, value in ranx_means.items():
            assert printed[measure] == pytest.approx(value, abs=TOL), (cell, measure)
    assert data["metric"] == ("ndcg@10" if relevance == "qrels" else "map@10")
    assert ("nDCG@10 with linear gains" if relevance == "qrels" else "mAP@10 = AP over R") in data["convention"]
    assert "rank ties: a non-relevant item first (the default; trec: by doc id, descending)" in data["convention"]


def test_a_bad_export_is_one_line_and_exit_2(tmp_path, capsys):
    e = embeddings()
    specs = write_all("npz", tmp_path / "s", tables(e, text=True))
    sources = ["--old-gallery", specs.old_gallery, "--old-queries", specs.old_queries, "--new-queries",
               specs.new_queries, "--resamples", "20"]
    (tmp_path / "file").write_text("")
    for args, message in (([*sources, "--export", "csv", str(tmp_path / "x")], "check-upgrade writes trec"),
                          (["--features", str(tmp_path), "--export", "trec", str(tmp_path / "x")], "goes with --old-gallery"),
                          ([*sources, "--export", "trec", str(tmp_path / "file")], "not a folder"),
                          (["--features", str(tmp_path), "--rank-ties", "trec"], "--rank-ties go(es) with --old-gallery")):
        assert main(["check-upgrade", *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, (args, err)
    assert not (tmp_path / "x").exists()


def trec_success(folder, cell: str) -> float:
    with open(folder / "qrels.txt") as f:
        qrels = pytrec_eval.parse_qrel(f)
    with open(folder / f"{cell}.run") as f:
        run = pytrec_eval.parse_run(f)
    got = pytrec_eval.RelevanceEvaluator(qrels, {"success.10"}).evaluate(run)
    return float(np.mean([v["success_10"] for v in got.values()]))


def test_the_metric_names_of_the_toolchain_are_one_grammar():
    for names, want in ((("ndcg_cut_10", "nDCG@10", "ndcg@10", "NDCG_CUT.10", "ndcg_at_10"), ("ndcg", 10)),
                        (("recall_100", "recall@100", "R@100", "recall_at_100"), ("recall", 100)),
                        (("P_10", "P@10", "precision@10", "p.10", "precision_at_10"), ("precision", 10)),
                        (("map_cut_10", "map@10", "AP@10", "map_at_10"), ("map", 10)), (("map", "AP"), ("map", None)),
                        (("recip_rank", "RR", "mrr"), ("mrr", None)), (("mrr@10", "RR@10", "mrr_at_10"), ("mrr", 10)),
                        (("map_capped@10",), ("map_capped", 10))):
        for name in names:
            assert metric_parts(name) == want, name
    for bad in ("ndcg_cut_0", "P", "bogus_10", "success_10", "map@10@2"):
        assert metric_parts(bad) is None or bad == "P", bad
    assert metric_parts("P") is None or metric_parts("P") == ("precision", None)


def test_a_check_reads_the_toolchain_spellings_and_prints_one(tmp_path):
    e = embeddings()
    specs = write_all("npz", tmp_path / "s", tables(e, text=True))
    from support.upgrade_sources import run

    got = {name: run(replace(specs), relevance="labels", metric=name).report for name in ("map_cut_10", "AP@10")}
    assert {r.metric for r in got.values()} == {"map@10"}
    assert got["map_cut_10"].old_old == pytest.approx(got["AP@10"].old_old, abs=0)


def exact_units(rng: np.random.Generator, n: int, d: int = 16) -> np.ndarray:
    """Unit rows with four entries of +/-0.5: every cosine is an exact multiple of 1/4, so ties are many and exact."""
    x = np.zeros((n, d), np.float32)
    for i in range(n):
        x[i, rng.choice(d, 4, replace=False)] = rng.choice([-0.5, 0.5], 4)
    return x


def test_rank_ties_trec_gives_trec_evals_numbers_on_tied_lists(tmp_path, capsys):
    """Exactly tied scores: under --rank-ties trec every printed metric equals pytrec_eval's on the written run files
    (trec_eval orders equal scores by doc id, descending); under the default pessimistic rule they differ, and the
    export says so."""
    from support.upgrade_sources import write

    rng = np.random.default_rng(2)
    n_g, n_q = 200, 30
    g_ids = np.array([f"d{i:03d}" for i in rng.permutation(n_g)])
    q_ids = np.array([f"q{i}" for i in range(n_q)])
    folder = tmp_path / "s"
    folder.mkdir()
    old_g, new_g, old_q, new_q = (exact_units(rng, n) for n in (n_g, n_g, n_q, n_q))
    lab_g, lab_q = rng.integers(0, 3, n_g), rng.integers(0, 3, n_q)
    sides = {"old_gallery": (g_ids, old_g, lab_g), "new_gallery": (g_ids, new_g, lab_g),
             "old_queries": (q_ids, old_q, lab_q), "new_queries": (q_ids, new_q, lab_q)}
    src = {side: write("npz", folder, side, table) for side, table in sides.items()}
    (folder / "qrels.txt").write_text("".join(f"{q} 0 {d} {int(rng.integers(1, 3))}\n" for q in q_ids
                                              for d in rng.choice(g_ids, 8, replace=False)))
    base = ["check-upgrade", *[a for side, text in src.items() for a in (f"--{side.replace('_', '-')}", text)],
            "--qrels", str(folder / "qrels.txt"), "--resamples", "20", "--k", "10"]
    printed = {}
    for rule in ("trec", "pessimistic"):
        out = tmp_path / rule
        assert main([*base, "--rank-ties", rule, "--export", "trec", str(out), "--json", str(tmp_path / f"{rule}.json")]) in (0, 1, 3)
        data = json.loads((tmp_path / f"{rule}.json").read_text())
        assert data["rank_ties"] == rule and "rank ties:" in data["convention"]
        printed[rule] = data["means"]
    assert "TREC tools order those by doc id" in capsys.readouterr().out  # said once, for the pessimistic export
    differ = 0
    for cell, name in (("old_old", "old/old"), ("new_old", "new/old"), ("new_new", "new/new")):
        tool = tool_means(tmp_path / "trec", cell, 10)
        scores = [float(x.split()[4]) for x in (tmp_path / "trec" / f"{cell}.run").read_text().splitlines()]
        assert tied_queries(np.reshape(scores, (n_q, 10))) > n_q // 2  # the lists really hold ties
        for key in ("recall@10", "precision@10", "map@10", "mrr@10", "ndcg@10"):
            assert printed["trec"][name][key] == pytest.approx(tool[key], abs=TOL), (cell, key)
            differ += abs(printed["pessimistic"][name][key] - tool[key]) > 1e-6
    assert differ > 0


def test_compare_checkpoints_exports_trec_files_that_recompute_every_matrix_cell(tmp_path):
    """compare-checkpoints --export trec DIR: for every view and computed cell whose ranking holds no tied scores,
    pytrec_eval on the written full ranking and label qrels gives the printed Recall@1 (trec_eval's success_1), mAP
    (map) and mAP@5 (map_cut_5, over R = 7 relevant items, not min(R, 5))."""
    from support.checkpoints_factory import save_state_dict_pt, save_step_checkpoint, write_image_folder

    images = write_image_folder(tmp_path / "imgs", classes=4, per_class=8)  # R = 7 > 5: mAP@5 over R, not min(R, 5)
    save_state_dict_pt(tmp_path / "old.pt", num_classes=4, width=16)
    save_step_checkpoint(tmp_path / "new.safetensors", num_classes=4, width=16, seed=1)
    out, js = tmp_path / "trec", tmp_path / "c.json"
    assert main(["compare-checkpoints", "--model", f"{tmp_path / 'old.pt'}:small_cnn:4", "--model",
                 str(tmp_path / "new.safetensors"), "--dataset", f"imagefolder:{images}", "--input-size", "16",
                 "--metric", "recall@1", "--metric", "map", "--metric", "map_cut_5", "--no-store", "--json", str(js),
                 "--export", "trec", str(out)]) == 0
    data = json.loads(js.read_text())
    checked = tied = 0
    for view, got in data["views"].items():
        for t in range(2):
            for k in range(t + 1):
                if not got["comparable"][t][k]:
                    continue
                with open(out / f"{view}_M{t + 1}_M{k + 1}.qrels") as f:
                    qrels = pytrec_eval.parse_qrel(f)
                with open(out / f"{view}_M{t + 1}_M{k + 1}.run") as f:
                    run = pytrec_eval.parse_run(f)
                if any(len(set(r.values())) < len(r) for r in run.values()):
                    tied += 1  # the full ranking's AP ranks tied items together (scikit-learn's), trec_eval by doc id
                    continue
                tool = pytrec_eval.RelevanceEvaluator(qrels, {"success.1", "map", "map_cut.5"}).evaluate(run)
                for printed, measure in (("recall@1", "success_1"), ("map", "map"), ("map@5", "map_cut_5")):
                    want = float(np.mean([v[measure] for v in tool.values()]))
                    assert got["metrics"][printed]["matrix"][t][k] == pytest.approx(want, abs=TOL), (view, t, k, printed)
                    checked += 1
    assert checked >= 6 and tied <= 3, (checked, tied)


def test_a_checkpoint_cells_run_file_is_the_same_whatever_the_query_block(monkeypatch):
    """compare-checkpoints' run files hold a block of queries' similarities at a time; blocks of 3 rows (a boundary
    inside the queries, the closed-set diagonal crossing it) write the same run and qrels as one block."""
    from engine.checkpoints import trec_export

    rng = np.random.default_rng(4)
    x, labels = rng.normal(size=(8, 5)), np.repeat(np.arange(4), 2)
    whole = trec_export.cell_texts(x, labels, x, labels, same_set=True, tag="t")
    monkeypatch.setattr(trec_export, "BLOCK_ROWS", 3)
    assert trec_export.cell_texts(x, labels, x, labels, same_set=True, tag="t") == whole
    assert "q7 Q0 g7" not in whole[0] and whole[0].count("\n") == 8 * 7  # each query's own row is left out


def test_an_export_folder_is_written_whole_or_left_as_it_was(tmp_path):
    """The TREC files are streamed chunk by chunk to temporary names and renamed only once all are written: a chunk
    that fails midway leaves the folder's earlier files as they were and no temporary file behind."""
    from engine.results.trec import write_files

    chunks = iter(["q1 Q0 d1 1 0.5 t\n", "q2 Q0 d1 1 0.4 t\n"])
    assert write_files(tmp_path / "out", {"a.run": chunks, "qrels.txt": "q1 0 d1 1\n"})
    assert (tmp_path / "out" / "a.run").read_text() == "q1 Q0 d1 1 0.5 t\nq2 Q0 d1 1 0.4 t\n"

    def failing():
        yield "q1 Q0 d9 1 0.9 t\n"
        raise ValueError("a query id holds whitespace")

    with pytest.raises(ValueError, match="whitespace"):
        write_files(tmp_path / "out", {"qrels.txt": "q1 0 d9 1\n", "a.run": failing()})
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.run", "qrels.txt"]
    assert (tmp_path / "out" / "qrels.txt").read_text() == "q1 0 d1 1\n"  # not replaced: the run failed


def test_both_commands_take_the_export_folder_from_one_check(tmp_path, tmp_path_factory, capsys):
    """``--export trec DIR`` of check-upgrade and compare-checkpoints: one function (engine.cli.options.trec_folder)
    refuses a folder outside the data roots and a path that is a file, in one line, before any work."""
    from engine.cli.options import trec_folder

    assert trec_folder(str(tmp_path / "new")) == (tmp_path / "new").resolve()  # need not exist yet
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="not a folder"):
        trec_folder(str(tmp_path / "file"))
    outside = tmp_path_factory.mktemp("elsewhere")
    with pytest.raises(ValueError, match="outside the data roots"):
        trec_folder(str(outside / "runs"))
    assert main(["compare-checkpoints", "--model", "pretrained:minilm_l3", "--dataset", "wordnet",
                 "--export", "trec", str(outside / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert "outside the data roots" in err and "\n" not in err and not list(outside.iterdir())
