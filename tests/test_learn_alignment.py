"""Learn page 5, alignment: fitted maps against closed forms (Procrustes, least squares) and the page's numbers."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from engine.adapters.losses import orthogonality_deviation
from engine.learn.alignment import (
    distance_distortion,
    fit_maps,
    orthogonality_error,
    regulariser_curve,
    source_target,
)

PAGE = str(Path(__file__).resolve().parents[1] / "app" / "learn" / "alignment.py")


def clouds(**settings):
    data = source_target(**settings)
    return data[["source_x", "source_y"]].to_numpy(), data[["target_x", "target_y"]].to_numpy(), data["label"].to_numpy()


def rotation_optimum(source, target) -> float:
    """Best mean squared error of a rotation (det +1, no bias): Procrustes by SVD."""
    U, _, Vt = np.linalg.svd(target.T @ source)
    R = U @ np.diag([1.0, np.sign(np.linalg.det(U @ Vt))]) @ Vt
    return float(np.mean(np.sum((source @ R.T - target) ** 2, axis=1)))


def affine_optimum(source, target) -> tuple[np.ndarray, float]:
    """Least-squares affine map: its W and its mean squared error."""
    X = np.hstack([source, np.ones((len(source), 1))])
    coef, *_ = np.linalg.lstsq(X, target, rcond=None)
    return coef[:2].T, float(np.mean(np.sum((X @ coef - target) ** 2, axis=1)))


def frobenius_deviation(W: np.ndarray) -> float:
    return float(np.sqrt(sum((sum(W[i, k] * W[j, k] for k in range(2)) - (i == j)) ** 2
                             for i in range(2) for j in range(2))))


def test_source_and_target_are_centred_and_seeded():
    source, target, labels = clouds(num_classes=4, per_class=10, seed=2)
    np.testing.assert_allclose(source.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(target.mean(0), 0, atol=1e-12)
    assert np.bincount(labels).tolist() == [10] * 4
    assert source_target(seed=2).equals(source_target(seed=2))


def test_unknown_map_is_refused():
    source, target, labels = clouds(num_classes=3, per_class=4)
    with pytest.raises(ValueError, match="unknown map"):
        fit_maps(source, target, labels, maps=("shear",))


def test_scores():
    rng = np.random.default_rng(0)
    W = rng.normal(size=(2, 2))
    assert orthogonality_error(W) == pytest.approx(frobenius_deviation(W))
    assert orthogonality_error(W) == pytest.approx(float(orthogonality_deviation(torch.as_tensor(W))), rel=1e-5)
    pts = rng.normal(size=(30, 2))
    theta = 0.7
    R = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    assert distance_distortion(pts, pts @ R.T + 3.0) == pytest.approx(0.0, abs=1e-12)
    assert distance_distortion(pts, 2.0 * pts) == pytest.approx(1.0)


def test_fitted_maps_reach_their_closed_form_optima():
    source, target, labels = clouds()
    fitted = fit_maps(source, target, labels, lam=1.0)
    orth, affine, lam = fitted["orthogonal"], fitted["affine"], fitted["lambda-orthogonal"]
    assert orth.orthogonality_error < 1e-5 and orth.distance_distortion < 1e-5
    assert orth.alignment_error == pytest.approx(rotation_optimum(source, target), rel=1e-4)
    W_ls, err_ls = affine_optimum(source, target)
    assert affine.alignment_error == pytest.approx(err_ls, rel=1e-3)
    np.testing.assert_allclose(affine.weight, W_ls, atol=2e-3)
    assert orth.orthogonality_error < lam.orthogonality_error < affine.orthogonality_error
    assert affine.alignment_error < lam.alignment_error < orth.alignment_error


def test_lambda_moves_the_map_from_orthogonal_to_affine():
    source, target, labels = clouds()
    errors = [fit_maps(source, target, labels, lam=lam, alpha=20.0, maps=("lambda-orthogonal",))
              ["lambda-orthogonal"].orthogonality_error for lam in (0.0, 0.5, 1.0, 3.0)]
    assert errors == sorted(errors)
    affine = fit_maps(source, target, labels, maps=("affine",))["affine"].orthogonality_error
    assert errors[0] < 0.1 and errors[-1] == pytest.approx(affine, abs=0.01)


def test_regulariser_curve_is_equation_6():
    curve = regulariser_curve(lams=(1.0, 2.0), alpha=5.0, x_max=3.0, steps=31)
    x, lam = curve["x"].to_numpy(), curve["lambda"].to_numpy()
    np.testing.assert_allclose(curve["L_lambda"], x / (1 + np.exp(-5.0 * (x - lam))), rtol=1e-5, atol=1e-7)
    at_lambda = curve[np.isclose(curve["x"], curve["lambda"])]
    np.testing.assert_allclose(at_lambda["L_lambda"], at_lambda["lambda"] / 2, rtol=1e-5)


def shown(at: AppTest) -> list[tuple[float, float, float]]:
    """(orthogonality error, alignment error, distortion) of: before, orthogonal, affine, lambda-orthogonal."""
    values = [m.value for m in at.metric]
    return [(float(values[i]), float(values[i + 1]), float(values[i + 2].rstrip("%")) / 100) for i in range(0, 12, 3)]


def check_page(at: AppTest) -> None:
    assert not at.exception
    s = at.session_state
    source, target, _ = clouds(num_classes=s["al_classes"], stretch=s["al_stretch"], rotation_deg=float(s["al_rotation"]),
                               noise=s["al_noise"], seed=s["al_seed"])
    before, orth, affine, lam = shown(at)
    assert before == (0.0, pytest.approx(float(np.mean(np.sum((source - target) ** 2, axis=1))), abs=1e-4), 0.0)
    assert orth[0] == 0.0 and orth[2] == 0.0
    assert orth[1] == pytest.approx(rotation_optimum(source, target), abs=2e-4)
    W_ls, err_ls = affine_optimum(source, target)
    assert affine[0] == pytest.approx(frobenius_deviation(W_ls), abs=0.003)
    assert affine[1] == pytest.approx(err_ls, abs=2e-4)
    # the table's matrices give the shown orthogonality errors
    table = at.dataframe[0].value
    for row, scores in zip(table.itertuples(), (orth, affine, lam)):
        W = np.array([[row.w11, row.w12], [row.w21, row.w22]])
        assert scores[0] == pytest.approx(frobenius_deviation(W), abs=1e-3)


def test_page_scores_follow_lambda():
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    check_page(at)
    _, orth, affine, lam = shown(at)
    assert orth[0] <= lam[0] <= affine[0] and affine[1] <= lam[1] <= orth[1]

    at.slider(key="al_lambda").set_value(0.0)
    at.select_slider(key="al_alpha").set_value(20.0)
    at.run()
    check_page(at)
    assert shown(at)[3][0] < 0.1  # lambda = 0: nearly orthogonal

    at.slider(key="al_lambda").set_value(3.0)
    at.slider(key="al_stretch").set_value(0.3)
    at.slider(key="al_rotation").set_value(-45)
    at.run()
    check_page(at)
    _, _, affine, lam = shown(at)
    assert lam[0] == pytest.approx(affine[0], abs=0.01)  # lambda above the affine map's deviation: no penalty
