"""The migration plan: each decision from hand-made verdicts, and a plan from a real check."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine.metrics.compatibility import CellFeatures
from engine.upgrade.plan import migration_plan
from engine.upgrade.verdict import check_upgrade
from test_upgrade import compatible_pair, incompatible_pair


def rotated_basis() -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(7).normal(size=(16, 16)))
    return q


def _v(verdict: str, diff: float = 0.0, lo: float = 0.0, hi: float = 0.0, needed: int | None = None) -> dict:
    return {"diff": diff, "lo": lo, "hi": hi, "n": 500, "verdict": verdict, "tie": False, "needed": needed}


def _report(compat: dict, better: dict, backfill=()) -> dict:
    return {"old_name": "v1", "new_name": "v2", "metric": "recall@1", "level": 0.95, "n_gallery": 1000,
            "old_old": 0.6, "new_old": 0.5, "new_new": 0.7, "compatibility": compat, "better": better,
            "backfill": list(backfill)}


BETTER = _v("better", 0.1, 0.05, 0.15)
FAILS = _v("not compatible", -0.1, -0.15, -0.05)


def test_not_better_means_do_not_ship_whatever_else():
    plan = migration_plan(_report(_v("compatible", 0.02, 0.01, 0.03), _v("not better", -0.05, -0.08, -0.02)))
    assert plan.decision == "do not ship" and plan.items_to_reembed == 0


def test_compatible_ships_as_is():
    assert migration_plan(_report(_v("compatible", 0.02, 0.01, 0.03), BETTER)).decision == "ship as is"


def test_the_adapter_with_the_highest_lower_end_wins_over_backfilling():
    adapters = [{"name": "affine", "compatibility": _v("compatible", 0.03, 0.005, 0.05)},
                {"name": "procrustes", "compatibility": _v("compatible", 0.02, 0.01, 0.03)},
                {"name": "mlp", "compatibility": _v("too close to call", 0.04, -0.01, 0.09)}]
    plan = migration_plan(_report(FAILS, BETTER, [{"ordering": "random", "to_old_self": 0.3, "area": 0.6}]),
                          adapters=adapters)
    assert (plan.decision, plan.adapter, plan.items_to_reembed) == ("ship with adapter", "procrustes", 0)
    assert "ship with adapter procrustes" in plan.to_markdown()


def test_the_smallest_backfill_fraction_wins_and_costs_its_items():
    rollouts = [{"ordering": "random", "to_old_self": 0.30, "area": 0.6},
                {"ordering": "residual", "adapter": "procrustes", "to_old_self": 0.123, "area": 0.5},
                {"ordering": "class-mean", "to_old_self": None, "area": 0.7}]
    plan = migration_plan(_report(FAILS, BETTER), rollouts=rollouts)
    assert (plan.decision, plan.ordering, plan.adapter) == ("backfill", "residual", "procrustes")
    assert plan.items_to_reembed == 123 and plan.fraction == 0.123
    assert "backfill 12 % in order residual with adapter procrustes" in plan.to_markdown()


def test_unresolved_with_nothing_else_is_do_not_ship_yet_with_the_queries_needed():
    plan = migration_plan(_report(_v("too close to call", 0.0, -0.02, 0.02, needed=4200), BETTER))
    assert plan.decision == "do not ship yet"
    assert "compatibility" in plan.reason and "4,200 queries would decide compatibility" in plan.notes


def test_plans_from_real_checks():
    old, rotated = incompatible_pair()  # a rotated copy: no better on its own, so nothing to ship
    assert migration_plan(check_upgrade(old, rotated, names=("v1", "v2"), resamples=200).to_json()).decision == "do not ship"
    better = compatible_pair()[1]  # the old space with its noise halved: better on its own
    new = CellFeatures(better.query @ rotated_basis(), better.query_labels, better.gallery @ rotated_basis(),
                       better.gallery_labels)
    report = check_upgrade(old, new, names=("v1", "v2"), resamples=200).to_json()
    assert (report["verdict"], report["better"]["verdict"]) == ("not compatible", "better")
    plan = migration_plan(report)
    best = min((b for b in report["backfill"] if b["to_old_self"] is not None), key=lambda b: (b["to_old_self"], -b["area"]))
    assert plan.decision == "backfill" and plan.ordering == best["ordering"]
    assert plan.items_to_reembed == math.ceil(best["to_old_self"] * report["n_gallery"] - 1e-9) > 0
    old, new = compatible_pair()
    assert migration_plan(check_upgrade(old, new, names=("v1", "v2"), resamples=200).to_json()).decision == "ship as is"


def test_the_threshold_line_names_both_models():
    t = {"t_old": 0.62, "precision": 0.9, "recall_old": 0.5, "t_new": 0.48, "precision_new": 0.91, "recall_new": 0.55}
    md = migration_plan(_report(_v("compatible", 0.02, 0.01, 0.03), BETTER), threshold=t).to_markdown()
    assert "similarity threshold: 0.62 under v1 (precision 90.0%, recall 50.0%) -> 0.48 for v2" in md


@pytest.mark.parametrize("verdict", ["compatible", "not compatible"])
def test_the_json_form_round_trips(verdict):
    plan = migration_plan(_report(_v(verdict, 0.02, 0.01, 0.03), BETTER))
    assert plan.to_json()["decision"] == plan.decision


def test_a_new_model_not_judged_on_its_own_still_gets_a_plan():
    plan = migration_plan({**_report(FAILS, {"diff": None, "lo": None, "hi": None, "n": 500, "verdict": "not judged",
                                             "tie": False, "needed": None}), "new_new": None})
    assert plan.decision == "do not ship yet" and plan.numbers["v2 alone vs v1 alone"].startswith("not judged")
