"""Learn page 2, the probability simplex: Props. 1-2 and the PSP drawing, checked by hand."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from engine.models.extract import simplex_projection
from engine.learn.simplex import (
    TRIANGLE,
    barycentric_xy,
    centring_matrix,
    cross_projection,
    orthogonality_table,
    plane_basis,
    prototype_table,
    prototype_xy,
    psp_xy,
    simplex_points,
)

PAGE = str(Path(__file__).resolve().parents[1] / "app" / "learn" / "simplex.py")


def prototype(y: int, C: int) -> np.ndarray:
    """v_y = e_y - (1/C) 1, entry by entry (paper 000 Eq. 5)."""
    return np.array([(1.0 if j == y else 0.0) - 1.0 / C for j in range(C)])


def max_coincidence_error(C_t: int, C_k: int) -> float:
    """max over y < C^k of |P_{t,k} v_y^t - v_y^k|, with P_{t,k} v = (first C^k entries) minus their mean."""
    worst = 0.0
    for y in range(C_k):
        kept = prototype(y, C_t)[:C_k]
        worst = max(worst, float(np.max(np.abs((kept - kept.mean()) - prototype(y, C_k)))))
    return worst


def test_centring_matrix_rows_are_the_prototypes():
    for C in (2, 3, 7):
        P = centring_matrix(C)
        np.testing.assert_allclose(P, np.stack([prototype(y, C) for y in range(C)]))
        np.testing.assert_allclose(P @ P, P, atol=1e-12)  # a projection
        np.testing.assert_allclose(np.linalg.norm(P, axis=1), np.sqrt((C - 1) / C))


@pytest.mark.parametrize("C_t,C_k", [(3, 3), (4, 3), (6, 3), (10, 4)])
def test_prop2_projected_new_prototypes_are_the_old_ones(C_t, C_k):
    P_tk = cross_projection(C_t, C_k)
    assert P_tk.shape == (C_k, C_t)
    for y in range(C_k):
        np.testing.assert_allclose(P_tk @ prototype(y, C_t), prototype(y, C_k), atol=1e-15)
    assert prototype_table(C_t, C_k)["max |P_tk v_y^t - v_y^k|"].max() <= 1e-15


def test_prop1_added_prototypes_are_orthogonal_to_the_padded_old_ones():
    table = orthogonality_table(6, 3)
    assert len(table) == 3 * 3
    for row in table.itertuples():
        padded = np.r_[prototype(row[2], 3), np.zeros(3)]
        assert float(prototype(row[1], 6) @ padded) == pytest.approx(0.0, abs=1e-15)
    assert table["cos(v_c^t, [v_y^k, 0])"].abs().max() < 1e-14


def test_plane_basis_and_drawings():
    for C in (2, 3, 5):
        B = plane_basis(C)
        np.testing.assert_allclose(B @ B.T, np.eye(C - 1), atol=1e-12)
        np.testing.assert_allclose(B.sum(axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(barycentric_xy(np.eye(3)), TRIANGLE)
    xy = prototype_xy(3)[["px", "py"]].to_numpy()  # 120 degrees apart on the unit circle, class 2 on top
    np.testing.assert_allclose(np.linalg.norm(xy, axis=1), 1.0)
    np.testing.assert_allclose(xy @ xy.T, np.full((3, 3), -0.5) + 1.5 * np.eye(3), atol=1e-12)
    assert xy[2, 1] == pytest.approx(1.0)


def test_psp_points_lie_on_the_circle_and_match_the_engine_projection():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(5), size=50)
    xy = psp_xy(probs, 3)
    np.testing.assert_allclose(np.linalg.norm(xy, axis=1), 1.0, atol=1e-12)
    kept = probs[:, :3] - probs[:, :3].mean(axis=1, keepdims=True)  # truncate, centre, normalise by hand
    by_hand = kept / np.linalg.norm(kept, axis=1, keepdims=True)
    np.testing.assert_allclose(xy @ plane_basis(3), by_hand, atol=1e-12)
    engine = simplex_projection(torch.as_tensor(probs), 3).numpy()
    np.testing.assert_allclose(by_hand, engine, atol=1e-6)


def test_confident_new_model_lands_on_the_old_prototypes():
    points = simplex_points(new_classes=5, per_class=30, confidence=8.0, noise=0.3)
    new = points[(points["model"] == "new") & (points["label"] < 3)]
    protos = prototype_xy(3).set_index("label")
    for label, group in new.groupby("label"):
        cos = group[["px", "py"]].to_numpy() @ protos.loc[label, ["px", "py"]].to_numpy().astype(float)
        assert cos.min() > 0.99


def metric(at: AppTest, prefix: str) -> str:
    return next(m.value for m in at.metric if m.label.startswith(prefix))


@pytest.mark.parametrize("new_classes", [4, 6])
def test_page_shows_the_coincidence_numbers(new_classes):
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    at.slider(key="sx_new_classes").set_value(new_classes)
    at.slider(key="sx_confidence").set_value(6.0)
    at.toggle(key="sx_show_new").set_value(False)
    at.run()
    assert not at.exception
    assert float(metric(at, "Prop. 2")) <= 1e-12
    assert float(metric(at, "Prop. 2")) == pytest.approx(max_coincidence_error(new_classes, 3), abs=1e-15)
    assert float(metric(at, "Prop. 1")) <= 1e-12
    assert metric(at, "$\\|v_y^t") == f"{np.sqrt((new_classes - 1) / new_classes):.3f} vs {np.sqrt(2 / 3):.3f}"
    table = at.dataframe[0].value
    assert list(table["class"]) == [0, 1, 2] and table["max |P_tk v_y^t - v_y^k|"].max() <= 1e-12
    assert table["v_y^t (new)"].str.count(",").eq(new_classes - 1).all()
    assert f"the {new_classes}-class prototypes" in at.subheader[0].value
