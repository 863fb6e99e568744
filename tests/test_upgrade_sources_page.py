"""The Upgrade check's "from a table or store" form (AppTest): it queues a ``sources_check`` job, the worker's handler
runs ``check_sources`` and stores the report, and the page shows that report: the CLI's numbers on the same Parquet."""
from __future__ import annotations

import pytest
from support.app_pages import jobs, open_page, texts, unplain
from support.upgrade_sources import embeddings, tables, write_all

from app import queries
from engine.core.contract import sources_check_payload
from engine.jobs.worker import run_one
from engine.upgrade.from_sources import SourceSpecs, check_sources
from storage import get_engine, load_source_check, payload_hash, session_scope
from support.upgrade_sources_page import fill




@pytest.mark.parametrize("relevance", ["labels", "none"])
def test_the_form_queues_the_check_and_shows_the_stored_report(app_db, tmp_path, relevance):
    specs = write_all("parquet", tmp_path / "s", tables(embeddings(), text=True))
    at = fill(open_page("upgrade"), specs, relevance=relevance)
    (job,) = jobs(app_db)
    assert job.kind == "sources_check" and job.payload == sources_check_payload(
        {s: getattr(specs, s) for s in ("old_gallery", "new_gallery", "old_queries", "new_queries")}, relevance=relevance)
    assert run_one(get_engine(app_db), kinds=["sources_check"]) == job.id
    queries.jobs.clear()  # what the job list's 1 s time-to-live does
    at.run()
    assert not at.exception, at.exception
    want = check_sources(SourceSpecs(specs.old_gallery, specs.old_queries, specs.new_queries, specs.new_gallery),
                         relevance=relevance).to_json()
    page = texts(at)
    assert want["sentence"] in page and want["convention"] in page
    box = {"compatible": at.success, "not compatible": at.error, "too close to call": at.warning}[want["verdict"]]
    assert any(want["sentence"] in unplain(str(b.value)) for b in box)
    gain = next(m for m in at.metric if m.label.startswith("ECC gain"))
    assert gain.value == f"{100 * want['compatibility']['diff']:+.1f} pts"
    if want["backfill"]:  # the stored backfill needs, as the report holds them
        table = next(d.value for d in at.dataframe if "ordering" in d.value.columns)
        assert table["ordering"].str.replace(" (best)", "").tolist() == [n["ordering"] for n in want["backfill"]]
        assert table["M̃ %"].tolist() == [100 * n["area"] for n in want["backfill"]]
        assert "Backfilling curves" in texts(at)


def test_a_bad_form_is_refused_before_anything_is_queued(app_db, tmp_path):
    at = open_page("upgrade")
    at.radio(key="up_mode").set_value("From a table or store").run()
    at.text_input(key="up_src_old_gallery").input("x.parquet")
    at.button[0].click().run()
    assert "give the old queries, the new queries" in texts(at)
    assert jobs(app_db) == []


def test_a_failed_check_shows_its_one_line(app_db, tmp_path):
    specs = write_all("parquet", tmp_path / "s", tables(embeddings(), text=True))
    at = fill(open_page("upgrade"), SourceSpecs(str(tmp_path / "missing.parquet"), specs.old_queries, specs.new_queries))
    run_one(get_engine(app_db), kinds=["sources_check"])
    queries.jobs.clear()
    at.run()
    assert "The check failed" in texts(at) and "missing.parquet" in texts(at)


def test_each_submission_shows_its_own_check(app_db, tmp_path):
    """The chosen check follows the last submission (a queued job, or the identical one found), not the widget's old
    value: a typo after a good check shows the typo's error, and asking the good check again shows its report."""
    specs = write_all("parquet", tmp_path / "s", tables(embeddings(), text=True))
    typo = SourceSpecs(str(tmp_path / "typo.parquet"), specs.old_queries, specs.new_queries)
    want = check_sources(SourceSpecs(specs.old_gallery, specs.old_queries, specs.new_queries, specs.new_gallery)
                         ).to_json()["sentence"]
    engine = get_engine(app_db)

    def submit(at, chosen):
        fill(at, chosen)
        run_one(engine, kinds=["sources_check"])
        queries.jobs.clear()
        at.run()
        assert not at.exception, at.exception
        return texts(at)

    at = open_page("upgrade")
    assert want in submit(at, specs)
    page = submit(at, typo)
    assert "The check failed" in page and "typo.parquet" in page and want not in page
    page = submit(at, specs)  # the same check as the first: found, not queued again
    assert want in page and "The check failed" not in page
    assert len(jobs(app_db)) == 2


def test_the_margin_and_tie_rule_reach_the_check(app_db, tmp_path):
    """The form's margin and tie rule go into the job's payload, the worker's check judges with them (the stored
    report's margin, ties and rule name) and the page names the rule."""
    specs = write_all("parquet", tmp_path / "s", tables(embeddings(), text=True))
    at = fill(open_page("upgrade"), specs, margin=10.0, ties="pass")
    (job,) = jobs(app_db)
    assert job.payload["margin"] == 10.0 and job.payload["ties"] == "pass"
    run_one(get_engine(app_db), kinds=["sources_check"])
    with session_scope(get_engine(app_db)) as s:
        report = load_source_check(s, payload_hash("sources_check", job.payload))
    assert (report["margin"], report["ties"]) == (10.0, "pass")
    assert report["rule"] == "non-inferiority margin 10 points (cross-test >= self-test - 10 points)"
    c = report["compatibility"]  # the verdict by hand: passes when the interval's lower end clears -10 points
    assert report["verdict"] == ("compatible" if c["diff"] >= -0.10 and c["lo"] >= -0.10 else
                                 "not compatible" if c["hi"] < -0.10 else "too close to call")
    assert -0.10 <= c["hi"] < 0  # these embeddings (mAP@10, the default): strict ECC would say not compatible, the margin changes it
    queries.jobs.clear()
    at.run()
    assert "Rule: non-inferiority margin 10 points" in texts(at)


def test_a_secret_typed_into_the_form_is_never_stored_or_shown(app_db, tmp_path, monkeypatch):
    """Issue 40: a Qdrant api_key and a PostgreSQL password typed in clear are refused before anything is queued (the
    message says what, never the value); named by reference (``${SOURCE_SECRET_...}``, read from the worker's
    environment) the check is queued, and neither its stored payload, its label on Overview and in the check picker,
    nor the worker's error holds either secret."""
    monkeypatch.setenv("COMPATLAB_ALLOW_HOSTS", "q.example:6333,db.example")
    key, password = "qd-KEY-4711", "pg-PASS-0815"
    specs = write_all("parquet", tmp_path / "s", tables(embeddings(), text=True))
    qdrant = "qdrant:https://q.example:6333#collection=items&api_key={}"
    postgres = "sql:postgresql+psycopg://lab:{}@db.example/x#table=items"

    def shown(at) -> str:
        return texts(at) + "".join(map(str, at.exception)) + "".join(str(s.options) for s in at.selectbox)

    for old, new, what in ((qdrant.format(key), None, "a value of api_key"),
                           ("${SOURCE_SECRET_QDRANT}".join(qdrant.split("{}")), postgres.format(password),
                            "a password in its URL")):
        at = fill(open_page("upgrade"), SourceSpecs(old, specs.old_queries, specs.new_queries, new))
        assert what in texts(at) and jobs(app_db) == []
        assert key not in shown(at) and password not in shown(at)

    monkeypatch.setenv("SOURCE_SECRET_QDRANT", key)  # the worker's environment (the same process here)
    monkeypatch.setenv("SOURCE_SECRET_PG", password)
    refs = SourceSpecs(qdrant.format("${SOURCE_SECRET_QDRANT}"), specs.old_queries, specs.new_queries,
                       postgres.format("${SOURCE_SECRET_PG}"))
    at = fill(open_page("upgrade"), refs)
    (job,) = jobs(app_db)
    assert job.payload["sources"]["old_gallery"] == refs.old_gallery
    assert job.payload["sources"]["new_gallery"] == refs.new_gallery
    run_one(get_engine(app_db), kinds=["sources_check"])  # the reader resolves the references; no such host answers
    (job,) = jobs(app_db)
    assert job.status == "failed"
    queries.jobs.clear()
    at.run()
    overview = open_page("overview")
    for where in (str(job.payload), str(job.error), str(job.message), shown(at), shown(overview)):
        assert key not in where and password not in where, where
    assert "The check failed" in texts(at) and "q.example" in texts(at)
