"""Post-hoc maps new -> old (engine/adapters/posthoc.py): each against an independent solution, the ONNX graph against
the in-product map, and the recovery curve's cells against hand-checkable cases (a rotated copy of a space)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from sklearn.linear_model import Ridge

from engine.adapters.onnx_graph import onnx_model
from engine.adapters.posthoc import POSTHOC, fit_map, l2_rows, options_for, procrustes_weight
from engine.adapters.recovery import Scorer, fit_on_pairs, pair_counts, recovery_curve, split_items
from engine.sources import Joined



def orthogonal(d: int, seed: int) -> np.ndarray:
    return np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))[0]


def test_procrustes_on_a_hand_made_case_is_the_rotation_and_equals_scipy():
    new = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, -1.0]])
    quarter_turn = np.array([[0.0, 1.0], [-1.0, 0.0]])  # (x, y) -> (-y, x) as a row map x @ W
    old = new @ quarter_turn
    m = fit_map("procrustes", new, old, normalise="none")
    np.testing.assert_allclose(m.tensors["weight"], quarter_turn, atol=1e-6)
    np.testing.assert_allclose(m.tensors["weight"], scipy.linalg.orthogonal_procrustes(new, old)[0], atol=1e-6)
    np.testing.assert_allclose(m.apply(new), old, atol=1e-6)


def test_procrustes_equals_scipy_on_noisy_data_and_with_zero_padding():
    rng = np.random.default_rng(0)
    new, old = rng.standard_normal((300, 12)), rng.standard_normal((300, 12))
    np.testing.assert_allclose(procrustes_weight(new, old), scipy.linalg.orthogonal_procrustes(new, old)[0], atol=1e-10)
    for dn, do in ((12, 8), (8, 12)):  # widths differ: "pad" is scipy's rotation of the zero-padded arrays, cut
        n, o = rng.standard_normal((300, dn)), rng.standard_normal((300, do))
        width = max(dn, do)
        pad = lambda x: np.hstack([x, np.zeros((len(x), width - x.shape[1]))])  # noqa: E731
        r = scipy.linalg.orthogonal_procrustes(pad(n), pad(o))[0]
        np.testing.assert_allclose(procrustes_weight(n, o, "pad"), r[:dn, :do], atol=1e-10)
        w = procrustes_weight(n, o, "project")
        small = w.T @ w if dn > do else w @ w.T  # semi-orthogonal either way
        np.testing.assert_allclose(small, np.eye(min(dn, do)), atol=1e-10)


def test_both_dim_rules_recover_an_embedding_of_the_old_space_in_a_wider_new_one():
    rng = np.random.default_rng(1)
    old = rng.standard_normal((400, 6))
    q = orthogonal(9, 2)
    new = np.hstack([old, np.zeros((400, 3))]) @ q  # the old space, rotated inside a 9-d space
    for rule in ("pad", "project"):
        m = fit_map("procrustes", new, old, normalise="none", options={"dim_mismatch": rule})
        np.testing.assert_allclose(m.apply(new), old, atol=1e-5)


def test_ridge_affine_equals_sklearn_ridge_and_least_squares():
    rng = np.random.default_rng(3)
    new = rng.standard_normal((500, 10))
    old = new @ rng.standard_normal((10, 7)) + 0.3 + 0.1 * rng.standard_normal((500, 7))
    for ridge in (0.0, 0.5, 20.0):
        m = fit_map("affine", new, old, normalise="none", options={"ridge": ridge})
        ref = Ridge(alpha=ridge, fit_intercept=True, solver="svd").fit(new, old) if ridge else None
        if ref is None:  # least squares with a column of ones
            coef = np.linalg.lstsq(np.hstack([new, np.ones((500, 1))]), old, rcond=None)[0]
            weight, bias = coef[:-1], coef[-1]
        else:
            weight, bias = ref.coef_.T, ref.intercept_
        np.testing.assert_allclose(m.tensors["weight"], weight, atol=1e-5)
        np.testing.assert_allclose(m.tensors["bias"], bias, atol=1e-5)


def test_one_cluster_is_global_procrustes_and_two_clusters_fit_two_rotations():
    rng = np.random.default_rng(4)
    old = rng.standard_normal((300, 5))
    new = old @ orthogonal(5, 5)
    one = fit_map("cluster", new, old, options={"clusters": 1})
    glob = fit_map("procrustes", new, old)
    np.testing.assert_allclose(one.apply(new), glob.apply(new), atol=1e-6)
    # two far-apart groups of old vectors, each seen through its own rotation
    centre = np.zeros(5)
    centre[0] = 8.0
    a, b = centre + 0.3 * rng.standard_normal((200, 5)), -centre + 0.3 * rng.standard_normal((200, 5))
    qa, qb = orthogonal(5, 6), orthogonal(5, 7)
    old2, new2 = np.vstack([a, b]), np.vstack([a @ qa, b @ qb])
    for routing in ("hard", "soft"):
        m = fit_map("cluster", new2, old2, normalise="none",
                    options={"clusters": 2, "min_members": 10, "routing": routing, "temperature": 0.01})
        stacked = m.tensors["stack"].reshape(5, 2, 5)
        found = {int(np.argmin([np.abs(stacked[:, c, :] - q).max() for c in range(2)])) for q in (qa, qb)}
        assert found == {0, 1}  # each rotation is one cluster's map
        err_cluster = np.abs(m.apply(new2) - old2).max()
        err_global = np.abs(fit_map("procrustes", new2, old2, normalise="none").apply(new2) - old2).max()
        assert err_cluster < 1e-4 < err_global


def test_mlp_is_seeded_and_fits_a_bent_map_better_than_procrustes():
    rng = np.random.default_rng(8)
    new = rng.standard_normal((1500, 8))
    old = new @ orthogonal(8, 9) + 0.5 * np.maximum(new[:, :1], 0)  # a rotation plus a bend
    opts = {"rank": 16, "epochs": 40, "lr": 3e-3, "seed": 3}
    a, b = (fit_map("mlp", new, old, normalise="none", options=opts) for _ in range(2))
    for name in a.tensors:
        np.testing.assert_array_equal(a.tensors[name], b.tensors[name])
    mse = lambda m: float(((m.apply(new) - old) ** 2).sum(1).mean())  # noqa: E731
    assert mse(a) < 0.5 * mse(fit_map("procrustes", new, old, normalise="none"))


@pytest.mark.parametrize("kind,options", [("procrustes", {}), ("procrustes", {"dim_mismatch": "project"}),
                                          ("affine", {"ridge": 0.1}), ("cluster", {"clusters": 3, "min_members": 5}),
                                          ("cluster", {"clusters": 3, "min_members": 5, "routing": "soft"}),
                                          ("mlp", {"rank": 8, "epochs": 3})])
@pytest.mark.parametrize("normalise", ["l2", "none"])
def test_the_onnx_graph_equals_the_in_product_map(kind, options, normalise):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(10)
    new, old = rng.standard_normal((400, 12)).astype(np.float32), rng.standard_normal((400, 9)).astype(np.float32)
    m = fit_map(kind, new, old, normalise=normalise, options=options)
    session = ort.InferenceSession(onnx_model(m).SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.vstack([rng.standard_normal((64, 12)).astype(np.float32), np.zeros((1, 12), np.float32)])  # a zero row too
    got = session.run(None, {"new": x})[0]
    assert got.shape == (65, 9)
    np.testing.assert_allclose(got, m.apply(x), atol=1e-5)


def test_options_are_strict():
    assert set(POSTHOC) == {"procrustes", "affine", "cluster", "mlp"}
    assert options_for("cluster", {"clusters": "4", "routing": "soft"}).clusters == 4
    assert options_for("affine", {"ridge": "0.25"}).ridge == 0.25
    with pytest.raises(ValueError, match="unknown option.*lam.*takes ridge"):
        options_for("affine", {"lam": 1})
    with pytest.raises(ValueError, match="option clusters must be int"):
        options_for("cluster", {"clusters": "many"})
    with pytest.raises(ValueError, match="routing must be 'hard' or 'soft'"):
        options_for("cluster", {"routing": "nearest"})
    with pytest.raises(ValueError, match="unknown adapter kind 'rotate'"):
        options_for("rotate", {})
    with pytest.raises(ValueError, match="same samples"):
        fit_map("procrustes", np.ones((5, 3)), np.ones((6, 3)))
    with pytest.raises(ValueError, match="clusters=9 is more than the 5 pairs"):
        fit_map("cluster", np.random.default_rng(0).standard_normal((5, 3)), np.ones((5, 3)), options={"clusters": 9})


def test_l2_rows_keeps_a_zero_row_zero():
    x = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    np.testing.assert_allclose(l2_rows(x), [[0.6, 0.8], [0.0, 0.0]])


# --------------------------------------------------------------------------------------------- recovery curve
def clustered(n: int, d: int, seed: int, *, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    return (rng.standard_normal((classes, d)) * 2)[labels] + rng.standard_normal((n, d)), labels


def test_a_rotated_copy_is_recovered_exactly_adapted_old_equals_old_old():
    old, labels = clustered(1200, 16, 11)
    new = old @ orthogonal(16, 12)
    items = Joined(np.arange(1200) * 2, old.astype(np.float32), new.astype(np.float32), labels)
    split = split_items(items, held_out=200, seed=0)
    for relevance in ("labels", "none"):
        scorer = Scorer(split, relevance=relevance, resamples=100)
        m, _ = fit_on_pairs(split, "procrustes", 300)
        adapted = m.apply(split.queries.new)
        np.testing.assert_allclose(adapted, l2_rows(split.queries.old), atol=1e-5)
        values = scorer._values(scorer._top(adapted, split.gallery.old))
        np.testing.assert_array_equal(values, scorer.old_old)  # query by query, not only on average
        s = scorer.score(adapted)
        assert s["adapted/old"] == pytest.approx(scorer.baselines()["old/old"])
        assert s["vs old/old"] == {"diff": 0.0, "lo": 0.0, "hi": 0.0}
        if relevance == "none":
            assert scorer.baselines()["new/new"] == 1.0  # the new model's own top-k is the reference


def test_the_split_holds_queries_out_and_pairs_grow_nested():
    old, labels = clustered(500, 6, 13)
    items = Joined(np.arange(500), old.astype(np.float32), old.astype(np.float32), labels)
    split = split_items(items, held_out=100, seed=5)
    assert len(split.queries.ids) == 100 and len(split.gallery.ids) == 400
    assert not set(split.queries.ids) & set(split.gallery.ids)
    assert pair_counts([250, 500, 1000, 50], 400) == [50, 250, 400]  # capped by the gallery, once
    first = set(split.fit_order[:250].tolist())
    assert first <= set(split.fit_order[:400].tolist())
    with pytest.raises(ValueError, match="--held-out must be between 1 and 499"):
        split_items(items, held_out=500)


def test_recovery_curve_rows_carry_shares_intervals_and_times():
    old, labels = clustered(900, 10, 14)
    rng = np.random.default_rng(15)
    new = np.hstack([old, rng.standard_normal((900, 4))]) @ orthogonal(14, 16) + 0.5 * rng.standard_normal((900, 14))
    items = Joined(np.arange(900), old.astype(np.float32), new.astype(np.float32), labels)
    split = split_items(items, held_out=150, seed=1)
    scorer = Scorer(split, resamples=200)
    curve = recovery_curve(split, scorer, [("procrustes", {}), ("affine", {"ridge": 1.0})], grid=[50, 200, 5000])
    assert curve["pair_counts"] == [50, 200, 750] and len(curve["rows"]) == 6
    b = curve["baselines"]
    assert b["new/old"] is None  # 14-d queries cannot search a 10-d index without a map
    for row in curve["rows"]:
        assert row["share of old/old"] == pytest.approx(row["adapted/old"] / b["old/old"])
        assert row["share of new/new"] == pytest.approx(row["adapted/old"] / b["new/new"])
        v = row["vs old/old"]
        assert v["lo"] <= v["diff"] <= v["hi"]
        assert v["diff"] == pytest.approx(row["adapted/old"] - b["old/old"])
        assert row["fit_seconds"] >= 0 and row["apply_us_per_query"] > 0
