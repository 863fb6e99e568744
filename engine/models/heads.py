"""Classifier heads: a learnable, expandable linear head and two fixed prototype heads.

All heads map ``(batch, feature_dim)`` features to ``(batch, num_outputs)`` logits and expose their
weight matrix as ``head.weight`` with one row per output (shape ``(num_outputs, feature_dim)``).
Fixed heads keep it in a buffer, so it is saved in checkpoints but never trained.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

LABEL_ALLOCATIONS = ("left_to_right", "right_to_left")
DSIMPLEX_NORMALIZATIONS = ("row", "frobenius", "frobenius_uncentred")


def dsimplex_prototypes(num_classes: int, normalization: str = "row") -> torch.Tensor:
    """The ``K = num_classes`` vertices of a regular simplex centred at the origin, shape ``(K, K-1)``.

    Construction of CoReS (P2 Eq. 10): the K-1 standard basis vectors of R^(K-1) plus the vertex
    ``(1 - sqrt(K)) / (K-1) * (1, ..., 1)``; the vertices are then centred, so pairwise cosines are
    exactly ``-1/(K-1)`` and the rows sum to zero (rank K-1).

    ``normalization`` only rescales the matrix, the geometry is identical. With logits = features @ W^T and
    no temperature, it changes the logit scale the backbone has to learn:
    - ``"row"`` (default): every prototype has unit norm, as in the released code of papers 001/003
      (iamcl2r ``src/iamcl2r/models/__init__.py: dsimplex``; CL2R ``src/cl2r/model.py: dsimplex``).
    - ``"frobenius"``: centred, then the whole matrix scaled to unit Frobenius norm, so every prototype
      has norm ``1/sqrt(K)``: the snippet printed in P1 Appendix D.
    - ``"frobenius_uncentred"``: the vertices divided by the Frobenius norm of the *uncentred* matrix, then
      centred, as paper 002's released code does (cores-compatibility ``src/cores/model.py: dsimplex``):
      every prototype has norm ``1 / sqrt(K (1 + v^2))`` with ``v = (1 - sqrt(K)) / (K-1)``, 0.4 % below
      ``1/sqrt(K)`` at K = 100 and 2.8 % below at K = 10.
    """
    if num_classes < 2:
        raise ValueError(f"a d-Simplex needs at least 2 classes, got {num_classes}")
    if normalization not in DSIMPLEX_NORMALIZATIONS:
        raise ValueError(f"unknown d-Simplex normalization {normalization!r}; use one of {DSIMPLEX_NORMALIZATIONS}")
    dim = num_classes - 1
    vertices = torch.zeros(num_classes, dim, dtype=torch.float64)
    vertices[:dim] = torch.eye(dim, dtype=torch.float64)
    vertices[dim] = (1.0 - math.sqrt(num_classes)) / dim
    if normalization == "frobenius_uncentred":
        vertices /= torch.linalg.norm(vertices)
    vertices -= vertices.mean(dim=0, keepdim=True)
    if normalization == "row":
        vertices /= vertices.norm(dim=1, keepdim=True)
    elif normalization == "frobenius":
        vertices /= torch.linalg.norm(vertices)
    return vertices.to(torch.float32)


def etf_prototypes(num_classes: int, feature_dim: int, *, seed: int = 0) -> torch.Tensor:
    """A simplex equiangular tight frame of K unit prototypes in R^d, shape ``(K, d)``, d >= K-1.

    Yang et al. 2022: ``W = sqrt(K/(K-1)) U (I_K - 1/K 1 1^T)`` with ``U`` (d x K) a random matrix
    with orthonormal columns drawn from ``seed``; the rows returned here are the columns of W.
    That U needs d >= K. For d = K-1 (not covered by the formula) U is taken as ``R B^T`` with R a
    random rotation of R^(K-1) and B an orthonormal basis of the complement of (1, ..., 1); the
    result has the same Gram matrix ``K/(K-1) (I - J/K)``: a randomly rotated d-Simplex.
    """
    if num_classes < 2:
        raise ValueError(f"an ETF needs at least 2 classes, got {num_classes}")
    if feature_dim < num_classes - 1:
        raise ValueError(
            f"an ETF with {num_classes} classes needs at least {num_classes - 1} feature dimensions, got {feature_dim}"
        )
    generator = torch.Generator().manual_seed(seed)
    centering = torch.eye(num_classes, dtype=torch.float64) - 1.0 / num_classes
    if feature_dim >= num_classes:
        gaussian = torch.randn(feature_dim, num_classes, generator=generator, dtype=torch.float64)
        partial_orthogonal = torch.linalg.qr(gaussian).Q
    else:
        gaussian = torch.randn(feature_dim, feature_dim, generator=generator, dtype=torch.float64)
        rotation = torch.linalg.qr(gaussian).Q
        basis = dsimplex_prototypes(num_classes).to(torch.float64) * math.sqrt((num_classes - 1) / num_classes)
        partial_orthogonal = rotation @ basis.T
    frame = math.sqrt(num_classes / (num_classes - 1)) * partial_orthogonal @ centering
    return frame.T.contiguous().to(torch.float32)


class LinearHead(nn.Module):
    """Learnable linear classifier (bias-free by default, as ``z = W phi(x)`` in the papers).

    ``expand(n)`` adds ``n`` outputs and keeps the old rows, for methods that grow the classifier
    (independent training, BCT, ER). Class ``y`` is output ``y``.
    """

    def __init__(self, feature_dim: int, num_classes: int, *, bias: bool = False) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        self.feature_dim = feature_dim
        self.fc = nn.Linear(feature_dim, num_classes, bias=bias)

    @property
    def num_outputs(self) -> int:
        return self.fc.out_features

    @property
    def weight(self) -> torch.Tensor:
        return self.fc.weight

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features)

    def class_to_output(self, labels: torch.Tensor) -> torch.Tensor:
        return labels

    def output_to_class(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs

    def expand(self, num_new: int, *, seed: int) -> None:
        """Append ``num_new`` freshly initialised outputs; old rows (and biases) are kept exactly.

        The new rows get ``nn.Linear``'s default initialisation drawn from ``seed`` (the global RNG is
        neither used nor advanced). The parameters are new tensors: rebuild the optimiser afterwards.
        """
        if num_new < 1:
            raise ValueError(f"num_new must be positive, got {num_new}")
        old = self.fc
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            grown = nn.Linear(self.feature_dim, old.out_features + num_new, bias=old.bias is not None)
        grown = grown.to(device=old.weight.device, dtype=old.weight.dtype)
        with torch.no_grad():
            grown.weight[: old.out_features] = old.weight
            if old.bias is not None:
                grown.bias[: old.out_features] = old.bias
        self.fc = grown


class FixedHead(nn.Module):
    """Logits = features @ prototypes^T with frozen prototypes; no bias, no temperature.

    ``label_allocation`` assigns classes to prototypes: ``"left_to_right"`` puts class y on
    prototype y, ``"right_to_left"`` on prototype K-1-y (IAM-CL2R fine-tuning, so fine-tuned classes
    never collide with the classes of a left-to-right pretrained replacement model).
    """

    def __init__(self, prototypes: torch.Tensor, *, label_allocation: str = "left_to_right") -> None:
        super().__init__()
        if label_allocation not in LABEL_ALLOCATIONS:
            raise ValueError(f"unknown label allocation {label_allocation!r}; use one of {LABEL_ALLOCATIONS}")
        self.label_allocation = label_allocation
        self.register_buffer("prototypes", prototypes.clone())

    @property
    def num_outputs(self) -> int:
        return self.prototypes.shape[0]

    @property
    def feature_dim(self) -> int:
        return self.prototypes.shape[1]

    @property
    def weight(self) -> torch.Tensor:
        return self.prototypes

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.linear(features, self.prototypes)

    def class_to_output(self, labels: torch.Tensor) -> torch.Tensor:
        """The output index of each class label (labels must lie in [0, K))."""
        if self.label_allocation == "right_to_left":
            return self.num_outputs - 1 - labels
        return labels

    def output_to_class(self, outputs: torch.Tensor) -> torch.Tensor:
        """The class label of each output index (both allocations are their own inverse)."""
        return self.class_to_output(outputs)


class DSimplexHead(FixedHead):
    """d-Simplex fixed classifier with ``num_classes`` (K) pre-allocated classes on K-1 features."""

    def __init__(self, num_classes: int, *, normalization: str = "row", label_allocation: str = "left_to_right") -> None:
        super().__init__(dsimplex_prototypes(num_classes, normalization), label_allocation=label_allocation)
        self.normalization = normalization


class ETFHead(FixedHead):
    """Fixed simplex-ETF classifier (Yang et al. 2022) with K pre-allocated classes in R^d, d >= K-1."""

    def __init__(
        self, num_classes: int, feature_dim: int, *, seed: int = 0, label_allocation: str = "left_to_right"
    ) -> None:
        super().__init__(etf_prototypes(num_classes, feature_dim, seed=seed), label_allocation=label_allocation)
        self.seed = seed


Head = LinearHead | DSimplexHead | ETFHead

HEADS: dict[str, type[nn.Module]] = {
    "linear": LinearHead,
    "dsimplex": DSimplexHead,
    "etf": ETFHead,
}
