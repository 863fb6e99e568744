"""Fixed and learnable heads: d-Simplex and ETF geometry, label allocation, expandable linear head."""
import math

import pytest
import torch

from engine.models import HEADS, DSimplexHead, ETFHead, LinearHead, dsimplex_prototypes, etf_prototypes


def pairwise_cosines(rows: torch.Tensor) -> torch.Tensor:
    rows = rows.double()
    unit = rows / rows.norm(dim=1, keepdim=True)
    cosines = unit @ unit.T
    return cosines[~torch.eye(rows.shape[0], dtype=torch.bool)]


def appendix_d_snippet(K: int) -> torch.Tensor:
    """P1 Appendix D, transcribed line by line (CPU instead of .cuda())."""
    W = torch.zeros((K, K - 1))
    W[:-1, :] = torch.eye(K - 1)
    c = torch.sqrt(1 + torch.Tensor([K - 1]))
    W[-1, :] = W[-1, :] + (1 - c) / (K - 1)
    W.add_(-torch.mean(W, dim=0))
    W.div_(torch.linalg.norm(W) + 1e-8)
    return W


@pytest.mark.parametrize("K", [2, 3, 10, 100])
def test_dsimplex_is_a_centred_regular_simplex_of_unit_vectors(K):
    W = dsimplex_prototypes(K)
    assert W.shape == (K, K - 1)
    assert W.dtype == torch.float32
    torch.testing.assert_close(W.double().norm(dim=1), torch.ones(K, dtype=torch.float64), atol=1e-6, rtol=0)
    cosines = pairwise_cosines(W)
    assert torch.allclose(cosines, torch.full_like(cosines, -1 / (K - 1)), atol=1e-6, rtol=0)
    assert W.double().sum(dim=0).abs().max() < 1e-6
    assert torch.linalg.matrix_rank(W.double()) == K - 1


@pytest.mark.parametrize("K", [3, 10, 100])
def test_dsimplex_frobenius_option_matches_appendix_d(K):
    W = dsimplex_prototypes(K, normalization="frobenius")
    torch.testing.assert_close(W.double().norm(dim=1), torch.full((K,), 1 / math.sqrt(K), dtype=torch.float64))
    torch.testing.assert_close(torch.linalg.norm(W.double()).item(), 1.0)
    torch.testing.assert_close(W, appendix_d_snippet(K), atol=1e-6, rtol=0)
    # same directions as the default row normalisation
    torch.testing.assert_close(W * math.sqrt(K), dsimplex_prototypes(K), atol=1e-6, rtol=0)


def test_dsimplex_rejects_bad_arguments():
    with pytest.raises(ValueError, match="at least 2"):
        dsimplex_prototypes(1)
    with pytest.raises(ValueError, match="normalization"):
        dsimplex_prototypes(5, normalization="l1")


def test_dsimplex_head_is_fixed_bias_free_and_untempered():
    head = DSimplexHead(6)
    assert list(head.parameters()) == []
    assert "prototypes" in head.state_dict()
    assert head.num_outputs == 6 and head.feature_dim == 5
    features = torch.randn(4, 5)
    torch.testing.assert_close(head(features), features @ dsimplex_prototypes(6).T)
    assert torch.equal(head(torch.zeros(2, 5)), torch.zeros(2, 6))


def test_label_allocation_maps_classes_to_vertices():
    labels = torch.tensor([0, 1, 4])
    left = DSimplexHead(5)
    right = DSimplexHead(5, label_allocation="right_to_left")
    assert torch.equal(left.class_to_output(labels), labels)
    assert torch.equal(right.class_to_output(labels), torch.tensor([4, 3, 0]))
    assert torch.equal(right.output_to_class(right.class_to_output(labels)), labels)
    with pytest.raises(ValueError, match="label allocation"):
        DSimplexHead(5, label_allocation="random")


@pytest.mark.parametrize(("K", "d"), [(5, 4), (5, 5), (5, 16)])
def test_etf_has_unit_equiangular_prototypes(K, d):
    W = etf_prototypes(K, d, seed=3)
    assert W.shape == (K, d)
    gram = W.double() @ W.double().T
    expected = K / (K - 1) * (torch.eye(K, dtype=torch.float64) - 1 / K)
    torch.testing.assert_close(gram, expected, atol=1e-6, rtol=0)


def test_etf_is_seeded_and_fixed():
    assert torch.equal(etf_prototypes(4, 8, seed=1), etf_prototypes(4, 8, seed=1))
    assert not torch.allclose(etf_prototypes(4, 8, seed=1), etf_prototypes(4, 8, seed=2))
    head = ETFHead(4, 8, seed=1)
    assert list(head.parameters()) == []
    with pytest.raises(ValueError, match="at least 3 feature dimensions"):
        etf_prototypes(4, 2)


def test_linear_head_expansion_keeps_old_rows():
    torch.manual_seed(0)
    head = LinearHead(6, 3, bias=True)
    old_weight, old_bias = head.weight.detach().clone(), head.fc.bias.detach().clone()
    features = torch.randn(5, 6)
    old_logits = head(features).detach()
    head.expand(2, seed=7)
    assert head.num_outputs == 5
    assert torch.equal(head.weight[:3].detach(), old_weight)
    assert torch.equal(head.fc.bias[:3].detach(), old_bias)
    torch.testing.assert_close(head(features)[:, :3].detach(), old_logits)
    assert head.weight.requires_grad
    with pytest.raises(ValueError):
        head.expand(0, seed=7)


def test_linear_head_expansion_is_seeded_and_leaves_the_global_rng_alone():
    grown = []
    for _ in range(2):
        head = LinearHead(6, 3, bias=True)
        head.fc.weight.data.zero_()
        state = torch.random.get_rng_state()
        head.expand(2, seed=11)
        assert torch.equal(torch.random.get_rng_state(), state)
        grown.append(head.weight[3:].detach().clone())
    torch.testing.assert_close(grown[0], grown[1], rtol=0, atol=0)
    with torch.random.fork_rng(devices=[]):  # the new rows are nn.Linear's default init under that seed
        torch.manual_seed(11)
        reference = torch.nn.Linear(6, 5).weight[3:].detach()
    torch.testing.assert_close(grown[0], reference, rtol=0, atol=0)


def test_linear_head_defaults_to_no_bias_and_identity_mapping():
    head = LinearHead(4, 3)
    assert head.fc.bias is None
    labels = torch.tensor([2, 0])
    assert torch.equal(head.class_to_output(labels), labels)


def test_head_registry():
    assert HEADS == {"linear": LinearHead, "dsimplex": DSimplexHead, "etf": ETFHead}
