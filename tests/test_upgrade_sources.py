"""``check-upgrade --old-gallery SRC ...`` (engine.upgrade.from_sources): the same verdict and numbers from the same
vectors in every store, each relevance kind against an independent brute-force computation, the --features verdict
on the same features, string ids in shuffled orders, and every bad input's one line (exit 2, nothing written)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import ndcg_score
from support.sources import fingerprint

from engine.cli import main
from engine.metrics.compatibility import CellFeatures
from engine.sources import SourceError
from engine.upgrade.from_sources import SourceSpecs
from engine.upgrade.verdict import check_upgrade
from support.upgrade_sources import D, K, NG, NQ, RESAMPLES, SIDES, embeddings, ids_for, run, tables, write, write_all













def write_qrels(path, q_ids, g_ids, e, *, seed: int = 5, skip_first: bool = False):
    """Graded judgements: for each query, a few gallery items of its class (grade 1..3) and one of another (grade 1)."""
    rng = np.random.default_rng(seed)
    lines = ["query-id\tcorpus-id\tscore"]
    for qi in range(1 if skip_first else 0, NQ):
        same = np.flatnonzero(e["g_labels"] == e["q_labels"][qi])
        other = np.flatnonzero(e["g_labels"] != e["q_labels"][qi])
        picked = list(rng.choice(same, size=min(4, len(same)), replace=False)) + [int(rng.choice(other))]
        for j in picked:
            lines.append(f"{q_ids[qi]}\t{g_ids[j]}\t{int(rng.integers(1, 4))}")
    path.write_text("\n".join(lines) + "\n")
    return path


def comparable(check) -> dict:
    """A check's JSON without the source texts (which name the files)."""
    data = check.to_json()
    data.pop("sources")
    return data




def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_topk(q, g, k):
    """Each query's k most cosine-similar gallery rows, by a full similarity matrix (independent of the engine)."""
    sims = unit(q.astype(np.float64)) @ unit(g.astype(np.float64)).T
    return np.argsort(-sims, axis=1, kind="stable")[:, :k], sims


# ---- the same numbers from every store ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def drift():
    return embeddings()


def checks(specs, qrels) -> dict[str, dict]:
    """The check of each relevance kind on one set of sources."""
    return {kind: comparable(run(replace(specs, qrels=qrels if kind == "qrels" else None), relevance=kind))
            for kind in ("labels", "qrels", "none")}


@pytest.mark.parametrize("kind", ["parquet", "lance", "qdrant", "sqlite", "postgresql"])
def test_every_store_gives_the_same_report(kind, drift, tmp_path, request):
    """Integer ids (Qdrant's point ids), every side shuffled its own way; the npz check is the reference."""
    if kind in ("lance", "qdrant"):
        pytest.importorskip("lancedb" if kind == "lance" else "qdrant_client")
    pg_url = request.getfixturevalue("pg_server").create_database() if kind == "postgresql" else None
    tabs = tables(drift)
    g_ids, q_ids = ids_for(drift, text=False)
    qrels = str(write_qrels(tmp_path / "qrels.tsv", q_ids, g_ids, drift))
    want = checks(write_all("npz", tmp_path / "npz", tabs), qrels)
    specs = write_all(kind, tmp_path / kind, tabs, pg_url=pg_url)
    before = fingerprint(tmp_path / kind) if kind != "postgresql" else None
    assert checks(specs, qrels) == want
    if before is not None:
        assert fingerprint(tmp_path / kind) == before  # nothing written to the user's store
    assert [want[r]["relevance"] for r in want] == ["labels", "qrels", "none"]
    assert want["labels"]["verdict"] != want["none"]["verdict"] or want["labels"]["old_old"] != want["none"]["old_old"]


# ---- each relevance kind against an independent computation -------------------------------------------------------

def test_labels_equal_the_features_check_on_the_same_vectors(tmp_path, drift):
    """String ids, every side shuffled: the --features verdict (interval over queries) to the last digit, and the
    two-way interval (queries and gallery items, walked on the streamed top-D lists) to a float tolerance."""
    specs = write_all("npz", tmp_path / "s", tables(drift, text=True))
    got = run(specs, relevance="labels", metric="recall@1", interval="queries").report
    old = CellFeatures(drift["old_queries"], drift["q_labels"], drift["old_gallery"], drift["g_labels"])
    new = CellFeatures(drift["new_queries"], drift["q_labels"], drift["new_gallery"], drift["g_labels"])
    want = check_upgrade(old, new, interval="queries", resamples=RESAMPLES)
    assert got.compatibility == want.compatibility and got.better == want.better
    g_ids, q_ids = ids_for(drift, text=True)  # the two-way draws follow the rows: each side in the features' order
    plain = write_all("npz", tmp_path / "p", {side: ((g_ids, drift[side], drift["g_labels"]) if "gallery" in side else
                                                     (q_ids, drift[side], drift["q_labels"])) for side in SIDES})
    two = run(plain, relevance="labels", metric="recall@1").report  # the default: two-way for recall@k with labels
    both = check_upgrade(old, new, resamples=RESAMPLES)
    assert two.interval == both.interval == "two-way" and two.compatibility.verdict == both.compatibility.verdict
    for a, b in ((two.compatibility, both.compatibility), (two.better, both.better)):
        assert (a.diff, a.lo, a.hi) == pytest.approx((b.diff, b.lo, b.hi), abs=1e-9)
    assert (both.compatibility.hi - both.compatibility.lo) > (want.compatibility.hi - want.compatibility.lo)
    assert (got.old_old, got.new_old, got.new_new) == (want.old_old, want.new_old, want.new_new)
    assert got.sentence().split(". ")[0] == want.sentence().split(". ")[0]
    # backfill: the adapter_residual order depends on the items only (not on their rows), so the curves agree exactly
    residual = check_upgrade(old, new, interval="queries", resamples=RESAMPLES, orderings=("adapter_residual",)).backfill
    assert [n for n in got.backfill if n.ordering == "adapter_residual"] == list(residual)
    # and by hand: Recall@1 = the nearest gallery item shares the query's label
    for q, g, value in (("old_queries", "old_gallery", got.old_old), ("new_queries", "old_gallery", got.new_old),
                        ("new_queries", "new_gallery", got.new_new)):
        top, _ = brute_topk(drift[q], drift[g], 1)
        assert value == pytest.approx(np.mean(drift["g_labels"][top[:, 0]] == drift["q_labels"]), abs=1e-12)


def test_qrels_metrics_equal_sklearn_and_hand_computed(tmp_path, drift):
    tabs = tables(drift, text=True)
    specs = write_all("npz", tmp_path / "s", tabs)
    g_ids, q_ids = ids_for(drift, text=True)
    qrels = write_qrels(tmp_path / "s" / "qrels.tsv", q_ids, g_ids, drift, skip_first=True)
    check = run(replace(specs, qrels=str(qrels)))  # --qrels implies relevance qrels
    assert check.relevance == "qrels" and check.report.metric == f"ndcg@{K}"
    assert check.report.n_no_positive == 1 and "1 query without a relevant item" in check.convention
    grades = np.zeros((NQ, NG))
    for line in qrels.read_text().splitlines()[1:]:
        q, g, s = line.split("\t")
        grades[int(q.split("/")[1]), int(g.split("-")[1])] = float(s)
    judged = grades.sum(1) > 0
    for cell, (q, g) in {"old/old": ("old_queries", "old_gallery"), "new/old": ("new_queries", "old_gallery"),
                         "new/new": ("new_queries", "new_gallery")}.items():
        top, sims = brute_topk(drift[q], drift[g], K)
        means = check.means[cell]
        assert means[f"ndcg@{K}"] == pytest.approx(ndcg_score(grades[judged], sims[judged], k=K), abs=1e-9)
        hits = np.take_along_axis(grades, top, 1)[judged] > 0
        n_rel = (grades[judged] > 0).sum(1)
        assert means[f"recall@{K}"] == pytest.approx(np.mean(hits.sum(1) / n_rel), abs=1e-12)
        ap = [sum(hits[i, :r + 1].sum() / (r + 1) for r in range(K) if hits[i, r]) / min(n_rel[i], K)
              for i in range(len(hits))]
        assert means[f"map@{K}"] == pytest.approx(np.mean(ap), abs=1e-12)
    assert check.report.old_old == check.means["old/old"][f"ndcg@{K}"]


def test_label_free_neighbour_recall_equals_numpy(tmp_path, drift):
    specs = write_all("npz", tmp_path / "s", tables(drift, text=True))
    check = run(specs, relevance="none", k=K)
    assert check.report.metric == f"neighbour_recall@{K}"
    assert check.report.better.verdict == "not judged" and "the new model's top-10" in check.convention
    ref, _ = brute_topk(drift["new_queries"], drift["new_gallery"], K)
    for cell, q in (("old/old", "old_queries"), ("new/old", "new_queries")):
        top, _ = brute_topk(drift[q], drift["old_gallery"], K)
        want = np.mean([len(set(a) & set(b)) / K for a, b in zip(top, ref)])
        assert check.means[cell][f"neighbour_recall@{K}"] == pytest.approx(want, abs=1e-12)
    assert check.report.old_old == check.means["old/old"][f"neighbour_recall@{K}"]


def test_a_rotated_copy_keeps_the_self_test_and_loses_the_cross_test(tmp_path):
    e = embeddings(new="rotation")
    specs = write_all("npz", tmp_path / "s", tables(e, text=True))
    labels = run(specs, relevance="labels", metric=f"recall@{K}").report
    assert labels.new_new == labels.old_old  # cosine is rotation-invariant: new/new is the old self-test
    free = run(specs, relevance="none")
    assert free.means["old/old"][f"neighbour_recall@{K}"] == 1.0  # the old model finds exactly the new neighbours
    assert free.report.verdict == "not compatible" and free.report.new_old < 0.5


def test_an_unchanged_model_is_a_tie_as_with_features(tmp_path):
    e = embeddings(new="same")
    specs = write_all("npz", tmp_path / "s", tables(e, text=True))
    got = run(specs).report
    old = CellFeatures(e["old_queries"], e["q_labels"], e["old_gallery"], e["g_labels"])
    want = check_upgrade(old, old, interval="queries", resamples=RESAMPLES)
    assert got.compatibility == want.compatibility and got.compatibility.tie
    assert (got.compatibility.lo, got.compatibility.hi) == (0.0, 0.0)  # the features are the same: [0, 0] is the truth


def test_without_the_new_gallery_only_the_cross_test(tmp_path, drift):
    specs = write_all("npz", tmp_path / "s", tables(drift, text=True))
    full = run(specs).report
    part = run(SourceSpecs(specs.old_gallery, specs.old_queries, specs.new_queries)).report
    assert part.compatibility == full.compatibility and part.new_new != part.new_new  # NaN: not measured
    assert part.better.verdict == "not judged" and "no new gallery was given" in part.sentence()


# ---- the command line --------------------------------------------------------------------------------------------

def cli(specs, *extra):
    args = ["check-upgrade", "--old-gallery", specs.old_gallery, "--old-queries", specs.old_queries,
            "--new-queries", specs.new_queries, "--resamples", str(RESAMPLES)]
    if specs.new_gallery:
        args += ["--new-gallery", specs.new_gallery]
    return main(args + list(extra))


@pytest.mark.parametrize("relevance", ["labels", "none"])
def test_cli_prints_the_report_and_exports_the_relevance(tmp_path, capsys, drift, relevance):
    specs = write_all("parquet", tmp_path / "s", tables(drift, text=True))
    out = tmp_path / "r.json"
    code = cli(specs, "--relevance", relevance, "--json", str(out))
    report = json.loads(out.read_text())
    assert code == {"compatible": 0, "not compatible": 1, "too close to call": 3}[report["verdict"]]
    want = run(specs, relevance=relevance).to_json()
    assert report["relevance"] == relevance and report["compatibility"] == want["compatibility"]
    assert report["convention"] == want["convention"] and report["means"] == want["means"]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == report["sentence"]
    assert f"  convention: {want['convention']}" in printed
    assert report["bootstrap"]["paired_over"] == "queries"


def test_features_form_still_refuses_source_options(tmp_path, capsys):
    assert main(["check-upgrade", "--features", str(tmp_path), "--new-gallery", "x.npz"]) == 2
    assert "--new-gallery go(es) with --old-gallery" in capsys.readouterr().err


def bad_cases(tmp_path, drift):
    """(name, specs, extra CLI args, expected part of the one line)."""
    tabs = tables(drift, text=True)
    specs = write_all("npz", tmp_path / "s", tabs)
    ids, vectors, labels = tabs["new_gallery"]
    short = write("npz", tmp_path / "s", "short", (ids[3:], vectors[3:], labels[3:]))
    wide = write("npz", tmp_path / "s", "wide", (tabs["new_queries"][0], np.ones((NQ, D + 2), np.float32),
                                                 tabs["new_queries"][2]))
    g_ids, q_ids = ids_for(drift, text=True)
    qrels = write_qrels(tmp_path / "s" / "q.tsv", q_ids, g_ids, drift)
    qrels.write_text(qrels.read_text() + "q/1\tdoc-9999\t1\nq/1\tdoc-9998\t2\n")
    nan_v = vectors.copy()
    nan_v[5, 2] = np.nan
    nans = write("npz", tmp_path / "s", "nans", (ids, nan_v, labels))
    return [
        ("missing file", replace(specs, old_gallery=str(tmp_path / "s" / "nope.npz")), [], "nope.npz"),
        ("ids missing", replace(specs, new_gallery=short), [],
         f"3 of the {NG} ids of old gallery are missing from new gallery"),
        ("dimension", replace(specs, new_queries=wide), [], "14-d"),
        ("qrels unknown", specs, ["--qrels", str(qrels)], "names unknown ids: 2 item ids not among the 240 gallery items"),
        ("nan", replace(specs, new_gallery=nans), [], "NaN or infinite"),
        ("no new gallery", SourceSpecs(specs.old_gallery, specs.old_queries, specs.new_queries), ["--relevance", "none"],
         "needs the new gallery"),
        ("groups column", specs, ["--query-groups", "topic"], "query groups npz:"),
        ("sequential groups", specs, ["--query-groups", "labels", "--sequential"], "leave out --query-groups"),
        ("metric", specs, ["--metric", "neighbour_recall@10"], "does not go with relevance labels"),
        ("outside roots", replace(specs, old_queries="/etc/passwd.npz"), [], "data root"),
        ("password", replace(specs, old_gallery="sql:postgresql+psycopg://me:s3cret@127.0.0.1:1/db#table=items"), [],
         "me:***@127.0.0.1"),
    ]


def test_every_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, drift):
    out = tmp_path / "r.json"
    for name, specs, extra, message in bad_cases(tmp_path, drift):
        before = fingerprint(tmp_path / "s")
        assert cli(specs, "--json", str(out), *extra) == 2, name
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err, (name, err)
        assert message in err, (name, err)
        assert "s3cret" not in err
        assert not out.exists() and fingerprint(tmp_path / "s") == before


def test_source_errors_are_value_errors_with_counts(tmp_path, drift):
    tabs = tables(drift)
    specs = write_all("npz", tmp_path / "s", tabs)
    ids, vectors, labels = tabs["new_queries"]
    fewer = write("npz", tmp_path / "s", "fewer", (ids[:-2], vectors[:-2], labels[:-2]))
    with pytest.raises(SourceError, match=f"2 of the {NQ} ids of old queries are missing from new queries"):
        run(replace(specs, new_queries=fewer))
    unlabelled = write("npz", tmp_path / "s", "nolab", (tabs["old_gallery"][0], tabs["old_gallery"][1], None))
    with pytest.raises(SourceError, match="relevance labels needs labels on old gallery"):
        run(replace(specs, old_gallery=unlabelled, new_gallery=None))


def test_qrels_read_the_same_from_tsv_trec_csv_and_parquet(tmp_path, drift):
    """One set of judgements in the four formats: the same table, hence the same check."""
    from engine.sources.qrels import read_qrels

    g_ids, q_ids = ids_for(drift, text=True)
    tsv = write_qrels(tmp_path / "q.tsv", q_ids, g_ids, drift)
    rows = [line.split("\t") for line in tsv.read_text().splitlines()[1:]]
    (tmp_path / "q.txt").write_text("".join(f"{q} 0 {g} {s}\n" for q, g, s in rows))  # TREC: no header
    (tmp_path / "q.csv").write_text("qid,doc_id,grade\n" + "".join(f"{q},{g},{s}\n" for q, g, s in rows))
    pq.write_table(pa.table({"query": [r[0] for r in rows], "item": [r[1] for r in rows],
                             "rel": [int(r[2]) for r in rows]}), tmp_path / "q.parquet")
    want = read_qrels(str(tsv))
    assert len(want.query) == len(rows) and want.grade.sum() == sum(int(r[2]) for r in rows)
    for text in (tmp_path / "q.txt", tmp_path / "q.csv", f"parquet:{tmp_path / 'q.parquet'}#query=query&item=item"):
        got = read_qrels(str(text))
        np.testing.assert_array_equal(got.query, want.query)
        np.testing.assert_array_equal(got.item, want.item)
        np.testing.assert_array_equal(got.grade, want.grade)
    for bad, message in (("q.json", "cannot tell the format"), ("none.tsv", "no such file")):
        with pytest.raises(SourceError, match=message):
            read_qrels(str(tmp_path / bad))
    (tmp_path / "bad.tsv").write_text("query-id\tcorpus-id\tscore\nq/1\tdoc-0001\thigh\n")
    with pytest.raises(SourceError, match="a grade is not a number"):
        read_qrels(str(tmp_path / "bad.tsv"))
    (tmp_path / "twice.tsv").write_text("query-id\tcorpus-id\tscore\nq/1\tdoc-0001\t1\nq/1\tdoc-0001\t2\n")
    specs = write_all("npz", tmp_path / "s", tables(drift, text=True))
    with pytest.raises(SourceError, match=r"judges 1 \(query, item\) pairs twice"):
        run(replace(specs, qrels=str(tmp_path / "twice.tsv")))


def test_ties_read_off_the_streamed_lists_equal_the_features_check(tmp_path):
    """One-hot vectors (every score exactly 0, 1/sqrt(2) or 1): the lists of a streamed gallery give each cell the tie
    share and readings, and the verdicts under the extreme readings, that the full pass gives on the same vectors;
    where a tie runs past the lists the readings are not given, and a note says why."""
    eye = np.eye(3, dtype=np.float32)
    labels = np.repeat(np.arange(3), 4)  # gallery: 4 one-hot items per class; queries: 4 per class
    old_q = eye[np.where(np.arange(12) % 4 < 2, labels, (labels + 1) % 3)]  # half on their class, half on the next
    new_q = (eye[labels] + eye[(labels + 1) % 3]) / np.float32(np.sqrt(2))  # 4 positives tie 4 negatives
    e = {"old_gallery": eye[labels], "new_gallery": eye[labels], "old_queries": old_q, "new_queries": new_q}
    ids = np.arange(100, 112)
    specs = write_all("npz", tmp_path / "s", {side: (ids, e[side], labels) for side in SIDES})
    old, new = CellFeatures(old_q, labels, eye[labels], labels), CellFeatures(new_q, labels, eye[labels], labels)
    for k, depth in ((1, 10), (5, 12)):
        got = run(specs, relevance="labels", k=depth, metric=f"recall@{k}", interval="queries").report.tie_readings
        want = check_upgrade(old, new, metric=f"recall@{k}", interval="queries", resamples=RESAMPLES,
                             orderings=()).tie_readings
        for cell, values in want["cells"].items():
            assert got["cells"][cell] == pytest.approx(values, abs=1e-12), (k, cell)
        assert got["verdicts"] == want["verdicts"] and got["decide"] == want["decide"]
    assert want["cells"]["new/old"]["tied"] == 12 and want["decide"] is True
    # recall@5 on top-10 lists: a clean miss (4 negatives above, its positives at 0) ties 2 items past the list
    cut = run(specs, relevance="labels", k=10, metric="recall@5", interval="queries").report
    assert cut.tie_readings is None and any(n.startswith("ties not read: 6 old/old queries") for n in cut.notes)
