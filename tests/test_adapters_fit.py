"""Training the adapters on stored features: orthogonality, rotation recovery, dimensions, determinism, files."""
import json
import math

import numpy as np
import pytest
import torch

from engine.adapters.fit import fit_adapters
from engine.adapters.modules import AffineAdapter, OrthogonalAdapter
from engine.adapters.pair import AdapterPair


def clustered(n_classes=12, per_class=20, dim=8, seed=0):
    """Well-separated classes in ``dim`` dimensions (float32) and their labels."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_classes, dim)) * 2.0
    labels = np.repeat(np.arange(n_classes), per_class)
    return (centers[labels] + 0.5 * rng.normal(size=(labels.size, dim))).astype(np.float32), labels


def rotation(dim, seed=1):
    """A random rotation (determinant +1: expm of a skew matrix cannot reach a reflection)."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(dim, dim)))
    if np.linalg.det(q) < 0:
        q[:, 0] *= -1
    return q


def nn_accuracy(query, query_labels, gallery, gallery_labels):
    """Leave-one-out 1-NN accuracy (query i and gallery i are the same image), Euclidean distance."""
    dist = ((query[:, None, :].astype(np.float64) - gallery[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(dist, np.inf)
    return float((gallery_labels[dist.argmin(axis=1)] == query_labels).mean())


FAST = dict(epochs=60, batch_size=64, lr=0.05)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one thread is faster than two contending ones on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def rotated():
    old, labels = clustered()
    r = rotation(old.shape[1])
    return old, (old @ r).astype(np.float32), labels, r


@pytest.fixture(scope="module")
def perp_full(rotated):
    old, new, labels, _ = rotated
    # rotations by angles near pi are far from the identity start: a larger step and more epochs
    return fit_adapters(old, new, labels, kind="perp", epochs=150, batch_size=64, lr=0.1)


def test_backward_perp_stays_orthogonal_after_training(perp_full):
    weight = perp_full.backward_weight().double()
    assert float(torch.linalg.matrix_norm(weight @ weight.T - torch.eye(weight.shape[0], dtype=torch.float64))) < 1e-5
    assert perp_full.describe()["orthogonality_deviation"] < 1e-5
    assert perp_full.history[-1]["orthogonality_deviation"] < 1e-4  # float32 exponential during training


def test_backward_perp_alone_recovers_a_known_rotation(rotated):
    old, new, labels, r = rotated
    pair = fit_adapters(old, new, labels, kind="perp", with_forward=False, epochs=60, batch_size=64, lr=0.1)
    # new = old R, so B must be W = R (x W^T = old R R^T = old)
    assert np.linalg.norm(pair.backward_weight().double().numpy() - r) < 1e-3
    assert np.abs(pair.apply_backward(new) - old).max() < 1e-3
    assert pair.forward is None and pair.describe()["loss_weights"] == [0.0, 1.0, 0.0]


def test_full_objective_recovers_the_rotation_and_cross_test_reaches_the_self_test(rotated, perp_full):
    old, new, labels, r = rotated
    # L_F and L_C also pull B towards the clustered F(old): close to R, not exact
    assert np.linalg.norm(perp_full.backward_weight().double().numpy() - r) < 0.05
    self_test = nn_accuracy(old, labels, old, labels)
    cross_test = nn_accuracy(perp_full.apply_backward(new), labels, old, labels)
    assert cross_test >= self_test
    assert nn_accuracy(perp_full.apply_backward(new), labels, perp_full.apply_forward(old), labels) >= self_test - 0.01
    assert set(perp_full.history[-1]) >= {"forward", "backward", "contrastive", "total"}


@pytest.mark.parametrize(
    ("dim_mismatch", "old_dim", "new_dim", "common"), [("truncate", 10, 6, 6), ("pad", 6, 10, 10)]
)
def test_different_dimensions(dim_mismatch, old_dim, new_dim, common):
    base, labels = clustered(dim=6)
    extra = np.random.default_rng(5).normal(size=(base.shape[0], 4)).astype(np.float32)
    if dim_mismatch == "truncate":
        # old carries 4 extra components after the shared 6; truncation keeps the shared part
        old, new, target = np.hstack([base, extra]), base @ rotation(6), base
    else:
        # new is old embedded in R^10 and rotated; the zero-padded old space is reachable exactly
        old, new = base, np.hstack([base, np.zeros_like(extra)]) @ rotation(10)
        target = np.hstack([base, np.zeros_like(extra)])
    pair = fit_adapters(old, new.astype(np.float32), labels, kind="perp", dim_mismatch=dim_mismatch, **FAST)
    assert (pair.old_dim, pair.new_dim, pair.common_dim) == (old_dim, new_dim, common)
    assert pair.apply_forward(old).shape == (old.shape[0], common)
    assert np.abs(pair.apply_backward(new) - target).max() < 0.1
    query, gallery = pair.match_dims(new, old)
    assert query.shape[1] == gallery.shape[1] == common


def test_lambda_adapter_settles_closer_to_orthogonal_for_smaller_lambda():
    old, labels = clustered()
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    mix = q @ np.diag(np.linspace(0.5, 2.0, 8))  # far from orthogonal: the exact B has ||WW^T - I||_F = 3.4
    new = (old @ mix + 1.0).astype(np.float32)
    deviation = {}
    for lam in (math.inf, 3.0, 1.0):
        pair = fit_adapters(old, new, labels, kind="lambda", lam=lam, alpha=5.0, with_forward=False, **FAST)
        deviation[lam] = pair.describe()["orthogonality_deviation"]
        assert isinstance(pair.backward, AffineAdapter)
    exact = np.linalg.inv(mix).T
    assert deviation[math.inf] == pytest.approx(np.linalg.norm(exact @ exact.T - np.eye(8)), rel=0.05)
    assert deviation[1.0] < deviation[3.0] < 3.0 < deviation[math.inf]


def test_fct_maps_old_features_to_the_raw_new_space():
    old, labels = clustered(dim=6)
    mix = np.random.default_rng(4).normal(size=(6, 9))
    new = (old @ mix).astype(np.float32)
    pair = fit_adapters(old, new, labels, kind="fct", **FAST)
    assert pair.backward is None and pair.common_dim == 9
    assert np.array_equal(pair.apply_backward(new), new)  # no B: the identity
    rel = np.linalg.norm(pair.apply_forward(old) - new) / np.linalg.norm(new)
    assert rel < 0.05
    assert "loss_weights" not in pair.describe() and set(pair.history[0]) == {"fct", "total"}


def test_seeded_training_is_deterministic(rotated):
    old, new, labels, _ = rotated
    settings = dict(kind="lambda", epochs=3, batch_size=32, lr=0.01)
    first = fit_adapters(old, new, labels, seed=7, **settings).state_dict()
    again = fit_adapters(old, new, labels, seed=7, **settings).state_dict()
    other = fit_adapters(old, new, labels, seed=8, **settings).state_dict()
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["forward.weight"], other["forward.weight"])


def test_torch_inputs_progress_and_describe(rotated):
    old, new, labels, _ = rotated
    seen = []
    pair = fit_adapters(
        torch.from_numpy(old), torch.from_numpy(new), torch.from_numpy(labels), epochs=2, batch_size=64,
        progress=lambda epoch, epochs, losses: seen.append((epoch, epochs, sorted(losses))),
    )
    assert [s[:2] for s in seen] == [(1, 2), (2, 2)]
    assert "total" in seen[0][2]
    info = pair.describe()
    json.dumps(info)  # JSON-able
    expected = {
        "kind": "perp", "old_dim": 8, "new_dim": 8, "common_dim": 8, "dim_mismatch": "truncate",
        "with_forward": True, "epochs": 2, "batch_size": 64, "lr": 1e-3, "temperature": 0.1,
        "loss_weights": [1.0, 1.0, 1.0], "mse_reduction": "sum", "seed": 0, "n_train": 240, "n_classes": 12,
    }
    assert {k: info[k] for k in expected} == expected
    assert info["orthogonality_deviation"] < 1e-5


@pytest.mark.parametrize("kind", ["perp", "lambda", "fct"])
def test_save_and_load_round_trip(tmp_path, rotated, kind):
    old, new, labels, _ = rotated
    pair = fit_adapters(old, new, labels, kind=kind, epochs=2, batch_size=64, lr=0.01, lam=4.0)
    path = tmp_path / f"{kind}.safetensors"
    pair.save(path)
    loaded = AdapterPair.load(path)
    assert loaded.describe() == pair.describe()
    assert loaded.history == pair.history
    assert np.array_equal(loaded.apply_forward(old), pair.apply_forward(old))
    assert np.array_equal(loaded.apply_backward(new), pair.apply_backward(new))
    expected_keys = {
        "perp": {"forward.weight", "forward.bias", "backward.A"},
        "lambda": {"forward.weight", "forward.bias", "backward.weight", "backward.bias"},
        "fct": {"forward.weight", "forward.bias"},
    }[kind]
    assert set(pair.state_dict()) == expected_keys
    if kind == "perp":
        assert isinstance(loaded.backward, OrthogonalAdapter)


def test_load_refuses_other_files(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(1)}, str(path), metadata={"format": "something-else"})
    with pytest.raises(ValueError, match="not a Compatibility Lab adapter file"):
        AdapterPair.load(path)
