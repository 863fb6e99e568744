"""Adapter loss terms and layers (paper 004 Eqs. 2, 6, 8), checked against numbers computed by hand."""
import math

import pytest
import torch

from engine.adapters.losses import lambda_orthogonality, orthogonality_deviation, squared_error, supervised_contrastive_loss
from engine.adapters.modules import AffineAdapter, OrthogonalAdapter


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def diag(*values: float) -> torch.Tensor:
    return torch.diag(torch.tensor(values, dtype=torch.float64))


# diag(s): W W^T - I = diag(s_i^2 - 1), so ||W W^T - I||_F = sqrt(sum (s_i^2 - 1)^2)
@pytest.mark.parametrize(
    ("weight", "deviation"),
    [(diag(2.0, 1.0, 1.0), 3.0), (diag(5.0, 1.0), 24.0), (diag(math.sqrt(13.0), 1.0), 12.0), (diag(1.0, 1.0), 0.0)],
)
def test_orthogonality_deviation_of_diagonal_matrices(weight, deviation):
    assert float(orthogonality_deviation(weight)) == pytest.approx(deviation, abs=1e-5)


def test_orthogonality_deviation_uses_w_w_transpose_for_wide_matrices():
    # two orthonormal rows in R^3: W W^T = I_2 exactly (W^T W would not be I_3)
    weight = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.6, 0.8]])
    assert float(orthogonality_deviation(weight)) == pytest.approx(0.0, abs=1e-6)


def test_lambda_regulariser_is_off_well_below_lambda():
    # x = 3, lam = 12, alpha = 1: sigmoid(-9) * 3
    value = float(lambda_orthogonality(diag(2.0, 1.0, 1.0), lam=12.0, alpha=1.0))
    assert value == pytest.approx(sigmoid(-9.0) * 3.0, rel=1e-4)
    assert value < 1e-3


def test_lambda_regulariser_is_the_deviation_well_above_lambda():
    # x = 24, lam = 12, alpha = 1: sigmoid(12) * 24 = 24 - 1.5e-4
    value = float(lambda_orthogonality(diag(5.0, 1.0), lam=12.0, alpha=1.0))
    assert value == pytest.approx(sigmoid(12.0) * 24.0, rel=1e-6)
    assert value == pytest.approx(24.0, abs=1e-3)


def test_lambda_regulariser_is_half_the_deviation_at_lambda():
    assert float(lambda_orthogonality(diag(math.sqrt(13.0), 1.0), lam=12.0, alpha=3.0)) == pytest.approx(6.0, rel=1e-5)


def test_lambda_regulariser_steepness_and_limits():
    weight = diag(2.0, 1.0, 1.0)  # x = 3
    assert float(lambda_orthogonality(weight, lam=4.0, alpha=10.0)) == pytest.approx(sigmoid(-10.0) * 3.0, rel=1e-4)
    assert float(lambda_orthogonality(weight, lam=4.0, alpha=0.5)) == pytest.approx(sigmoid(-0.5) * 3.0, rel=1e-5)
    assert float(lambda_orthogonality(weight, lam=math.inf)) == 0.0
    # lam = 0 with a steep sigmoid is soft orthogonality (Eq. 3)
    assert float(lambda_orthogonality(weight, lam=0.0, alpha=50.0)) == pytest.approx(3.0, rel=1e-6)


def test_lambda_regulariser_gradient_vanishes_below_and_matches_soft_orthogonality_above():
    below = diag(2.0, 1.0, 1.0).requires_grad_()
    lambda_orthogonality(below, lam=12.0).backward()
    assert float(below.grad.abs().max()) < 1e-2
    above = diag(5.0, 1.0).requires_grad_()
    lambda_orthogonality(above, lam=12.0).backward()
    # d/ds ||diag(s^2 - 1, 0)||_F = 2 s at s = 5
    assert float(above.grad[0, 0]) == pytest.approx(10.0, rel=1e-3)


@pytest.mark.parametrize(("lam", "alpha"), [(-1.0, 1.0), (12.0, 0.0), (12.0, math.inf)])
def test_lambda_regulariser_rejects_bad_settings(lam, alpha):
    with pytest.raises(ValueError):
        lambda_orthogonality(diag(1.0, 1.0), lam=lam, alpha=alpha)


def test_supervised_contrastive_loss_by_hand():
    # anchors a1 = e1 (class 0), a2 = e2 (class 1); candidates e1 (0), (1,1)/sqrt2 (0), e2 (1)
    anchors = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    candidates = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 5.0]])
    tau = 0.5
    r = 1 / math.sqrt(2)
    sims = [[1.0, r, 0.0], [0.0, r, 1.0]]
    log_q = [[s / tau - math.log(sum(math.exp(t / tau) for t in row)) for s in row] for row in sims]
    loss_a1 = -(log_q[0][0] + log_q[0][1]) / 2  # two class-0 positives, equal mass
    loss_a2 = -log_q[1][2]  # one class-1 positive
    expected = (loss_a1 + loss_a2) / 2
    value = supervised_contrastive_loss(
        anchors, candidates, torch.tensor([0, 1]), torch.tensor([0, 0, 1]), temperature=tau
    )
    assert float(value) == pytest.approx(expected, rel=1e-5)


def test_supervised_contrastive_loss_excluding_the_same_index_by_hand():
    # three samples, classes (0, 0, 1); candidate i leaves anchor i's softmax
    x = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    labels = torch.tensor([0, 0, 1])
    tau = 1.0
    c = [[1.0, 0.6, 0.0], [0.6, 1.0, 0.8], [0.0, 0.8, 1.0]]

    def log_q(i, j):
        others = [k for k in range(3) if k != i]
        return c[i][j] / tau - math.log(sum(math.exp(c[i][k] / tau) for k in others))

    expected = (-log_q(0, 1) - log_q(1, 0)) / 2  # anchor 2 has no positive left and is not averaged
    value = supervised_contrastive_loss(x, x, labels, temperature=tau, exclude_same_index=True)
    assert float(value) == pytest.approx(expected, rel=1e-5)


def test_supervised_contrastive_loss_is_scale_invariant_and_rejects_width_mismatch():
    torch.manual_seed(0)
    a, c, y = torch.randn(6, 4), torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 2, 2])
    scaled = float(supervised_contrastive_loss(3 * a, 7 * c, y))
    assert float(supervised_contrastive_loss(a, c, y)) == pytest.approx(scaled, rel=1e-5)
    with pytest.raises(ValueError, match="same width"):
        supervised_contrastive_loss(a, torch.randn(6, 3), y)


def test_squared_error_reductions():
    predicted, target = torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.tensor([[0.0, 0.0], [0.0, 3.0]])
    # per-sample squared norms 5 and 9
    assert float(squared_error(predicted, target)) == pytest.approx(7.0)
    assert float(squared_error(predicted, target, reduction="mean")) == pytest.approx(3.5)


def test_orthogonal_adapter_is_a_rotation_and_uses_only_the_upper_triangle():
    adapter = OrthogonalAdapter(5)
    assert torch.equal(adapter.weight, torch.eye(5))
    with torch.no_grad():
        adapter.A.copy_(torch.randn(5, 5, generator=torch.Generator().manual_seed(1)))
    weight = adapter.exact_weight().double()
    assert float(torch.linalg.matrix_norm(weight @ weight.T - torch.eye(5, dtype=torch.float64))) < 1e-6
    assert float(torch.linalg.det(weight)) == pytest.approx(1.0, abs=1e-5)
    x = torch.randn(7, 5)
    assert torch.allclose(adapter(x).norm(dim=1), x.norm(dim=1), rtol=1e-5)
    upper = adapter.exact_weight()
    with torch.no_grad():
        adapter.A.copy_(torch.triu(adapter.A, diagonal=1))  # lower triangle and diagonal play no part
    assert torch.equal(adapter.exact_weight(), upper)


def test_affine_adapter_inits():
    eye = AffineAdapter(3, 2, init="identity")
    assert torch.equal(eye(torch.tensor([[1.0, 2.0, 3.0]])), torch.tensor([[1.0, 2.0]]))
    first = AffineAdapter(4, 3, generator=torch.Generator().manual_seed(0))
    second = AffineAdapter(4, 3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(first.weight, second.weight) and float(first.weight.detach().abs().max()) <= 0.5
    with pytest.raises(ValueError, match="init must be one of"):
        AffineAdapter(2, 2, init="zeros")
