"""The two adapter layers of paper 004: a strictly orthogonal map (B_perp) and an affine map (B_lambda, F).

Both act on row vectors: ``y = x W^T (+ b)`` with ``W`` of shape ``(out_dim, in_dim)``, like
``torch.nn.Linear``, so ``weight`` is directly the ``W`` of the lambda-orthogonality regulariser.
"""
from __future__ import annotations

import math

import torch
from torch import nn

AFFINE_INITS = ("identity", "uniform")


class OrthogonalAdapter(nn.Module):
    """B_perp (paper 004 Sec. 3.2): ``x -> x W^T`` with ``W = expm(A - A^T)``, ``A`` strictly upper-triangular.

    Only the strictly upper-triangular entries of the ``(dim, dim)`` parameter ``A`` are used (the
    rest never receive a gradient), so ``P = A - A^T`` is skew-symmetric and ``W = e^P`` is a
    rotation. No bias (the paper mentions none). ``A`` starts at zero, i.e. ``W = I``.

    Limitation of the parametrisation (Lezcano-Casado & Martinez-Rubio 2019, used by the paper):
    ``e^P`` always has determinant +1, so a map that needs a reflection (det -1) is only reached
    up to one flipped direction.

    During training ``weight`` is the exponential in the parameter's dtype (float32: orthogonal to
    about 1e-6); ``exact_weight()`` evaluates it in float64 before casting, and is what the
    deployed adapter applies.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        if dim < 1:
            raise ValueError(f"an orthogonal adapter needs a dimension >= 1, got {dim}")
        self.dim = dim
        self.A = nn.Parameter(torch.zeros(dim, dim))

    def skew(self) -> torch.Tensor:
        """The skew-symmetric generator ``P = A_up - A_up^T``."""
        upper = torch.triu(self.A, diagonal=1)
        return upper - upper.T

    @property
    def weight(self) -> torch.Tensor:
        """``W = expm(P)`` in the parameter's dtype (differentiable)."""
        return torch.linalg.matrix_exp(self.skew())

    def exact_weight(self) -> torch.Tensor:
        """``W = expm(P)`` computed in float64 and cast back to the parameter's dtype (no gradient)."""
        with torch.no_grad():
            return torch.linalg.matrix_exp(self.skew().double()).to(self.A.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


class AffineAdapter(nn.Module):
    """Affine map ``x -> x W^T + b`` with ``W`` of shape ``(out_dim, in_dim)``: B_lambda (square) and F.

    ``init="identity"``: ``W = I`` (rectangular identity when the sizes differ), ``b = 0``;
    ``init="uniform"``: ``W, b ~ U(-1/sqrt(in_dim), 1/sqrt(in_dim))``, the bound of
    ``torch.nn.Linear``'s default, drawn from ``generator`` so that it is seeded.
    """

    def __init__(
        self, in_dim: int, out_dim: int, *, init: str = "uniform", generator: torch.Generator | None = None
    ) -> None:
        super().__init__()
        if in_dim < 1 or out_dim < 1:
            raise ValueError(f"an affine adapter needs positive sizes, got in_dim={in_dim}, out_dim={out_dim}")
        if init not in AFFINE_INITS:
            raise ValueError(f"init must be one of {AFFINE_INITS}, got {init!r}")
        self.in_dim, self.out_dim = in_dim, out_dim
        if init == "identity":
            weight, bias = torch.eye(out_dim, in_dim), torch.zeros(out_dim)
        else:
            bound = 1.0 / math.sqrt(in_dim)
            weight = (torch.rand(out_dim, in_dim, generator=generator) * 2.0 - 1.0) * bound
            bias = (torch.rand(out_dim, generator=generator) * 2.0 - 1.0) * bound
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T + self.bias
