"""The upgrade verdict (engine.upgrade.verdict) on hand-made old/new feature pairs, checked against numpy by hand."""
from __future__ import annotations

import numpy as np
import pytest

from engine.metrics.compatibility import CellFeatures
from engine.upgrade.verdict import BackfillNeed, backfill_needs, best_ordering, check_upgrade
from support.upgrade import bootstrap_by_hand, close_pair, compatible_pair, hits, incompatible_pair















def test_compatible_pair_matches_a_bootstrap_by_hand():
    old, new = compatible_pair()
    report = check_upgrade(old, new, names=("v1", "v2"), interval="queries")
    d = hits(new, old) - hits(old, old)
    assert report.verdict == "compatible" and report.better.verdict == "better"
    assert report.compatibility.diff == pytest.approx(d.mean(), abs=1e-12)
    assert report.new_old == pytest.approx(hits(new, old).mean()) and report.old_old == pytest.approx(hits(old, old).mean())
    lo, hi = bootstrap_by_hand(d)
    assert 0 < report.compatibility.lo == pytest.approx(lo, abs=0.012)  # Monte-Carlo error of 1,000 resamples ~0.003
    assert report.compatibility.hi == pytest.approx(hi, abs=0.012)
    assert report.backfill == () and report.best_ordering is None
    assert report.sentence().startswith("v2 is compatible with v1: v2 queries against the v1 gallery score Recall@1")


def test_incompatible_pair_and_its_backfill():
    old, new = incompatible_pair()
    report = check_upgrade(old, new, names=("v1", "v2"))
    assert report.verdict == "not compatible" and report.compatibility.hi < 0
    assert report.new_new == report.old_old and report.better.verdict == "not better"  # rotation: identical, [0, 0]
    assert (report.better.lo, report.better.hi) == (0.0, 0.0)
    assert [n.ordering for n in report.backfill] == ["random", "distance_mse", "distance_cosine"]
    for need in report.backfill:
        assert need.values[0] == pytest.approx(report.new_old) and need.values[-1] == pytest.approx(report.new_new)
        assert need.area == pytest.approx(np.trapezoid(need.values, need.fractions))
    assert report.best_ordering == max(report.backfill, key=lambda n: n.area).ordering
    assert "Backfilling" not in report.sentence()  # what to do is the plan's one decision (engine.upgrade.plan), not the verdict's


def test_too_close_to_call():
    old, new = close_pair()
    report = check_upgrade(old, new, names=("v1", "v2"), seed=7, interval="queries")
    d = hits(new, old) - hits(old, old)
    assert sorted(d) == [-1.0] * 10 + [1.0] * 10
    c = report.compatibility
    assert report.verdict == "too close to call" and c.diff == 0 and c.lo < 0 < c.hi
    lo, hi = bootstrap_by_hand(d)
    assert (c.lo, c.hi) == pytest.approx((lo, hi), abs=0.11)  # steps of 0.1 on 20 queries: the 2.5 % end is -0.4 or -0.5
    assert check_upgrade(old, new, names=("v1", "v2"), seed=7, interval="queries").compatibility == c  # seeded
    assert c.needed is None  # mean difference exactly 0: no number of queries decides it
    narrow = check_upgrade(old, new, names=("v1", "v2"), seed=7, level=0.5, resamples=200, interval="queries").compatibility
    assert c.lo < narrow.lo <= narrow.hi < c.hi
    assert report.sentence().startswith("Too close to call whether v2 is compatible with v1")


def test_backfill_fractions_on_a_hand_computed_gallery():
    """Two classes, one gallery item each, in 4-d; every number below is worked out by hand.

    old/old: the class-0 query hits, the class-1 query sits on the class-0 item (0.5). new/old: both
    queries lean towards the wrong old item (0). new/new: both hit (1). With k items re-embedded (any order:
    the case is symmetric) Recall@1 is k/2; k = round(2 beta) is 0 below beta 0.25, 1 up to 0.70, 2 from 0.75.
    """
    e = np.eye(4)
    labels = np.array([0, 1])
    old = CellFeatures(np.stack([e[0], e[0]]), labels, np.stack([e[0], e[1]]), labels)
    new = CellFeatures(np.stack([e[2] + 0.1 * e[1] + 0.01 * e[3], e[3] + 0.1 * e[0] + 0.01 * e[2]]), labels,
                       np.stack([e[2], e[3]]), labels)
    report = check_upgrade(old, new, names=("v1", "v2"), interval="queries")
    assert (report.old_old, report.new_old, report.new_new) == (0.5, 0.0, 1.0)
    assert report.verdict == "too close to call"  # interval [-1, 0] ends on 0: two queries cannot decide it
    needs = backfill_needs(old, new, metric="recall@1", old_self=report.old_old)
    for need in needs:
        assert need.values == [0.0] * 5 + [0.5] * 10 + [1.0] * 6
        assert need.area == pytest.approx(0.0125 + 9 * 0.025 + 0.0375 + 5 * 0.05)  # 0.525
        assert need.to_old_self == pytest.approx(0.25) and need.to_new_self == pytest.approx(0.75)
    assert best_ordering(needs) == "random"  # equal areas: the first listed


def test_best_ordering_is_the_largest_area_not_the_earliest_reach():
    """The Backfilling page ranks by the fraction to reach the new self-test; that can pick the lower area."""
    early_low = BackfillNeed("distance_mse", 0.62, 0.95, 0.95, [0.0, 1.0], [0.0, 1.0])
    late_high = BackfillNeed("random", 0.64, 1.0, 1.0, [0.0, 1.0], [0.0, 1.0])
    assert best_ordering([early_low, late_high]) == "random"
    assert best_ordering([]) is None


@pytest.mark.parametrize("change, message", [
    (lambda o, n: (o, CellFeatures(n.query, n.query_labels[::-1].copy(), n.gallery, n.gallery_labels)), "same query images"),
    (lambda o, n: (o, CellFeatures(n.query[:, :8], n.query_labels, n.gallery[:, :8], n.gallery_labels)), "different dimensions"),
])
def test_mismatched_models_are_refused(change, message):
    old, new = change(*compatible_pair())
    with pytest.raises(ValueError, match=message):
        check_upgrade(old, new, names=("v1", "v2"))


@pytest.mark.parametrize("kwargs, message", [
    ({"names": ("v1", "v1")}, "different names"), ({"names": ("v1",)}, "two model names"),
    ({"names": ("v1", "a\nb")}, "printable"), ({"metric": "verification"}, "unknown metric"),
    ({"resamples": 0}, "resamples"), ({"level": 1.0}, "confidence level"),
])
def test_bad_options_are_refused(kwargs, message):
    old, new = close_pair()
    with pytest.raises(ValueError, match=message):
        check_upgrade(old, new, **{"names": ("v1", "v2"), **kwargs})


def test_the_module_itself_imports_no_torch():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(__file__).resolve().parents[1].joinpath("engine", "upgrade", "verdict.py").read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in names if m.split(".")[0] in ("torch", "numba", "faiss")}
