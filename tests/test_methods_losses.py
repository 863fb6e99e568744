"""Loss terms of the methods, checked against values computed by hand with ``math``."""
import math

import pytest
import torch
from torch.nn import functional as F

from engine.methods.losses import (
    class_mean_alignment,
    cross_entropy,
    dot_regression,
    feature_distance,
    info_nce,
    intra_class_variance,
)
from engine.models import etf_prototypes


def cos(a, b) -> float:
    return sum(x * y for x, y in zip(a, b)) / (math.hypot(*a) * math.hypot(*b))


def log_sum_exp(values) -> float:
    return math.log(sum(math.exp(v) for v in values))


# two samples in 2-D: old anchors o1, o2 and new features n1, n2
OLD = [(1.0, 0.0), (0.0, 1.0)]
NEW = [(2.0, 0.0), (1.0, 1.0)]  # cos(o1,n1)=1, cos(o1,n2)=1/sqrt2, cos(o2,n1)=0, cos(o2,n2)=1/sqrt2


def as_tensor(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_info_nce_paper_two_samples_by_hand():
    rho = 5.0
    # Eq. 4: -log( exp(rho cos(o_i, n_i)) / sum_{j != i} exp(rho cos(o_i, n_j)) ); a single negative each
    term1 = -math.log(math.exp(rho * 1.0) / math.exp(rho / math.sqrt(2)))
    term2 = -math.log(math.exp(rho / math.sqrt(2)) / math.exp(rho * 0.0))
    expected = (term1 + term2) / 2
    got = info_nce(as_tensor(OLD), as_tensor(NEW), torch.tensor([0, 1]), scale=rho, negatives="paper")
    assert got.item() == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx((-rho + rho / math.sqrt(2) - rho / math.sqrt(2)) / 2)


def test_info_nce_repo_two_samples_by_hand():
    rho = 10.0
    different = info_nce(as_tensor(OLD), as_tensor(NEW), torch.tensor([0, 1]), scale=rho, negatives="repo")
    # row i: the diagonal (same class as itself) becomes 0 but stays in the logsumexp
    term1 = -rho * 1.0 + log_sum_exp([0.0, rho / math.sqrt(2)])
    term2 = -rho / math.sqrt(2) + log_sum_exp([0.0, 0.0])
    assert different.item() == pytest.approx((term1 + term2) / 2, rel=1e-6)

    same = info_nce(as_tensor(OLD), as_tensor(NEW), torch.tensor([3, 3]), scale=rho, negatives="repo")
    # every entry of both rows is zeroed: -s_ii + log(1 + 1)
    expected = ((-rho + math.log(2)) + (-rho / math.sqrt(2) + math.log(2))) / 2
    assert same.item() == pytest.approx(expected, rel=1e-6)


def test_info_nce_three_samples_matches_a_plain_python_loop():
    old = [(1.0, 0.0), (0.0, 1.0), (-1.0, 0.5)]
    new = [(0.5, 0.1), (0.2, 1.0), (-1.0, -0.3)]
    labels = [0, 1, 0]
    rho = 5.0
    paper, repo = [], []
    for i in range(3):
        s = [rho * cos(old[i], new[j]) for j in range(3)]
        paper.append(-s[i] + log_sum_exp([s[j] for j in range(3) if j != i]))
        zeroed = [0.0 if labels[j] == labels[i] else s[j] for j in range(3)]
        repo.append(-s[i] + log_sum_exp(zeroed))
    targets = torch.tensor(labels)
    got_paper = info_nce(as_tensor(old), as_tensor(new), targets, scale=rho, negatives="paper")
    got_repo = info_nce(as_tensor(old), as_tensor(new), targets, scale=rho, negatives="repo")
    assert got_paper.item() == pytest.approx(sum(paper) / 3, rel=1e-6)
    assert got_repo.item() == pytest.approx(sum(repo) / 3, rel=1e-6)


def test_info_nce_is_invariant_to_feature_norms_and_rejects_bad_input():
    old, new = as_tensor(OLD), as_tensor(NEW)
    targets = torch.tensor([0, 1])
    base = info_nce(old, new, targets, scale=5.0)
    torch.testing.assert_close(info_nce(3 * old, 0.5 * new, targets, scale=5.0), base)
    with pytest.raises(ValueError, match="drop_last"):
        info_nce(old[:1], new[:1], targets[:1], scale=5.0, negatives="paper")
    with pytest.raises(ValueError, match="negatives"):
        info_nce(old, new, targets, scale=5.0, negatives="supcon")


def test_cross_entropy_temperature_divides_logits():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    target = torch.tensor([0])
    t = 12.0
    scaled = [2.0 / t, 0.0, -1.0 / t]
    expected = -scaled[0] + log_sum_exp(scaled)
    assert cross_entropy(logits, target, temperature=t).item() == pytest.approx(expected, rel=1e-6)
    assert cross_entropy(logits, target).item() == pytest.approx(-2.0 + log_sum_exp([2.0, 0.0, -1.0]), rel=1e-6)


def test_feature_distance_by_hand_and_against_cosine_similarity():
    new = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    old = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    torch.testing.assert_close(feature_distance(new, old, distance="l2"), torch.tensor([5.0, 5.0]))
    cosine = feature_distance(new[1:], old[1:], distance="cosine")
    assert cosine.item() == pytest.approx(1 - 1 / math.sqrt(2), rel=1e-6)
    torch.testing.assert_close(feature_distance(new, new, distance="cosine"), torch.zeros(2), atol=1e-6, rtol=0)
    # cosine distance is half the squared error of the normalised features (the CL2R identity)
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    half_mse = (F.normalize(a, dim=1) - F.normalize(b, dim=1)).pow(2).sum(1) / 2
    torch.testing.assert_close(feature_distance(a, b, distance="cosine"), half_mse)
    torch.testing.assert_close(feature_distance(a, b, distance="cosine"), 1 - F.cosine_similarity(a, b, dim=1))
    with pytest.raises(ValueError, match="distance"):
        feature_distance(a, b, distance="l1")


def test_dot_regression_matches_explicit_prototypes():
    prototypes = etf_prototypes(4, 5, seed=3)
    features = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    targets = torch.tensor([0, 1, 2, 3, 0, 2])
    logits = features @ prototypes.T
    explicit = 0.5 * ((F.normalize(features, dim=1) * prototypes[targets]).sum(1) - 1).pow(2).mean()
    torch.testing.assert_close(dot_regression(features, logits, targets), explicit)
    # by hand: feature at 90 degrees from its unit prototype -> 1/2 (0 - 1)^2
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    h = torch.tensor([[0.0, 3.0]])
    assert dot_regression(h, h @ w.T, torch.tensor([0])).item() == pytest.approx(0.5)
    # zero when every feature points at its prototype, whatever its length
    aligned = prototypes[targets] * torch.arange(1.0, 7.0).unsqueeze(1)
    assert dot_regression(aligned, aligned @ prototypes.T, targets).item() == pytest.approx(0.0, abs=1e-6)


def test_class_mean_alignment_and_intra_class_variance_by_hand():
    new = torch.tensor([[1.0, 0.0], [3.0, 0.0], [5.0, 5.0]])
    old = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    targets = torch.tensor([0, 0, 1])
    # class 0: mean new (2, 0), mean old (0, 0) -> 4; class 1 (not listed) is left out
    assert class_mean_alignment(new, old, targets, torch.tensor([0])).item() == pytest.approx(4.0)
    # both classes: (4 + 50) / 2
    assert class_mean_alignment(new, old, targets, torch.tensor([0, 1])).item() == pytest.approx(27.0)
    assert class_mean_alignment(new, old, targets, torch.tensor([7])).item() == 0.0
    # class 0 samples are 1 away from their mean, class 1 is alone: (1 + 1 + 0) / 3
    assert intra_class_variance(new, targets).item() == pytest.approx(2 / 3)
    collapsed = torch.tensor([[1.0, 2.0], [1.0, 2.0], [4.0, 0.0]])
    assert intra_class_variance(collapsed, targets).item() == 0.0
    assert class_mean_alignment(collapsed, collapsed.clone(), targets, torch.tensor([0, 1])).item() == 0.0
