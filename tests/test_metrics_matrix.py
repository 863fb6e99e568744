"""Compatibility-matrix summaries against hand computations and the papers' published identities."""
import math

import numpy as np
import pytest

from engine.metrics import (aa_curve, ac_curve, average_accuracy, average_compatibility,
                            average_compatibility_accuracy, definition1_check, ecc_pass, update_gain)
from engine.metrics.compatibility import compatibility_matrices, compatibility_matrix
from engine.metrics.retrieval import retrieval_metrics

nan = float("nan")


def test_two_steps_with_ac_one():
    C = np.array([[0.50, nan], [0.60, 0.70]])
    assert average_compatibility(C) == 1.0
    assert average_compatibility_accuracy(C) == pytest.approx(C[1, 0])  # ACA = C[2,1] when AC = 1
    assert average_accuracy(C) == pytest.approx((0.5 + 0.6 + 0.7) / 3)


def test_three_steps_by_hand():
    C = np.array([[0.50, nan, nan], [0.55, 0.60, nan], [0.45, 0.65, 0.70]])
    # cross-tests: (2,1) 0.55 > 0.50 pass; (3,1) 0.45 > 0.50 fail; (3,2) 0.65 > 0.60 pass
    np.testing.assert_array_equal(np.nan_to_num(ecc_pass(C), nan=-1), [[-1, -1, -1], [1, -1, -1], [0, 1, -1]])
    assert average_compatibility(C) == pytest.approx(2 / 3)
    assert average_compatibility_accuracy(C) == pytest.approx((0.55 + 0.65) / 3)
    assert average_accuracy(C) == pytest.approx((0.5 + 0.55 + 0.6 + 0.45 + 0.65 + 0.7) / 6)
    np.testing.assert_allclose(ac_curve(C), [nan, 1.0, 2 / 3], equal_nan=True)
    np.testing.assert_allclose(aa_curve(C), [0.5, (0.5 + 0.55 + 0.6) / 3, average_accuracy(C)])


def test_ecc_is_strict_by_default_with_selectable_tie_rule():
    C = np.array([[0.5, nan], [0.5, 0.9]])
    assert average_compatibility(C) == 0.0
    assert average_compatibility(C, ties="pass") == 1.0
    assert average_compatibility_accuracy(C, ties="pass") == 0.5
    with pytest.raises(ValueError, match="tie rule"):
        average_compatibility(C, ties="maybe")


def test_published_lce_row_aca_normalised_by_all_cross_tests():
    # Paper 000, Table 1a, LCE 5 steps: AC = 0.10 and ACA = 4.63 -> one passing cross-test of 46.3 out of 10
    C = np.tril(np.full((5, 5), 40.0))
    C[np.triu_indices(5, 1)] = nan
    np.fill_diagonal(C, 45.0)
    C[3, 1] = 46.3
    assert average_compatibility(C) == pytest.approx(0.10)
    assert average_compatibility_accuracy(C) == pytest.approx(4.63)


def test_update_gain_cores_example():
    # CoReS Table 2 (phi2, phi1): (0.61 - 0.59) / (0.63 - 0.59) = 0.5
    C = np.array([[0.59, nan], [0.61, 0.63]])
    assert update_gain(C)[1, 0] == pytest.approx(0.5)
    assert math.isnan(update_gain(C)[0, 0]) and math.isnan(update_gain(np.array([[0.5, nan], [0.6, 0.5]]))[1, 0])


def test_undefined_cells_are_skipped_and_single_model_has_no_cross_test():
    C = np.array([[0.5, nan, nan], [nan, 0.6, nan], [0.7, 0.4, 0.8]])  # (2,1) not comparable
    assert average_compatibility(C) == pytest.approx(0.5)
    assert average_accuracy(C) == pytest.approx((0.5 + 0.6 + 0.7 + 0.4 + 0.8) / 5)
    assert math.isnan(average_compatibility(np.array([[0.9]])))
    with pytest.raises(ValueError, match="square"):
        average_accuracy(np.ones((2, 3)))


def _model_sets(T=3, seed=0, n=60, d=6, classes=4):
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(T):
        sets.append(dict(query_features=rng.normal(size=(n, d)).astype(np.float32), query_labels=rng.integers(0, classes, n),
                         gallery_features=rng.normal(size=(n, d)).astype(np.float32), gallery_labels=rng.integers(0, classes, n)))
    return sets


def test_matrix_cells_equal_cell_metrics_and_upper_triangle_is_nan():
    sets = _model_sets()
    res = compatibility_matrices(sets, metrics=("recall@1", "map", "recall@5"))
    for t in range(3):
        for k in range(3):
            if k > t:
                assert math.isnan(res.values["map"][t, k]) and res.valid_queries[t, k] == -1
                continue
            m = retrieval_metrics(sets[t]["query_features"], sets[t]["query_labels"], sets[k]["gallery_features"], sets[k]["gallery_labels"], ks=(1, 5))
            assert res.values["recall@1"][t, k] == m["recall@1"] and res.values["map"][t, k] == m["map"]
            assert res.values["recall@5"][t, k] == m["recall@5"] and res.valid_queries[t, k] == m["n_valid"]
    np.testing.assert_array_equal(compatibility_matrix(sets, metric="map"), res.values["map"])


def test_dimension_mismatch_cells_are_not_comparable_not_zero():
    sets = _model_sets(T=2)
    sets[1] = {**sets[1], "query_features": np.ones((60, 9), np.float32), "gallery_features": np.eye(60, 9, dtype=np.float32)}
    calls = []
    res = compatibility_matrices(sets, metrics=("recall@1",), progress=lambda done, total: calls.append((done, total)))
    assert math.isnan(res.values["recall@1"][1, 0]) and not res.comparable[1, 0]
    assert res.comparable[1, 1] and res.comparable[0, 0]
    assert calls == [(1, 3), (2, 3), (3, 3)]  # the skipped cell counts towards progress too


def test_cells_from_a_callable_for_gallery_dependent_queries():
    sets = _model_sets(T=2)
    calls = []

    def cell(t, k):
        calls.append((t, k))
        from engine.metrics.compatibility import CellFeatures
        return CellFeatures(sets[t]["query_features"], sets[t]["query_labels"], sets[k]["gallery_features"], sets[k]["gallery_labels"])

    res = compatibility_matrices(cell, num_models=2, metrics=("recall@1",))
    assert calls == [(0, 0), (1, 0), (1, 1)]
    np.testing.assert_array_equal(res.values["recall@1"], compatibility_matrix(sets))


def test_definition1_identical_models_satisfy_both_with_equality():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 5)), rng.integers(0, 3, 50)
    out = definition1_check(x, x, y, n_pairs=500)
    assert out["1a_fraction"] == 1.0 and out["1b_fraction"] == 1.0 and out["1a_pairs"] == 500


def test_definition1_counts_against_a_brute_force_loop():
    rng = np.random.default_rng(1)
    old, new, y = rng.normal(size=(12, 3)), rng.normal(size=(12, 3)), rng.integers(0, 3, 12)
    out = definition1_check(old, new, y, n_pairs=20_000, seed=4, distance="euclidean", reference_1b="new")
    d = lambda a, b: np.linalg.norm(a - b)  # noqa: E731
    same = [(i, j) for i in range(12) for j in range(12) if i != j and y[i] == y[j]]
    diff = [(i, j) for i in range(12) for j in range(12) if y[i] != y[j]]
    exp_a = np.mean([d(old[i], new[j]) <= d(old[i], old[j]) for i, j in same])
    exp_b = np.mean([d(old[i], new[j]) >= d(new[i], new[j]) for i, j in diff])
    assert out["1a_fraction"] == pytest.approx(exp_a, abs=0.02)  # 20k uniform samples over the pairs
    assert out["1b_fraction"] == pytest.approx(exp_b, abs=0.02)
    assert definition1_check(old, new, y, seed=4) == definition1_check(old, new, y, seed=4)


def test_definition1_rejects_misaligned_models():
    with pytest.raises(ValueError, match="same images"):
        definition1_check(np.ones((3, 2)), np.ones((4, 2)), [0, 1, 0])


def test_update_gain_only_where_ecc_holds():
    """Γ = (cross - old self) / (new self - old self), by hand, where the cross-test is not below the old self-test;
    a failing cross-test is undefined with its reason (paper 002 reports Γ only where ECC holds)."""
    from engine.metrics.gain import gain_cells, gain_text

    C = np.array([[0.50, np.nan, np.nan], [0.60, 0.70, np.nan], [0.45, 0.70, 0.80]])
    gain, why = gain_cells(C)
    assert gain[1, 0] == pytest.approx((0.60 - 0.50) / (0.70 - 0.50))  # passes: 50 %
    assert gain[2, 1] == pytest.approx(0.0)  # a tie with the old self-test: 0 under either tie rule
    assert np.isnan(gain[2, 0]) and "ECC fails" in why[2][0]  # 45 < 50
    assert gain_text(C, ["M1", "M2", "M3"]) == "M2→M1 50.0 %, M3→M1 undefined (fails ECC), M3→M2 0.0 %"
