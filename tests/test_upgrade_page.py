"""The Upgrade check page (AppTest) on hand-made stored pairs, checked against recall and a bootstrap computed by hand.

The verdict is computed as the worker would (``engine.jobs.analysis.run_analysis``, kind ``upgrade``) and the page
only reads it. Expectations come from ``tests/test_upgrade.py``'s numpy recall and percentile bootstrap, a
different draw than the engine's, so interval ends are compared within the Monte-Carlo error of 1,000 resamples.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from support.app_pages import unplain, jobs, open_page, texts
from support.upgrade import bootstrap_by_hand, close_pair, compatible_pair, hits, incompatible_pair
from support.upgrade_cli import store_pair

from app import queries
from engine.core.contract import analysis_key
from engine.jobs.analysis import run_analysis
from engine.jobs.worker import run_one
from engine.upgrade.verdict import check_upgrade
from storage import get_engine, load_analysis, session_scope, set_experiment_status
from support.upgrade_page import PARAMS, open_upgrade





def stored(url: str, pair, *, compute: bool = True) -> int:
    old, new = pair()
    exp = store_pair(url, old, new, names=("v1", "v2"))
    with session_scope(get_engine(url)) as s:
        set_experiment_status(s, exp, "done")
    if compute:
        run_analysis(get_engine(url), exp, "upgrade", PARAMS)
    return exp


def shown(at, label_start: str) -> str:
    (m,) = [m for m in at.metric if m.label.startswith(label_start)]
    return m.value


def points(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"[+-]?\d+\.\d", text)]


def by_hand(pair) -> tuple[np.ndarray, float, float]:
    old, new = pair()
    d = hits(new, old) - hits(old, old)
    lo, hi = bootstrap_by_hand(d)
    return d, 100 * lo, 100 * hi


def test_compatible_pair(app_db):
    stored(app_db, compatible_pair)
    at = open_upgrade()
    d, lo, hi = by_hand(compatible_pair)
    (box,) = at.success
    assert box.value.startswith("v2 \\(step 2\\) is compatible with v1 \\(step 1\\)")
    assert points(shown(at, "ECC gain")) == [pytest.approx(100 * d.mean(), abs=0.051)]
    shown_lo, shown_hi = points(shown(at, "95% CI"))
    assert 0 < shown_lo and (shown_lo, shown_hi) == pytest.approx((lo, hi), abs=1.2)
    assert not at.error and "Too close to call" not in texts(at) and "Backfilling curves" not in texts(at)


def test_incompatible_pair_shows_its_curves_and_the_one_decision(app_db):
    exp = stored(app_db, incompatible_pair)
    at = open_upgrade()
    d, lo, hi = by_hand(incompatible_pair)
    assert hi < 0
    assert len(at.error) == 1 and "v2 (step 2) is not compatible with v1 (step 1)" in texts(at)
    assert points(shown(at, "ECC gain")) == [pytest.approx(100 * d.mean(), abs=0.051)]
    assert points(shown(at, "95% CI"))[1] == pytest.approx(hi, abs=1.2)
    table = at.dataframe[1].value
    assert list(table["ordering"]) == ["random", "distance_mse", "distance_cosine"]  # no competing "best" of its own
    # a rotation is not better on its own: the plan's one decision, shown under the verdict, recommends no backfill
    assert unplain(at.info[0].value).startswith("Decision: do not ship. v2 is not better than v1 on its own")
    assert "Fit adapters" in [b.label for b in at.button]
    at.button(key="up_fit_adapters").click().run()
    (job,) = [j for j in jobs(app_db) if j.kind == "adapters"]
    assert job.experiment_id == exp and job.payload["kind"] == "perp"


def test_too_close_to_call_pair(app_db):
    stored(app_db, close_pair)
    at = open_upgrade()
    d, lo, hi = by_hand(close_pair)
    assert d.mean() == 0 and lo < 0 < hi  # ten -1 and ten +1: the interval contains 0
    assert at.warning[0].value.startswith("Too close to call whether v2 \\(step 2\\) is compatible")
    shown_lo, shown_hi = points(shown(at, "95% CI"))
    # two classes with one gallery item each: resampling the gallery too (the default) widens the interval a lot
    engine = check_upgrade(*close_pair(), names=("v1", "v2"), orderings=(), resamples=1000).compatibility
    assert shown_lo < 0 < shown_hi and (shown_lo, shown_hi) == pytest.approx((100 * engine.lo, 100 * engine.hi), abs=0.051)
    assert "contains 0. More queries would decide it, or a non-inferiority margin of" in texts(at)


def test_compute_button_queues_an_upgrade_analysis(app_db):
    exp = stored(app_db, compatible_pair, compute=False)
    at = open_upgrade()
    at.button(key="up_compute").click().run()
    (job,) = [j for j in jobs(app_db) if j.kind == "analysis"]
    assert job.payload == {"experiment_id": exp, "kind": "upgrade", "params": {**PARAMS, "margin": 0.0, "ties": "fail"}}


def test_the_margin_reaches_the_stored_check(app_db):
    """The page's margin goes into the upgrade analysis's params; the worker's check judges with it (the stored
    report's margin and rule name) and the page names the rule. The close pair's gain is 0: strict ECC cannot pass
    it, a margin the interval's lower end clears does."""
    exp = stored(app_db, close_pair, compute=False)
    at = open_upgrade()
    at.number_input(key="up_rule_margin").set_value(60.0).run()
    at.button(key="up_compute").click().run()
    (job,) = [j for j in jobs(app_db) if j.kind == "analysis"]
    assert job.payload["params"] == {**PARAMS, "margin": 60.0, "ties": "fail"}
    assert run_one(get_engine(app_db), kinds=["analysis"]) == job.id
    with session_scope(get_engine(app_db)) as s:
        report = load_analysis(s, exp, "upgrade", analysis_key("upgrade", job.payload["params"])).payload["report"]
    c = report["compatibility"]
    assert report["margin"] == 60.0 and report["rule"].startswith("non-inferiority margin 60 points")
    assert c["diff"] == 0 and -0.6 < c["lo"] < 0  # the interval's lower end clears -60 points: compatible by hand
    assert report["verdict"] == "compatible"
    queries.jobs.clear()
    at.run()
    assert not at.exception, at.exception
    assert at.success[0].value.startswith("v2 \\(step 2\\) is compatible") and "Rule: non-inferiority margin 60" in texts(at)


def test_renaming_a_model_shows_the_new_name(app_db):
    stored(app_db, compatible_pair)
    at = open_upgrade()
    at.text_input(key="up_name_new").set_value("v2-large")
    at.button(key="up_rename").click().run()
    assert not at.exception
    assert at.success[0].value.startswith("v2\\-large \\(step 2\\) is compatible with v1")


def test_backfilling_page_names_the_ordering_with_the_largest_area(app_db):
    """The Backfilling page's summary names the ordering of largest M-tilde under the metric that does not flatter
    (mAP, quoted first), not the fastest to reach; the need is quoted per metric, Recall@1's artefact explained."""
    from support.app_synthetic import fill_study

    study = fill_study(app_db, steps=3)
    at = open_page("backfilling")
    at.selectbox(key="bf_experiment").set_value(1).run()  # the experiment with stored curves
    table = at.dataframe[0].value
    assert list(table.columns[1:3]) == ["M̃ mAP %", "mAP: backfilled to match new"]
    areas = dict(zip(table["ordering"], table["M̃ mAP %"]))
    best = max(areas, key=areas.get)
    assert study and f"**{best}** has the largest area under its mAP curve" in texts(at)
    (needs,) = [m.value for m in at.markdown if m.value.startswith("In that order, per metric")]
    assert needs.index("mAP:") < needs.index("Recall@1:")
    reach = dict(zip(table["ordering"], table["mAP: backfilled to match new"]))[best]
    expected = "never reaches" if reach != reach or reach is None else f"after {100 * reach:.0f}% of the gallery"
    assert "mAP: " in needs and expected in needs.split(";")[0]
    assert any("Recall@1 flatters backfilling" in c.value for c in at.caption)
    # what to do is not this page's to say: without a stored upgrade check it points to the one decision
    assert any("is the Upgrade check's one decision" in c.value for c in at.caption)


def test_compatibility_page_shows_views_side_by_side_and_model_names(app_db):
    """A PSP matrix next to the encoder one: one table with both views' AC / AA / ACA; matrices use the models' names."""
    from support.app_synthetic import fill_study

    from engine.metrics import average_accuracy, average_compatibility
    from storage import list_model_versions, rename_model_version, save_matrix

    study = fill_study(app_db, steps=3)
    exp = study["experiments"]["bct"]
    P = np.array([[0.6, np.nan, np.nan], [0.5, 0.7, np.nan], [0.65, 0.72, 0.8]])  # 1 of 3 cross-tests fails (0.5 < 0.6)
    with session_scope(get_engine(app_db)) as s:
        counts = np.where(np.isnan(P), 0, 10)
        save_matrix(s, exp, metric="recall@1", gallery_kind="instance", view="psp", values=P, valid_queries=counts,
                    no_positive=np.zeros_like(counts), summary={"AC": 2 / 3, "AA": average_accuracy(P), "ACA": None})
        rename_model_version(s, list_model_versions(s, exp)[0].id, "v1")
    at = open_page("compatibility")
    (table,) = [d.value for d in at.dataframe if "psp · AC %" in d.value.columns]
    row = table.set_index("method").loc["bct"]  # every table in percent (AC included)
    assert row["psp · AC %"] == pytest.approx(100 * 2 / 3) and row["psp · failing cross-tests"] == 1
    assert row["psp · AA %"] == pytest.approx(100 * np.nanmean(P[np.tril_indices(3)]))
    assert row["encoder · AC %"] == pytest.approx(100 * average_compatibility(study["matrices"]["bct"]))
    assert "v1" in str(at.get("vega_lite_chart")[-1].proto.spec)


def shown_text(element) -> str:
    """A markdown element's text as read: without plain()'s escapes and word joiners."""
    return element.value.replace("\\", "").replace("\u2060", "")


def test_backfill_needs_are_quoted_per_metric_with_map_first(app_db):
    """The Upgrade check quotes the backfilling needed under every stored metric, mAP first, each from its own
    stored verdict (best ordering's fraction reaching the old self-test), and explains Recall@1's artefact."""
    from engine.jobs.analysis import run_analysis as run

    exp = stored(app_db, incompatible_pair)
    at = open_upgrade()
    (only,) = [shown_text(m) for m in at.markdown if "Backfilling needed\\, per metric" in m.value]
    assert "Recall@1: " in only and "mAP, which does not flatter, is not computed yet" in only
    run(get_engine(app_db), exp, "upgrade", {**PARAMS, "metric": "map"})
    with session_scope(get_engine(app_db)) as s:
        from storage import load_analysis
        from engine.core.contract import analysis_key

        reports = {m: load_analysis(s, exp, "upgrade", analysis_key("upgrade", {**PARAMS, "metric": m})).payload["report"]
                   for m in ("recall@1", "map")}
    at = open_upgrade()
    (line,) = [shown_text(m) for m in at.markdown if "Backfilling needed\\, per metric" in m.value]
    assert line.index("mAP: ") < line.index("Recall@1: ") and "not computed yet" not in line
    for m, name in (("map", "mAP"), ("recall@1", "Recall@1")):
        rep = reports[m]
        if not rep["backfill"]:
            assert f"{name}: no backfilling needed ({rep['verdict']})" in line
            continue
        # the plan's rule: the ordering that reaches the old self-test with the fewest items (then the larger area)
        reaching = [n for n in rep["backfill"] if n["to_old_self"] is not None]
        x = min(reaching, key=lambda n: (n["to_old_self"], -n["area"]))["to_old_self"] if reaching else None
        said = "never reaches v1 (step 1)'s self-test" if x is None else f"after {100 * x:.0f}% of the gallery"
        assert said in line.split(f"{name}: ")[1].split(";")[0]
    assert any("Recall@1 flatters backfilling" in c.value for c in at.caption)
