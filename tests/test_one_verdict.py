"""One pair, one interval, one verdict: the stored matrix cell (engine.metrics.compatibility) and check-upgrade
(engine.upgrade.verdict) compute the same interval through engine.metrics.cell_interval and judge it by the same rule.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine.metrics.compatibility import CellFeatures, compatibility_matrices, stored_summary
from engine.metrics.paired import PairedOptions
from engine.metrics.twoway import top_lists, twoway_bootstrap
from engine.results.verdict_words import ALONE_WORDS, verdict_word
from engine.upgrade.verdict import check_upgrade


def _pair(noise: float, seed: int = 0) -> tuple[CellFeatures, CellFeatures]:
    """Old: 8 classes, 30 images each; new: old plus fresh noise of scale ``noise`` (close to call when small)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(8, 12))
    labels = np.repeat(np.arange(8), 30)
    q, g = centers[labels] + 1.2 * rng.normal(size=(2, len(labels), 12))
    old = CellFeatures(q, labels, g, labels)
    return old, CellFeatures(q + noise * rng.normal(size=q.shape), labels, g + noise * rng.normal(size=g.shape), labels)


def _as_set(c: CellFeatures) -> dict:
    return {"query_features": c.query, "query_labels": c.query_labels, "gallery_features": c.gallery,
            "gallery_labels": c.gallery_labels}


@pytest.mark.parametrize("metric, noise, interval", [("recall@1", 0.3, "two-way"), ("recall@1", 2.0, "two-way"),
                                                     ("map", 0.3, "queries")])
@pytest.mark.parametrize("ties", ["fail", "pass"])
def test_the_stored_cell_and_check_upgrade_give_one_interval_and_verdict(metric, noise, interval, ties):
    old, new = _pair(noise)
    result = compatibility_matrices([_as_set(old), _as_set(new)], metrics=(metric,), paired=PairedOptions())
    stored = stored_summary(result, metric, ties=ties)["paired"]
    report = check_upgrade(old, new, names=("v1", "v2"), metric=metric, ties=ties)
    c = report.compatibility
    assert stored["interval"][1][0] == report.interval == interval
    assert (stored["diff"][1][0], stored["lo"][1][0], stored["hi"][1][0]) == pytest.approx((c.diff, c.lo, c.hi), abs=1e-12)
    assert verdict_word(stored["verdict"][1][0]) == report.verdict
    assert stored["rule"] == report.rule.name


def test_the_stored_two_way_interval_is_the_two_way_bootstrap_of_the_cell():
    """Checked against engine.metrics.twoway called directly on the cell's features, seeded as the cell (0, 1, 0)."""
    old, new = _pair(0.5, seed=2)
    result = compatibility_matrices([_as_set(old), _as_set(new)], metrics=("recall@1",), paired=PairedOptions())
    p = result.paired["recall@1"]
    base = top_lists(old.query, old.query_labels, old.gallery, old.gallery_labels, depth=20)
    cross = top_lists(new.query, new.query_labels, old.gallery, old.gallery_labels, depth=20)
    lo, hi = twoway_bootstrap(cross, base, k=1, seed=(0, 1, 0))
    assert (p["lo"][1, 0], p["hi"][1, 0]) == pytest.approx((lo, hi), abs=1e-12)
    assert p["diff"][1, 0] == pytest.approx(result.values["recall@1"][1, 0] - result.values["recall@1"][0, 0], abs=1e-12)


def test_an_unchanged_model_is_a_tie_in_the_matrix_as_in_check_upgrade():
    old, _ = _pair(0.0)
    result = compatibility_matrices([_as_set(old), _as_set(old)], metrics=("recall@1",), paired=PairedOptions())
    for ties, word in (("fail", "too close to call"), ("pass", "compatible")):
        stored = stored_summary(result, "recall@1", ties=ties)["paired"]
        report = check_upgrade(old, old, names=("v1", "v2"), ties=ties)
        assert (stored["lo"][1][0], stored["hi"][1][0]) == (0.0, 0.0) == (report.compatibility.lo, report.compatibility.hi)
        assert verdict_word(stored["verdict"][1][0]) == report.verdict == word


def test_the_two_way_interval_of_features_near_the_float32_maximum_is_that_of_the_same_directions():
    """Unit rows are taken in float64: at 3e38 a float32 norm overflows to inf and every similarity became 0."""
    old, new = _pair(0.5, seed=4)
    big = np.finfo(np.float32).max / 4
    scale = lambda c: CellFeatures((c.query / np.abs(c.query).max() * big).astype(np.float32), c.query_labels,  # noqa: E731
                                   (c.gallery / np.abs(c.gallery).max() * big).astype(np.float32), c.gallery_labels)
    small = check_upgrade(old, new, names=("v1", "v2")).compatibility
    large = check_upgrade(scale(old), scale(new), names=("v1", "v2")).compatibility
    assert (large.diff, large.lo, large.hi) == pytest.approx((small.diff, small.lo, small.hi), abs=1e-12)


def test_a_stored_verification_interval_resamples_images_not_pairs():
    """The stored cell equals the hierarchical bootstrap over the pairs' images, called directly, and is wider than
    resampling the 6,000 pairs as if independent (they reuse 480 images)."""
    from engine.metrics.hierarchical import SeedItems, hierarchical_bootstrap
    from engine.metrics.paired import paired_bootstrap
    from engine.metrics.verification import pair_verification, sample_pairs

    old, new = _pair(1.0, seed=5)
    result = compatibility_matrices([_as_set(old), _as_set(new)], metrics=("verification",), paired=PairedOptions())
    p = stored_summary(result, "verification")["paired"]
    assert p["interval"][1][0] == "images"
    _, self_ok = pair_verification(old.query, old.query_labels, old.gallery, old.gallery_labels)
    _, cross_ok = pair_verification(new.query, new.query_labels, old.gallery, old.gallery_labels)
    qi, gi, _ = sample_pairs(old.query_labels, old.gallery_labels)
    images = np.stack([qi, len(old.query_labels) + gi], axis=1)  # query and gallery images: two id ranges
    d = (cross_ok.astype(float) - self_ok)[:, None]
    want = hierarchical_bootstrap([SeedItems(d, images)], lambda m: m[:, 0], seed=(0, 1, 0))
    assert (p["diff"][1][0], p["lo"][1][0], p["hi"][1][0]) == pytest.approx((want.value, want.lo, want.hi), abs=1e-12)
    _, lo, hi = paired_bootstrap(cross_ok.astype(float), self_ok.astype(float), seed=0)
    assert p["hi"][1][0] - p["lo"][1][0] > 1.2 * (hi - lo)


@pytest.mark.parametrize("metric, noise", [("recall@1", 0.3), ("recall@1", 2.0), ("map", 0.3)])
def test_on_its_own_in_the_matrix_is_check_upgrades_better_line(metric, noise):
    """``PairedOptions(on_its_own=True)``: each cross-test also carries model t's self-test against model k's, the
    interval and verdict check-upgrade prints "on its own"; the cross-test's own interval does not move."""
    old, new = _pair(noise)
    sets = [_as_set(old), _as_set(new)]
    plain = stored_summary(compatibility_matrices(sets, metrics=(metric,), paired=PairedOptions()), metric)["paired"]
    stored = stored_summary(compatibility_matrices(sets, metrics=(metric,), paired=PairedOptions(on_its_own=True)),
                            metric)["paired"]
    report = check_upgrade(old, new, names=("v1", "v2"), metric=metric)
    b, alone = report.better, stored["alone"]
    assert (alone["diff"][1][0], alone["lo"][1][0], alone["hi"][1][0]) == pytest.approx((b.diff, b.lo, b.hi), abs=1e-12)
    assert alone["n"][1][0] == b.n
    assert ALONE_WORDS[alone["verdict"][1][0]] == b.verdict
    assert (stored["diff"], stored["lo"], stored["hi"]) == (plain["diff"], plain["lo"], plain["hi"])
    assert "alone" not in plain


def test_on_its_own_with_different_galleries_resamples_the_queries():
    """Steps whose galleries differ (other images, other sizes) have no shared gallery to resample: model 2's self-test
    against model 1's is the paired bootstrap over the queries, as called directly on the two self-tests' hits."""
    from engine.metrics.cell_interval import cell_seed, paired_intervals
    from engine.metrics.compatibility import cell_outcomes

    rng = np.random.default_rng(3)
    labels = np.repeat(np.arange(4), 10)
    q1, q2 = rng.normal(size=(2, 40, 5))
    g1, g2 = rng.normal(size=(30, 5)), rng.normal(size=(36, 5))
    gl1, gl2 = np.repeat(np.arange(4), [8, 7, 8, 7]), np.repeat(np.arange(4), 9)
    one, two = CellFeatures(q1, labels, g1, gl1), CellFeatures(q2, labels, g2, gl2)
    result = compatibility_matrices([_as_set(one), _as_set(two)], metrics=("recall@1",),
                                    paired=PairedOptions(on_its_own=True))
    alone = result.paired["recall@1"]["alone"]
    _, old = cell_outcomes(one, "recall@1")
    _, new = cell_outcomes(two, "recall@1")
    want = paired_intervals(old, [new], seed=cell_seed(0, 1, 0), resamples=1000, confidence=0.95,
                            bound_unchanged=[False])[0]
    assert (alone["diff"][1, 0], alone["lo"][1, 0], alone["hi"][1, 0]) == pytest.approx((want.diff, want.lo, want.hi), abs=1e-12)
