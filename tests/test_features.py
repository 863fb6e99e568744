"""PSP/LSP projections (paper 000, Algorithm 1 and Props. 1-2), feature extraction and views, NC1-NC4."""
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from engine.analysis.collapse import (
    collapse_report,
    nc1_variability,
    nc2_equiangularity,
    nc2_equinorm,
    nc3_self_duality,
    nc4_ncc_mismatch,
    probability_simplex_prototypes,
)
from engine.core.cell import cell_features, output_view, project_simplex
from engine.models.extract import extract_outputs, simplex_projection
from engine.models import build_model


def algorithm_1(f: torch.Tensor, c_t: int, c_k: int) -> torch.Tensor:
    """Algorithm 1 in matrix form: h = P_{t,k} f / ||P_{t,k} f||, P_{t,k} = [I - J/C^k | 0]."""
    p_kk = torch.eye(c_k, dtype=torch.float64) - torch.ones(c_k, c_k, dtype=torch.float64) / c_k
    p_tk = torch.cat([p_kk, torch.zeros(c_k, c_t - c_k, dtype=torch.float64)], dim=1)
    h = f.double() @ p_tk.T
    return h / h.norm(dim=1, keepdim=True)


def vertex_prototypes(c: int) -> torch.Tensor:
    return torch.from_numpy(probability_simplex_prototypes(c))


@pytest.mark.parametrize(("c_t", "c_k"), [(10, 4), (7, 7), (100, 50)])
def test_psp_and_lsp_match_algorithm_1(c_t, c_k):
    logits = torch.randn(6, c_t, generator=torch.Generator().manual_seed(c_t), dtype=torch.float64)
    for outputs in (torch.softmax(logits, dim=1), logits):
        h = simplex_projection(outputs, c_k)
        torch.testing.assert_close(h, algorithm_1(outputs, c_t, c_k))
        torch.testing.assert_close(h.sum(dim=1), torch.zeros(6, dtype=torch.float64))
        torch.testing.assert_close(h.norm(dim=1), torch.ones(6, dtype=torch.float64))


def test_lsp_without_centring_is_eq_6():
    logits = torch.tensor([[3.0, -1.0, 2.0, 7.0]])
    expected = torch.tensor([[3.0, -1.0, 2.0]]) / math.sqrt(14.0)
    torch.testing.assert_close(simplex_projection(logits, 3, center=False), expected)


def test_prop_2_projected_new_prototypes_equal_old_ones():
    c_k, c_t = 4, 9
    new, old = vertex_prototypes(c_t), vertex_prototypes(c_k)
    p_tk = torch.cat([old, torch.zeros(c_k, c_t - c_k, dtype=torch.float64)], dim=1)  # [V^k | 0]
    torch.testing.assert_close(new[:c_k] @ p_tk.T, old)
    torch.testing.assert_close(simplex_projection(new[:c_k], c_k), F.normalize(old, dim=1))


def test_prop_1_new_prototypes_are_orthogonal_to_padded_old_ones():
    c_k, c_t = 5, 8
    padded_old = torch.cat([vertex_prototypes(c_k), torch.zeros(c_k, c_t - c_k, dtype=torch.float64)], dim=1)
    new_classes = vertex_prototypes(c_t)[c_k:]
    torch.testing.assert_close(new_classes @ padded_old.T, torch.zeros(c_t - c_k, c_k, dtype=torch.float64))


def test_topk_project_first_is_sparse_by_hand():
    f = torch.tensor([[0.5, 0.3, 0.1, 0.1, 0.0]])
    # first 4: centred [0.25, 0.05, -0.15, -0.15] -> keep top 2 -> normalise
    expected = torch.tensor([[0.25, 0.05, 0.0, 0.0]]) / math.sqrt(0.25**2 + 0.05**2)
    torch.testing.assert_close(simplex_projection(f, 4, topk=2), expected)


def test_topk_sparsify_first_by_hand():
    f = torch.tensor([[0.5, 0.3, 0.1, 0.1]])
    # keep [0.5, 0.3, 0, 0] -> centred [0.3, 0.1, -0.2, -0.2] -> normalise by sqrt(0.18)
    expected = torch.tensor([[0.3, 0.1, -0.2, -0.2]]) / math.sqrt(0.18)
    torch.testing.assert_close(simplex_projection(f, 4, topk=2, topk_order="sparsify_first"), expected)


def test_topk_ties_go_to_lower_index():
    h = simplex_projection(torch.full((1, 4), 0.25), 4, center=False, topk=2)
    torch.testing.assert_close(h, torch.tensor([[1.0, 1.0, 0.0, 0.0]]) / math.sqrt(2.0))


def test_projection_errors():
    with pytest.raises(ValueError, match="at least the gallery's classes"):
        simplex_projection(torch.zeros(2, 3), 4)
    with pytest.raises(ValueError, match="topk"):
        simplex_projection(torch.zeros(2, 5), 4, topk=5)
    with pytest.raises(ValueError, match="topk_order"):
        simplex_projection(torch.zeros(2, 5), 4, topk=2, topk_order="middle")


def tiny_net(**kwargs):
    return build_model(backbone="small_cnn", in_channels=1, width=8, **kwargs)


def test_extract_outputs_on_cpu():
    net = tiny_net(head="linear", num_classes=5)
    images = torch.randn(7, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    raw = extract_outputs(net, images, batch_size=3, device="cpu")
    assert set(raw) == {"encoder", "logits", "softmax"}
    assert raw["encoder"].shape == (7, 8) and raw["logits"].shape == (7, 5)
    assert all(array.dtype == np.float32 for array in raw.values())
    np.testing.assert_allclose(raw["softmax"].sum(axis=1), np.ones(7), rtol=1e-6)
    assert net.training  # mode restored
    net.eval()
    with torch.no_grad():
        expected = net(images)
    np.testing.assert_allclose(raw["logits"], expected.logits.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(raw["encoder"], expected.features.numpy(), rtol=1e-5, atol=1e-6)


def test_extract_outputs_from_batches_with_labels_in_class_order():
    net = tiny_net(head="dsimplex", num_classes=4, label_allocation="right_to_left").eval()
    images = torch.randn(4, 1, 8, 8)
    batches = [(images[:2], torch.tensor([0, 1])), (images[2:], torch.tensor([2, 3]))]
    raw = extract_outputs(net, batches, device="cpu")
    np.testing.assert_array_equal(raw["labels"], [0, 1, 2, 3])
    with torch.no_grad():
        head_order = net(images).logits.numpy()
    np.testing.assert_allclose(raw["logits"], head_order[:, ::-1], rtol=1e-5, atol=1e-6)


def test_output_view_and_cell_features():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 6)).astype(np.float32)
    softmax = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    raw = {"encoder": rng.normal(size=(5, 3)).astype(np.float32), "logits": logits, "softmax": softmax}
    np.testing.assert_array_equal(output_view(raw, "encoder"), raw["encoder"])
    np.testing.assert_array_equal(output_view(raw, "softmax", topk=2), softmax)  # topk is PSP/LSP only
    psp = output_view(raw, "psp", columns=4)
    np.testing.assert_allclose(psp, algorithm_1(torch.from_numpy(softmax), 6, 4).numpy(), rtol=1e-5, atol=1e-6)
    lsp = output_view(raw, "lsp", columns=4, topk=2)
    assert lsp.shape == (5, 4) and ((lsp != 0).sum(axis=1) == 2).all()
    with pytest.raises(ValueError, match="class columns"):
        output_view(raw, "psp")
    with pytest.raises(ValueError, match="unknown feature view"):
        output_view(raw, "penultimate")
    with pytest.raises(ValueError, match="extract them"):
        output_view({"encoder": raw["encoder"]}, "lsp", columns=4)


def test_cell_features_aligns_columns_by_hand():
    # query model outputs classes (b, a, c), gallery model (a, b): the query keeps columns 1, 0 in that order
    q_soft = np.array([[0.2, 0.7, 0.1]], np.float32)
    g_soft = np.array([[0.6, 0.4]], np.float32)
    q, g = cell_features({"softmax": q_soft}, {"softmax": g_soft}, "psp", columns=([1, 0], [0, 1]))
    s = 1 / math.sqrt(2)
    np.testing.assert_allclose(q, [[s, -s]], rtol=1e-6)  # (0.7, 0.2) centred: (0.25, -0.25)
    np.testing.assert_allclose(g, [[s, -s]], rtol=1e-6)
    # an int is C^k: both sides keep their first C^k outputs; top-1 of (0.2, 0.7) - 0.45 keeps class 1 only
    q, g = cell_features({"softmax": q_soft}, {"softmax": g_soft}, "psp", columns=2, topk=1)
    np.testing.assert_allclose(q, [[0.0, 1.0]]) and np.testing.assert_allclose(g, [[1.0, 0.0]])
    q, g = cell_features({"encoder": q_soft}, {"encoder": g_soft}, "encoder", columns=2, topk=1)
    assert q is q_soft and g is g_soft


def test_numpy_projection_keeps_float64_and_matches_algorithm_1():
    x = np.random.default_rng(1).normal(size=(4, 7))
    out = project_simplex(x, 5)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, algorithm_1(torch.from_numpy(x), 7, 5).numpy(), rtol=1e-12, atol=1e-12)


# ---- neural collapse ----------------------------------------------------------------------------

def collapsed(num_classes: int = 4, per_class: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Every sample sits on its class's probability-simplex prototype (PSP features of a collapsed model)."""
    prototypes = probability_simplex_prototypes(num_classes)
    prototypes /= np.linalg.norm(prototypes, axis=1, keepdims=True)
    labels = np.repeat(np.arange(num_classes), per_class)
    return prototypes[labels], labels


def test_perfect_collapse_scores_zero_everywhere():
    features, labels = collapsed()
    report = collapse_report(
        features, labels, weights=probability_simplex_prototypes(4), predictions=labels
    )
    for value in report.values():
        assert value == pytest.approx(0.0, abs=1e-12)


def test_nc1_by_hand():
    # class 0 at 0.5, 1.5 (mean 1), class 1 at -0.5, -1.5 (mean -1): Sigma_W = 0.25, Sigma_B = 1, C = 2
    features = np.array([[0.5], [1.5], [-0.5], [-1.5]])
    assert nc1_variability(features, np.array([0, 0, 1, 1])) == pytest.approx(0.125)


def test_nc2_by_hand():
    # class means 0, 1, 5 -> mu_G = 2 -> norms 2, 1, 3: std sqrt(2/3), mean 2
    features, labels = np.array([[0.0], [1.0], [5.0]]), np.array([0, 1, 2])
    assert nc2_equinorm(features, labels) == pytest.approx(math.sqrt(2 / 3) / 2)
    # centred means -2, -1, 3: cosines 1, -1, -1 -> |c + 1/2| = 1.5, 0.5, 0.5
    assert nc2_equiangularity(features, labels) == pytest.approx(2.5 / 3)


def test_nc3_compares_normalised_matrices():
    features, labels = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 2.0]]), np.array([0, 1, 2])
    means = features - features.mean(axis=0)
    assert nc3_self_duality(features, labels, 3 * means) == pytest.approx(0.0, abs=1e-12)
    assert nc3_self_duality(features, labels, -means) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="weights of shape"):
        nc3_self_duality(features, labels, np.zeros((3, 5)))


def test_nc4_by_hand():
    # class means 0.2 and 1.5: the sample at 1.0 is nearest to class 1, so NCC says [0, 0, 1, 1]
    features, labels = np.array([[0.0], [0.4], [1.0], [2.0]]), np.array([0, 0, 1, 1])
    assert nc4_ncc_mismatch(features, labels, np.array([0, 1, 1, 1])) == pytest.approx(0.25)


def test_collapse_needs_two_classes():
    with pytest.raises(ValueError, match="at least 2 classes"):
        nc1_variability(np.ones((3, 2)), np.zeros(3))
