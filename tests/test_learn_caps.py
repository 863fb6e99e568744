"""Learn page 4, caps and expectations: the cap sampler, the closed form (by quadrature) and the page's verdicts."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import integrate
from streamlit.testing.v1 import AppTest

from engine.learn.caps import (
    cap_expectations,
    distances_vs_dimension,
    distances_vs_shrink,
    mean_resultant_length,
    prototype_pair,
    sample_cap,
)

PAGE = str(Path(__file__).resolve().parents[1] / "app" / "learn" / "caps.py")


def m_quad(theta_deg: float, dim: int) -> float:
    """E[cos psi] of a uniform cap, psi with density sin^{d-2} on [0, theta], by adaptive quadrature."""
    t = np.deg2rad(theta_deg)
    if t == 0:
        return 1.0
    num = integrate.quad(lambda p: np.cos(p) * np.sin(p) ** (dim - 2), 0, t)[0]
    return num / integrate.quad(lambda p: np.sin(p) ** (dim - 2), 0, t)[0]


def differences(dim: int, theta_old: float, theta_new: float) -> dict[str, float]:
    """E[D_kt] - reference from E[1 - a.b] = 1 - m_a m_b cos(alpha), cos(alpha) = 1 or -1/d."""
    mk, mt = m_quad(theta_old, dim), m_quad(theta_new, dim)
    c = -1.0 / dim
    return {"1a": (1 - mk * mt) - (1 - mk * mk), "1b_old": (1 - mk * mt * c) - (1 - mk * mk * c),
            "1b_new": (1 - mk * mt * c) - (1 - mt * mt * c)}


@pytest.mark.parametrize("dim", [2, 3, 64])
def test_cap_samples_are_unit_vectors_inside_the_cap(dim):
    rng = np.random.default_rng(0)
    w, _ = prototype_pair(dim)
    x = sample_cap(w, np.deg2rad(35), 5000, rng)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    assert np.degrees(np.arccos(np.clip(x @ w, -1, 1))).max() <= 35 + 1e-2
    np.testing.assert_allclose(sample_cap(w, 0.0, 3, rng), np.tile(w, (3, 1)), atol=1e-7)


def test_cap_on_the_2_sphere_is_uniform_in_height():
    """Archimedes: on S^2 the height cos(psi) of a uniform cap point is uniform on [cos theta, 1]."""
    rng = np.random.default_rng(1)
    w = np.array([0.0, 0.0, 1.0])
    heights = sample_cap(w, np.deg2rad(60), 40_000, rng) @ w
    np.testing.assert_allclose(np.quantile(heights, [0.1, 0.5, 0.9]), 0.5 + 0.5 * np.array([0.1, 0.5, 0.9]), atol=0.01)


@pytest.mark.parametrize("dim,theta", [(2, 40), (3, 90), (16, 10), (256, 40)])
def test_mean_resultant_length_matches_quadrature(dim, theta):
    assert mean_resultant_length(np.deg2rad(theta), dim) == pytest.approx(m_quad(theta, dim), abs=1e-6)


def test_prototypes_are_two_simplex_vertices():
    for dim in (2, 7, 100):
        a, b = prototype_pair(dim)
        assert float(a @ b) == pytest.approx(-1.0 / dim, abs=1e-6)


@pytest.mark.parametrize("dim,theta_old,theta_new", [(3, 60, 30), (16, 40, 20), (16, 40, 60)])
def test_monte_carlo_agrees_with_the_closed_form(dim, theta_old, theta_new):
    distances, checks = cap_expectations(dim=dim, theta_old_deg=theta_old, theta_new_deg=theta_new, samples=20_000)
    assert (np.abs(distances["monte_carlo"] - distances["closed_form"]) < 4 * distances["std_error"] + 1e-4).all()
    expected = differences(dim, theta_old, theta_new)
    for row in checks.itertuples():
        assert row.closed_form == pytest.approx(expected[row.inequality], abs=1e-6)
        assert abs(row.monte_carlo - row.closed_form) < 4 * row.std_error + 1e-4
        if row.resolved:
            assert row.holds_mc == row.holds_closed_form


def test_shrinking_caps_satisfy_1a_and_old_reference_1b_but_not_new_reference_1b():
    """The extraction's note: with theta_t < theta_k, D_kk < D_kt < D_tt for different classes."""
    for dim in (2, 16, 512):
        _, checks = cap_expectations(dim=dim, theta_old_deg=45, theta_new_deg=15, samples=200)
        verdict = dict(zip(checks["inequality"], checks["holds_closed_form"]))
        assert verdict == {"1a": True, "1b_old": True, "1b_new": False}
    shrink = distances_vs_shrink(dim=16, theta_old_deg=40, steps=5)
    assert len(shrink) == 5 * 2 * 3
    at_equal = shrink[shrink["theta_new_deg"] == 40.0]  # equal caps: the three expectations coincide per case
    assert at_equal.groupby("case")["value"].agg(lambda v: v.max() - v.min()).max() < 1e-12


def test_across_dimensions_is_stacked_per_dimension():
    frame = distances_vs_dimension([2, 8], theta_old_deg=40, theta_new_deg=20, samples=500)
    assert sorted(frame["dim"].unique()) == [2, 8] and len(frame) == 2 * 6


def metric_values(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def check_page(at: AppTest, dim: int, theta_old: float, theta_new: float, samples: int = 20_000) -> None:
    """The shown Monte-Carlo differences lie within 4.5 standard errors of the quadrature values; the standard
    errors come from an independent draw (another seed) of the same size."""
    assert not at.exception
    shown = metric_values(at)
    expected = differences(dim, theta_old, theta_new)
    _, other = cap_expectations(dim=dim, theta_old_deg=theta_old, theta_new_deg=theta_new, samples=samples, seed=99)
    std_error = dict(zip(other["inequality"], other["std_error"]))
    labels = {"1a": ("(1a): E[D_kt] − E[D_kk]", "(1a) in expectation"),
              "1b_old": ("(1b), old ref.: E[D_kt] − E[D_kk]", "(1b), old ref. in expectation"),
              "1b_new": ("(1b), new ref.: E[D_kt] − E[D_tt]", "(1b), new ref. in expectation")}
    for name, (value_label, verdict_label) in labels.items():
        value = float(shown[value_label])
        assert value == pytest.approx(expected[name], abs=4.5 * std_error[name] + 1e-4)  # Monte-Carlo vs quadrature
        holds = expected[name] <= 0 if name == "1a" else expected[name] >= 0
        verdict = shown[verdict_label]
        if "within noise" not in verdict:
            assert verdict == ("holds" if holds else "fails")


def test_page_verdicts_follow_the_sliders():
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    check_page(at, 16, 40, 20)
    assert metric_values(at)["(1b), new ref. in expectation"] == "fails"

    at.select_slider(key="caps_dim").set_value(3)
    at.slider(key="caps_theta_old").set_value(60)
    at.slider(key="caps_theta_new").set_value(30)
    at.run()
    check_page(at, 3, 60, 30)
    assert not at.warning

    at.slider(key="caps_theta_new").set_value(80)  # the cap grows: A3 fails and so does (1a)
    at.select_slider(key="caps_samples").set_value(5000)
    at.run()
    check_page(at, 3, 60, 80, samples=5000)
    assert at.warning and metric_values(at)["(1a) in expectation"] == "fails"
    table = at.dataframe[0].value
    assert list(table["quantity"]) == ["E[D_kt]", "E[D_kk]", "E[D_tt]"] * 2
