"""The migration plan: each decision from hand-made verdicts, and a plan from a real check."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine.metrics.compatibility import CellFeatures
from engine.upgrade.plan import migration_plan
from engine.upgrade.verdict import check_upgrade
from support.upgrade import compatible_pair, incompatible_pair


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


def test_equivalence_within_the_margin_ships_as_is_as_unchanged():
    """TOST: both intervals inside +-1 point with --margin 1 read 'unchanged within +-1 points' (a re-export)."""
    report = {**_report(_v("compatible", -0.001, -0.005, 0.004), _v("too close to call", 0.0, -0.004, 0.003)),
              "margin": 1.0}
    plan = migration_plan(report)
    assert (plan.decision, plan.success) == ("ship as is", "unchanged")
    assert plan.reason.startswith("v2 is unchanged within +-1 points") and "two one-sided tests" in plan.reason
    wider = {**report, "better": _v("too close to call", 0.0, -0.004, 0.012)}  # +1.2 points is outside the margin
    assert migration_plan(wider).decision == "do not ship yet"


def test_a_too_close_plan_names_the_margin_that_would_decide_it():
    """Strict ECC on the same intervals: too close to call on its own; the plan names the smallest margin (to 0.1
    point, above the interval's farthest end) under which two one-sided tests would call v2 unchanged."""
    plan = migration_plan(_report(_v("compatible", -0.001, -0.005, 0.004), _v("too close to call", 0.0, -0.004, 0.003)))
    assert plan.decision == "do not ship yet" and plan.margin_to_decide == 0.5
    assert any(n.startswith("with --margin 0.5 (+-0.5 points) two one-sided tests would call v2 unchanged") for n in plan.notes)
    compat = migration_plan(_report(_v("too close to call", -0.01, -0.0234, 0.002), BETTER))
    assert compat.margin_to_decide == 2.4 and any("with --margin 2.4 (a non-inferiority margin" in n for n in compat.notes)


def test_with_a_margin_the_plan_says_parity_not_beat_and_ships_the_adapter_at_parity():
    """--margin 2: v2's raw queries lose 3 points (not compatible), an adapter loses 1 (non-inferior): ship with the
    adapter, worded as parity within the margin."""
    report = {**_report(_v("not compatible", -0.03, -0.045, -0.021), BETTER), "margin": 2.0}
    adapters = [{"name": "procrustes", "compatibility": _v("compatible", -0.01, -0.018, -0.002)}]
    plan = migration_plan(report, adapters=adapters)
    assert plan.headline() == "ship with adapter procrustes" and "score at parity with v1 alone" in plan.reason
    ok = migration_plan({**report, "compatibility": _v("compatible", -0.01, -0.018, -0.002)})
    assert ok.decision == "ship as is" and "at parity with" in ok.reason and "beat" not in ok.reason


def test_a_float16_copy_is_unchanged_within_a_point_end_to_end():
    from engine.upgrade.migration import decide_in_memory

    old, _ = compatible_pair()
    half = CellFeatures(old.query.astype(np.float16).astype(np.float32), old.query_labels,
                        old.gallery.astype(np.float16).astype(np.float32), old.gallery_labels)
    report = check_upgrade(old, half, names=("fp32", "fp16"), metric="map", resamples=300, margin=1.0)
    assert "unchanged within +-1 points of fp32" in report.sentence()
    plan = decide_in_memory(old, half, report).plan
    assert (plan.decision, plan.success) == ("ship as is", "unchanged")
