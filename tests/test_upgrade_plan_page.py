"""The Upgrade check page shows the migration plan the engine stored with the verdict (AppTest; the page computes nothing)."""
from __future__ import annotations

from support.app_pages import open_page, texts, unplain
from support.upgrade import close_pair, compatible_pair, hits
from support.upgrade_page import open_upgrade
from support.upgrade_plan_cli import rotated_back_pair

from engine.upgrade.plan import migration_plan
from storage import get_engine
from support.upgrade_plan_page import stored_plan




def test_the_page_shows_the_stored_plan_its_numbers_and_a_markdown_download(app_db):
    payload = stored_plan(app_db, rotated_back_pair)
    plan = payload["plan"]
    again = migration_plan(payload["report"], adapters=plan["adapters"], rollouts=plan["rollouts"],
                           threshold=plan["threshold"])
    assert (plan["decision"], plan["adapter"]) == (again.decision, again.adapter) == ("ship with adapter", "procrustes")
    at = open_upgrade()
    assert not at.exception
    page = texts(at)
    assert "Migration plan" in [h.value for h in at.subheader]
    assert any(unplain(b.value).startswith("Decision: ship with adapter procrustes.") for b in at.info)
    table = at.dataframe[-1].value  # the plan's adapters, the last table of the page
    old, _ = rotated_back_pair()
    row = table[table["adapter"] == "procrustes"].iloc[0]
    assert row["pairs fitted on"] == 100 and row["verdict"] == "compatible"
    assert row["adapted → v1 %"] == 100 * hits(compatible_pair()[1], old).mean()
    assert row["v1 alone %"] == 100 * hits(old, old).mean()
    t = plan["threshold"]  # its numbers are checked by hand in test_upgrade_plan_cli.py
    assert shown_metric(at, "Similarity threshold under v1") == f"{t['t_old']:.4g}"
    assert shown_metric(at, "Same precision under v2") == f"{t['t_new']:.4g}"
    assert f"v2 alone vs v1 alone: {100 * payload['report']['new_new']:.1f}% vs {100 * payload['report']['old_old']:.1f}%" in page
    assert shown_metric(at, "Items to re-embed") == "0"
    assert "Download the plan (Markdown)" in [b.proto.label for b in at.get("download_button")]
    assert "fitted on 100 paired gallery items" in page
    f = plan["forecast"]  # stored with the plan, read before the fit; its numbers: tests/test_forecast_plan.py
    head = (f"Forecast before fitting: a Procrustes adapter should recover {100 * f['share_of_new']:.0f} % of a full "
            "re-embedding (v2/v2; 90 % prediction interval")
    assert any(unplain(c.value).startswith(head) for c in at.caption)


def shown_metric(at, label: str) -> str:
    (m,) = [m for m in at.metric if m.label == label]
    return m.value


def test_a_pair_too_small_for_an_adapter_is_decided_from_the_verdicts_and_says_why(app_db):
    payload = stored_plan(app_db, close_pair)  # two gallery items: one pair is not enough to fit on
    assert payload["plan"]["adapters"] == [] and payload["plan"]["decision"] == "do not ship yet"
    at = open_upgrade()
    assert not at.exception
    assert "no adapter, roll-out or threshold: a fit share of 0.5 of 2 gallery items gives 1 pairs" in texts(at)


def test_a_check_from_a_store_shows_its_plan_with_adapters(app_db, tmp_path):
    from support.app_pages import jobs
    from support.upgrade_sources import embeddings, tables, write_all
    from support.upgrade_sources_page import fill

    from app import queries
    from engine.jobs.worker import run_one
    from engine.upgrade.from_sources import SourceSpecs, check_sources
    from engine.upgrade.source_remedies import plan_from_sources

    specs = write_all("npz", tmp_path / "s", tables(embeddings(), text=True))
    at = fill(open_page("upgrade"), specs)
    (job,) = jobs(app_db)
    assert run_one(get_engine(app_db), kinds=["sources_check"]) == job.id
    queries.jobs.clear()
    at.run()
    assert not at.exception, at.exception
    both = SourceSpecs(specs.old_gallery, specs.old_queries, specs.new_queries, specs.new_gallery)
    want = plan_from_sources(check_sources(both, relevance="labels"), both).plan  # the job's plan: default adapters
    assert any(unplain(b.value).startswith(f"Decision: {want.headline()}. {want.reason}") for b in at.info)
    page = texts(at)
    assert "decided from the verdicts alone" not in page and "paired gallery items" in page
    assert "Download the plan (Markdown)" in [b.proto.label for b in at.get("download_button")]
    assert "Download the release report (HTML)" in [b.proto.label for b in at.get("download_button")]
    from app.report_download import report_bytes  # the button's file, from the check the page shows

    stored = queries.source_check(app_db, "sources_check", job.payload)
    page = report_bytes(stored["plan"], {k: v for k, v in stored.items() if k != "plan"},
                        {"sources": stored["sources"]}).decode()
    assert f"Decision: {want.headline()}." in page and "sources: old_gallery" in page
    assert "decided from the verdicts alone" not in page and "paired gallery items" in page


def test_the_page_shows_the_remedies_side_by_side_as_stored(app_db):
    plan = stored_plan(app_db, rotated_back_pair)["plan"]
    at = open_upgrade()
    assert not at.exception
    (table,) = [d.value for d in at.dataframe if "remedy" in d.value.columns]
    assert list(table["remedy"]) == [o["remedy"] for o in plan["options"]]
    assert set(table["remedy"]) == {"query-side adapter", "corpus transform", "cascade", "backfill", "full re-embedding"}
    (picked,) = table[table[""] == "✓"].itertuples()
    assert (picked.remedy, picked.option) == ("query-side adapter", "procrustes") == (
        "query-side adapter", plan["remedy"])
    # the column the rule ranks first: items embedded once + the horizon's queries x items embedded per query
    over = table[f"embedded over {plan['queries']:,} queries"]
    want = [o["one_time"]["embeddings"] + (0 if o["remedy"] == "backfill" else plan["queries"] * o["per_query"]["embeddings"])
            for o in plan["options"]]
    assert list(over) == want
