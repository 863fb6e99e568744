"""The five remedies side by side on a real upgrade (issue 42): MiniLM L3 -> L6 on WordNet example -> definition
(1,000 queries x 4,000 definitions, each query's one relevant item its own synset's definition, as labels), embedded
offline. The plan lists query-side adapter, corpus transform, cascade at N, backfill and full re-embedding, each with
its verdict, interval and costs, and its decision is the cheapest passing one; docs/decision.md quotes the figures."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.metrics.compatibility import CellFeatures
from engine.upgrade.plan import REMEDIES, REMEDY_DECISION, cheapest_passing, migration_plan

pytestmark = pytest.mark.slow


def wordnet_cells(*, queries: int, gallery: int) -> tuple[CellFeatures, CellFeatures]:
    """L3 (old) and L6 (new) embeddings of a seeded WordNet qrels sample, the qrels as labels; skips without WordNet
    or the offline text models."""
    from engine.data.wordnet import WORDNET_ROOT, wordnet_task
    from engine.models.text_models import load_text_model, missing_text_models

    if not (Path(WORDNET_ROOT) / "data.noun").is_file():
        pytest.skip("WordNet is not installed (apt-get install wordnet-base)")
    if missing := missing_text_models(("minilm_l3", "minilm_l6")):
        pytest.skip(f"the offline text models are not installed ({', '.join(missing)})")
    task = wordnet_task(queries=queries, gallery=gallery)
    q_labels, g_labels = task.relevance_labels("qrels")
    cells = []
    for name in ("minilm_l3", "minilm_l6"):
        model = load_text_model(name, device="cpu")
        cells.append(CellFeatures(model.encode(task.query_texts), q_labels, model.encode(task.gallery_texts), g_labels))
    return cells[0], cells[1]


def test_the_wordnet_upgrade_plan_shows_the_five_remedies_with_intervals_and_costs():
    from engine.upgrade.migration import plan_inputs
    from engine.upgrade.verdict import check_upgrade

    old, new = wordnet_cells(queries=1000, gallery=4000)
    report = check_upgrade(old, new, names=("L3", "L6"))
    assert (report.verdict, report.better.verdict) == ("not compatible", "better")
    got = plan_inputs(old, new, report)
    options = got.plan.options
    assert {o["remedy"] for o in options} == set(REMEDIES)
    for o in options:
        assert o["one_time"] and o["per_query"] and o["cost"]
        if o["remedy"] != "backfill":  # a backfill's fraction is read off one curve, without an interval
            assert o["lo"] <= o["diff"] <= o["hi"] and 0.9 < o["level"] < 1
    assert next(o for o in options if o["remedy"] == "corpus transform")["one_time"]["vectors"] == 4000
    cascade = next(o for o in options if o["remedy"] == "cascade")
    assert cascade["per_query"]["embeddings"] == got.cascade["n"] and len(got.cascade["curve"]) == 7
    picked = cheapest_passing(options, got.plan.queries)
    assert picked is not None and (got.plan.decision, got.plan.remedy) == (REMEDY_DECISION[picked["remedy"]],
                                                                          picked["name"])
    # at the default horizon (4,000 queries) a cascade's re-scorings cost more than the full re-embedding, which passes
    assert got.plan.queries == 4000 and picked["remedy"] != "cascade"
    low = migration_plan(report.to_json(), adapters=got.adapters, rollouts=got.rollouts, transforms=got.transforms,
                         cascade=got.cascade, queries=100)  # a low traffic: the horizon turns the order
    want = cheapest_passing(options, 100)
    assert (low.decision, low.remedy) == (REMEDY_DECISION[want["remedy"]], want["name"])
    print(low.headline(), "|", low.reason)
    again = migration_plan(report.to_json(), adapters=got.adapters, rollouts=got.rollouts, transforms=got.transforms,
                           cascade=got.cascade)
    assert again.decision == got.plan.decision and again.options == got.plan.options
    md = got.plan.to_markdown()
    assert "## Remedies side by side" in md and md.count("<- recommended") == 1
    print(md)
