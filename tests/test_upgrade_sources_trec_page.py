"""The Upgrade check's "from a table or store" form takes the rank-tie rule of ``check-upgrade --rank-ties`` and offers
the check's TREC run files (what ``--export trec`` writes) for download (AppTest): the rule travels in the job's
payload, is checked there and again by the worker, and is stated in the result's convention line; the worker stores
the files zipped beside the report, and pytrec_eval on them gives the stored numbers back."""
from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from support.app_pages import jobs, open_page, texts
from support.upgrade_sources import embeddings, tables, write_all
from support.upgrade_sources_page import fill

from app import queries
from engine.core.contract import sources_check_payload
from engine.core.kinds import DEFAULT_RANK_TIES, LIST_RANK_TIES, RANK_TIES
from engine.jobs.worker import run_one
from engine.upgrade.from_sources import SourceSpecs, check_sources
from storage import enqueue_job, get_engine, load_source_check, payload_hash, session_scope

pytrec_eval = pytest.importorskip("pytrec_eval")

LABEL = "TREC run files (.zip)"
TOL = 1e-9


def both(specs) -> SourceSpecs:
    return SourceSpecs(specs.old_gallery, specs.old_queries, specs.new_queries, specs.new_gallery)


def run_job(url: str, at):
    """The worker runs the one queued check; the page is read again; the stored report."""
    (job,) = jobs(url)
    assert run_one(get_engine(url), kinds=["sources_check"]) == job.id
    queries.jobs.clear()  # what the job list's 1 s time-to-live does
    at.run()
    assert not at.exception, at.exception
    with session_scope(get_engine(url)) as s:
        return job, load_source_check(s, payload_hash("sources_check", job.payload))


def test_the_rank_tie_select_offers_the_rules_of_a_top_k_list_by_their_records(app_db):
    at = open_page("upgrade")
    at.radio(key="up_mode").set_value("From a table or store").run()
    select = at.selectbox(key="up_src_rank_ties")
    assert select.options == [RANK_TIES[r].label for r in LIST_RANK_TIES] and len(select.options) == 2
    assert select.value == DEFAULT_RANK_TIES == "pessimistic"  # check-upgrade's default
    assert all(RANK_TIES[r].help in select.help for r in LIST_RANK_TIES)


def test_the_chosen_rule_is_in_the_payload_reaches_the_check_and_is_stated_with_the_result(app_db, tmp_path):
    specs = write_all("parquet", tmp_path / "s", tables(embeddings(), text=True))
    at = fill(open_page("upgrade"), specs, rank_ties="trec")
    job, report = run_job(app_db, at)
    assert job.payload["rank_ties"] == "trec"
    assert job.payload == sources_check_payload({s: getattr(specs, s) for s in ("old_gallery", "new_gallery",
                                                 "old_queries", "new_queries")}, relevance="labels", rank_ties="trec")
    assert report["rank_ties"] == "trec"
    want = check_sources(both(specs), relevance="labels", rank_ties="trec").to_json()
    assert "trec_eval's order" in want["convention"] and want["convention"] in texts(at)  # the caption's convention
    assert report["new_old"] == pytest.approx(want["new_old"], abs=TOL)
    # the default rule is left out of a payload, so a check queued before the rule was a choice is the same job
    default = sources_check_payload({"old_gallery": "g", "old_queries": "a", "new_queries": "b"}, relevance="labels")
    assert "rank_ties" not in default
    assert sources_check_payload({"old_gallery": "g", "old_queries": "a", "new_queries": "b"}, relevance="labels",
                                 rank_ties=DEFAULT_RANK_TIES) == default


@pytest.mark.parametrize("bad", ["optimistic", "bogus", 3])
def test_a_bad_rule_is_refused_with_one_line(app_db, tmp_path, bad):
    """At queue time (the payload's builder) and by the worker, which reads a stored payload strictly: the job fails
    with the one line, nothing is stored, and the page shows that line."""
    sources = {"old_gallery": "g.npz", "old_queries": "a.npz", "new_queries": "b.npz"}
    line = f"unknown rank-tie rule {bad!r}; use one of pessimistic, trec"
    with pytest.raises(ValueError, match=f"^{line}$".replace("(", r"\(").replace(")", r"\)")):
        sources_check_payload(sources, relevance="labels", rank_ties=bad)
    specs = write_all("npz", tmp_path / "s", tables(embeddings(), text=True))
    payload = {**sources_check_payload({"old_gallery": specs.old_gallery, "old_queries": specs.old_queries,
                                        "new_queries": specs.new_queries}, relevance="labels"), "rank_ties": bad}
    with session_scope(get_engine(app_db)) as s:
        enqueue_job(s, "sources_check", payload)
    at = open_page("upgrade")
    at.radio(key="up_mode").set_value("From a table or store").run()
    job, report = run_job(app_db, at)
    (job,) = jobs(app_db)
    assert job.status == "failed" and job.message == line and report is None
    assert f"The check failed (job #{job.id}): {line}" in texts(at)


def test_an_unknown_field_in_a_stored_payload_is_refused_with_one_line(app_db, tmp_path):
    specs = write_all("npz", tmp_path / "s", tables(embeddings(), text=True))
    payload = {**sources_check_payload({"old_gallery": specs.old_gallery, "old_queries": specs.old_queries,
                                        "new_queries": specs.new_queries}, relevance="labels"), "rank_tie": "trec"}
    with session_scope(get_engine(app_db)) as s:
        enqueue_job(s, "sources_check", payload)
    run_one(get_engine(app_db), kinds=["sources_check"])
    (job,) = jobs(app_db)
    assert job.status == "failed" and job.message.startswith("a sources_check payload holds unknown field(s) rank_tie;")
    assert "\n" not in job.message


def trec_means(qrels: str, run: str, measure: str) -> float:
    """pytrec_eval's mean of ``measure`` over the run's judged queries (trec_eval's code)."""
    per_query = pytrec_eval.RelevanceEvaluator(pytrec_eval.parse_qrel(io.StringIO(qrels)), {measure}).evaluate(
        pytrec_eval.parse_run(io.StringIO(run)))
    return float(np.mean([v[measure] for v in per_query.values()]))


def parse_run(text: str) -> dict[str, list[tuple[int, str, float]]]:
    """A TREC run read by hand: ``qid Q0 docid rank score tag`` per line; each query's (rank, doc, score)."""
    lists: dict[str, list[tuple[int, str, float]]] = {}
    for line in text.splitlines():
        qid, q0, doc, rank, score, tag = line.split(" ")
        assert q0 == "Q0" and tag
        lists.setdefault(qid, []).append((int(rank), doc, float(score)))
    return lists


@pytest.mark.parametrize("rank_ties", ["pessimistic", "trec"])
def test_the_download_offers_the_trec_files_that_recompute_the_stored_numbers(app_db, tmp_path, rank_ties):
    """After the job ran, the page offers the zip; its run files parse as TREC runs (ranks 1..k, scores not
    increasing, judged by the qrels) and pytrec_eval on them gives the stored mean of the check's metric (mAP@10,
    trec_eval's map_cut_10) of every cell and of each adapter of the plan to 1e-9, the cross-test new/old the report
    states first among them."""
    specs = write_all("parquet", tmp_path / "s", tables(embeddings(), text=True))
    at = fill(open_page("upgrade"), specs, rank_ties=rank_ties)
    job, report = run_job(app_db, at)
    assert LABEL in [b.proto.label for b in at.get("download_button")]
    data = queries.source_check_trec(app_db, "sources_check", job.payload)  # what the button downloads
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        files = {name: z.read(name).decode() for name in z.namelist()}
    assert set(files) == set(report["trec"]["files"]) == {"old_old.run", "new_old.run", "new_new.run", "qrels.txt",
                                                          *(f"adapted_{a['name']}_old.run" for a in report["plan"]["adapters"])}
    qrels = files.pop("qrels.txt")
    judged = {line.split()[0] for line in qrels.splitlines()}
    runs = {name: parse_run(text) for name, text in files.items()}
    for lists in runs.values():
        assert set(lists) >= judged and len(lists) == report["n_queries"]
        for ranked in lists.values():
            assert [r for r, _, _ in ranked] == list(range(1, report["k"] + 1))
            assert all(a[2] >= b[2] for a, b in zip(ranked, ranked[1:]))
    assert report["metric"] == "map@10"
    tied = any(a[2] == b[2] for lists in runs.values() for ranked in lists.values() for a, b in zip(ranked, ranked[1:]))
    if rank_ties == "trec" or not tied:  # the default ranks a tied non-relevant item first: trec_eval does not
        assert report["new_old"] == pytest.approx(trec_means(qrels, files["new_old.run"], "map_cut_10"), abs=TOL)
        for cell, run in (("old/old", "old_old.run"), ("new/new", "new_new.run")):
            assert report["means"][cell]["map@10"] == pytest.approx(trec_means(qrels, files[run], "map_cut_10"), abs=TOL)
        assert report["plan"]["adapters"]
        for row in report["plan"]["adapters"]:  # the plan's adapted queries on the old gallery, under the metric
            run = files[f"adapted_{row['name']}_old.run"]
            assert row["adapted_old"] == pytest.approx(trec_means(qrels, run, "map_cut_10"), abs=TOL), row["name"]
    assert report["trec"]["note"] is None if rank_ties == "trec" or not tied else "equal scores" in report["trec"]["note"]


def test_ids_a_trec_file_cannot_hold_leave_the_check_and_say_why(app_db, tmp_path):
    """A gallery id holding a space: the check is stored as ever, no zip is stored, and the page says why instead of
    offering the button (nothing half-written)."""
    tabs = tables(embeddings(), text=True)
    tabs = {side: (np.char.replace(ids.astype(str), "doc-", "doc ") if "gallery" in side else ids, v, lab)
            for side, (ids, v, lab) in tabs.items()}
    specs = write_all("parquet", tmp_path / "s", tabs)
    at = fill(open_page("upgrade"), specs)
    job, report = run_job(app_db, at)
    assert report["verdict"] in ("compatible", "not compatible", "too close to call")
    assert set(report["trec"]) == {"error"} and report["trec"]["error"].startswith("item id 'doc ")
    assert report["trec"]["error"].endswith(" is empty or holds whitespace; a TREC file cannot hold it")
    assert queries.source_check_trec(app_db, "sources_check", job.payload) == b""
    assert LABEL not in [b.proto.label for b in at.get("download_button")]
    assert "No TREC run files for this check: item id 'doc " in texts(at)


def test_a_check_stored_before_the_files_were_kept_says_so_and_an_older_database_gains_the_column(app_db, tmp_path):
    import sqlite3

    from sqlalchemy import create_engine

    from storage import save_source_check
    from storage.migrate import add_missing_columns

    specs = write_all("npz", tmp_path / "s", tables(embeddings(), text=True))
    at = fill(open_page("upgrade"), specs)
    job, report = run_job(app_db, at)
    key = payload_hash("sources_check", job.payload)
    with session_scope(get_engine(app_db)) as s:  # as a worker before this change stored it
        save_source_check(s, key, {k: v for k, v in report.items() if k != "trec"})
    at.run()
    assert LABEL not in [b.proto.label for b in at.get("download_button")]
    assert "stored before its TREC run files were kept" in texts(at)
    assert queries.source_check_trec(app_db, "sources_check", job.payload) == b""

    get_engine(app_db).dispose()
    with sqlite3.connect(tmp_path / "app.db") as c:
        c.execute("ALTER TABLE source_checks DROP COLUMN trec_zip")
    c.close()
    older = create_engine(app_db)
    assert add_missing_columns(older) == ["source_checks.trec_zip"]
    with session_scope(older) as s:
        assert load_source_check(s, key)["sentence"] == report["sentence"]
    older.dispose()


def test_the_zip_holds_the_texts_as_given_the_same_bytes_each_time():
    from engine.results.trec import zip_files

    files = {"old_old.run": "q1 Q0 d2 1 0.5 old->old\n", "qrels.txt": "q1 0 d2 1\n"}
    data = zip_files(files)
    assert data == zip_files(dict(files))
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert z.namelist() == list(files) and {n: z.read(n).decode() for n in files} == files
    with pytest.raises(ValueError, match="^a TREC file name must be a plain name, got '../x.run'$"):
        zip_files({"../x.run": ""})
