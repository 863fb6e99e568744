"""model.dsimplex_normalization: the three scalings of the d-Simplex against numpy, the config's refusals, and the
run's d-Simplex head built with the configured one."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from engine.core import vocab
from engine.core.config import config_from_dict
from engine.methods import build_method
from engine.models import dsimplex_prototypes
from engine.models.heads import DSIMPLEX_NORMALIZATIONS
from engine.run.pipeline import _new_model


def _vertices(K: int) -> np.ndarray:
    """P2 Eq. 10 in numpy: e_1..e_{K-1} and (1 - sqrt(K)) / (K - 1) * (1, ..., 1), not centred."""
    v = np.zeros((K, K - 1))
    v[:-1] = np.eye(K - 1)
    v[-1] = (1 - math.sqrt(K)) / (K - 1)
    return v


def _by_hand(K: int, normalization: str) -> np.ndarray:
    v = _vertices(K)
    if normalization == "frobenius_uncentred":  # cores-compatibility src/cores/model.py: divide, then centre
        v = v / np.linalg.norm(v)
        return v - v.mean(axis=0)
    v = v - v.mean(axis=0)
    if normalization == "row":  # iamcl2r / CL2R code
        return v / np.linalg.norm(v, axis=1, keepdims=True)
    return v / np.linalg.norm(v)  # paper 001 App. D


@pytest.mark.parametrize("K", [2, 10, 100])
@pytest.mark.parametrize("normalization", DSIMPLEX_NORMALIZATIONS)
def test_each_scaling_matches_numpy_and_keeps_the_geometry(K, normalization):
    W = dsimplex_prototypes(K, normalization).double().numpy()
    np.testing.assert_allclose(W, _by_hand(K, normalization), atol=1e-7)
    unit = W / np.linalg.norm(W, axis=1, keepdims=True)
    off = (unit @ unit.T)[~np.eye(K, dtype=bool)]
    np.testing.assert_allclose(off, -1 / (K - 1), atol=1e-6)  # the same simplex whatever the scale


@pytest.mark.parametrize("K", [2, 10, 100])
def test_the_prototype_norms_are_the_hand_computed_ones(K):
    v = (1 - math.sqrt(K)) / (K - 1)
    # centred vertices of a regular simplex of edge sqrt(2) lie at the circumradius sqrt((K-1)/K); the uncentred
    # matrix has Frobenius norm sqrt((K-1)(1 + v^2)); so CoReS's prototypes have norm 1 / sqrt(K (1 + v^2))
    expected = {"row": 1.0, "frobenius": 1 / math.sqrt(K), "frobenius_uncentred": 1 / math.sqrt(K * (1 + v * v))}
    for normalization, norm in expected.items():
        W = dsimplex_prototypes(K, normalization).double().numpy()
        np.testing.assert_allclose(np.linalg.norm(W, axis=1), norm, rtol=1e-6)
    assert np.linalg.norm(dsimplex_prototypes(K, "frobenius").double().numpy()) == pytest.approx(1.0)
    if K == 100:  # the docstring's figures: 0.4 % below 1/sqrt(K) at K = 100, 2.8 % at K = 10
        assert 1 - expected["frobenius_uncentred"] * math.sqrt(K) == pytest.approx(0.0041, abs=5e-5)
    if K == 10:
        assert 1 - expected["frobenius_uncentred"] * math.sqrt(K) == pytest.approx(0.0277, abs=5e-5)


def test_vocabulary_names_the_heads_scalings_and_the_dsimplex_methods():
    from engine.methods.registry import METHODS

    assert vocab.DSIMPLEX_NORMALIZATIONS == DSIMPLEX_NORMALIZATIONS
    assert vocab.DSIMPLEX_METHODS == tuple(m for m, cls in METHODS.items() if cls.head == "dsimplex")


@pytest.mark.parametrize("data, message", [
    ({"methods": ["cores"], "model": {"dsimplex_normalization": "l2"}},
     "config key model.dsimplex_normalization must be one of row, frobenius, frobenius_uncentred, got 'l2'"),
    ({"methods": ["independent", "bct"], "model": {"dsimplex_normalization": "frobenius"}},
     r"model.dsimplex_normalization = 'frobenius' applies only to the methods with a d-Simplex head \(cores, "
     r"dsimplex_fd, dsimplex_hoc\), none of which is in methods \['independent', 'bct'\]; leave it 'row'"),
    ({"model": {"dsimplex_normalization": 1}}, "config key model.dsimplex_normalization must be str, got 1"),
])
def test_the_config_refuses_unknown_or_unused_scalings_in_one_line(data, message):
    with pytest.raises(ValueError, match=message) as info:
        config_from_dict(data)
    assert "\n" not in str(info.value)


def test_the_run_builds_the_configured_scaling_for_dsimplex_heads_only():
    cfg = config_from_dict({"methods": ["independent", "cores"], "dataset": {"name": "digits"},
                            "scenario": {"initial_classes": 5, "increment": 5},
                            "model": {"width": 8, "dsimplex_normalization": "frobenius_uncentred"}})
    assert config_from_dict({"methods": ["cores"]}).model.dsimplex_normalization == "row"  # the default is unchanged
    data = SimpleNamespace(total_classes=10, in_channels=1)
    cores = _new_model(build_method("cores"), cfg, data, 5, 1)
    assert cores.spec.dsimplex_normalization == "frobenius_uncentred"
    np.testing.assert_allclose(cores.head.weight.double().numpy(), _by_hand(10, "frobenius_uncentred"), atol=1e-7)
    plain = _new_model(build_method("independent"), cfg, data, 5, 1)
    assert plain.spec.head == "linear" and plain.spec.dsimplex_normalization == "row"
