"""``AdapterPair``: the trained forward/backward adapters of one old/new model pair, applied to stored features.

Spaces (paper 004 Sec. 3.2-3.4). Old features have ``old_dim`` components, new ones ``new_dim``.
For ``kind`` "perp"/"lambda" the backward adapter is square, so both sides are first brought to a
common width (``dim_mismatch``):

* ``"truncate"`` (the paper's reading, default): the wider features keep their first
  ``min(old_dim, new_dim)`` components ("the higher-dimensional feature vector is truncated").
* ``"pad"`` (our option): the narrower features get trailing zeros up to ``max(old_dim, new_dim)``;
  the rotation then acts on the whole new vector and loses nothing.

``B`` maps the (truncated/padded) new features into the old space; ``F`` maps the full old
features into that same backward-aligned space. For ``kind="fct"`` there is no ``B`` (the
identity), and ``F`` maps old features into the raw new space.
Wherever two views of different widths are compared (e.g. raw new vs raw old) the same rule
reconciles them (``match_dims``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.adapters.inputs import as_features
from engine.core.kinds import PAPER_ADAPTERS
from engine.adapters.losses import orthogonality_deviation
from engine.adapters.modules import AffineAdapter, OrthogonalAdapter

KINDS = PAPER_ADAPTERS  # perp (B_perp + F), lambda (B_lambda + F), fct (F only)
DIM_MISMATCH = ("truncate", "pad")
ADAPTERS_FORMAT = "compatibility-lab/adapters/1"


def common_dim(old_dim: int, new_dim: int, dim_mismatch: str) -> int:
    """Width of the backward (old-aligned) space: ``min`` for "truncate", ``max`` for "pad"."""
    if dim_mismatch not in DIM_MISMATCH:
        raise ValueError(f"dim_mismatch must be one of {DIM_MISMATCH}, got {dim_mismatch!r}")
    return min(old_dim, new_dim) if dim_mismatch == "truncate" else max(old_dim, new_dim)


def to_width(features: torch.Tensor, width: int) -> torch.Tensor:
    """Keep the first ``width`` columns, or append zero columns up to ``width``."""
    have = features.shape[1]
    if have >= width:
        return features[:, :width]
    return torch.cat([features, features.new_zeros(features.shape[0], width - have)], dim=1)


def build_adapters(
    kind: str,
    old_dim: int,
    new_dim: int,
    *,
    dim_mismatch: str = "truncate",
    with_forward: bool = True,
    forward_init: str = "uniform",
    backward_init: str = "identity",
    generator: torch.Generator | None = None,
) -> tuple[AffineAdapter | None, OrthogonalAdapter | AffineAdapter | None]:
    """Fresh ``(forward, backward)`` modules for ``kind`` (see the module docstring for the spaces)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    width = common_dim(old_dim, new_dim, dim_mismatch)
    if kind == "fct":
        if not with_forward:
            raise ValueError(
                "kind='fct' is the forward transformation alone; with_forward=False leaves nothing to train"
            )
        return AffineAdapter(old_dim, new_dim, init=forward_init, generator=generator), None
    if kind == "perp":
        if backward_init != "identity":
            raise ValueError(
                f"B_perp always starts at the identity (A = 0); backward_init={backward_init!r} "
                "applies to kind='lambda'"
            )
        backward: OrthogonalAdapter | AffineAdapter = OrthogonalAdapter(width)
    else:
        backward = AffineAdapter(width, width, init=backward_init, generator=generator)
    forward = AffineAdapter(old_dim, width, init=forward_init, generator=generator) if with_forward else None
    return forward, backward


def _as_tensor(features: np.ndarray | torch.Tensor, width: int, what: str) -> torch.Tensor:
    array = as_features(features, what)
    if array.shape[1] != width:
        raise ValueError(f"{what} have {array.shape[1]} dimensions but the adapters were trained on {width}-d {what}")
    return torch.from_numpy(np.ascontiguousarray(array))


@dataclass
class AdapterPair:
    """Trained adapters of one old/new pair plus the hyper-parameters that produced them.

    ``forward`` is F (``None`` for a backward-only run), ``backward`` is B_perp / B_lambda
    (``None`` for FCT, where B is the identity). ``hyper`` holds the training settings,
    ``history`` the mean loss terms of each epoch.
    """

    kind: str
    old_dim: int
    new_dim: int
    dim_mismatch: str
    forward: AffineAdapter | None
    backward: OrthogonalAdapter | AffineAdapter | None
    hyper: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)

    @property
    def common_dim(self) -> int:
        """Width of the space F maps into and B maps into (the raw new width for FCT)."""
        return self.new_dim if self.kind == "fct" else common_dim(self.old_dim, self.new_dim, self.dim_mismatch)

    def backward_weight(self) -> torch.Tensor | None:
        """B's matrix ``W`` (float64-accurate exponential for B_perp), or ``None`` without B."""
        if self.backward is None:
            return None
        if isinstance(self.backward, OrthogonalAdapter):
            return self.backward.exact_weight().cpu()
        return self.backward.weight.detach().cpu()

    @torch.no_grad()
    def apply_forward(self, old_feats: np.ndarray | torch.Tensor) -> np.ndarray:
        """``F(old)``: old features (N, old_dim) in the backward-aligned space, float32 (N, common_dim)."""
        if self.forward is None:
            raise ValueError("this adapter pair has no forward adapter F (trained with with_forward=False)")
        x = _as_tensor(old_feats, self.old_dim, "old features")
        return (x @ self.forward.weight.detach().cpu().T + self.forward.bias.detach().cpu()).numpy()

    @torch.no_grad()
    def apply_backward(self, new_feats: np.ndarray | torch.Tensor) -> np.ndarray:
        """``B(new)``: new features (N, new_dim) mapped into the old space, float32 (N, common_dim).

        Without a backward adapter (FCT) B is the identity and the raw new features come back.
        """
        x = _as_tensor(new_feats, self.new_dim, "new features")
        if self.backward is None:
            return x.numpy()
        x = to_width(x, self.common_dim)
        weight = self.backward_weight()
        out = x @ weight.T
        if isinstance(self.backward, AffineAdapter):
            out = out + self.backward.bias.detach().cpu()
        return out.numpy()

    def match_dims(self, query: np.ndarray, gallery: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bring two views of different widths to one width by this pair's ``dim_mismatch`` rule."""
        if query.shape[1] == gallery.shape[1]:
            return query, gallery
        width = common_dim(query.shape[1], gallery.shape[1], self.dim_mismatch)
        q, g = torch.from_numpy(np.ascontiguousarray(query)), torch.from_numpy(np.ascontiguousarray(gallery))
        return to_width(q, width).numpy(), to_width(g, width).numpy()

    def describe(self) -> dict[str, Any]:
        """JSON-able hyper-parameters and shapes (plus B's final ``||W W^T - I||_F``)."""
        weight = self.backward_weight()
        deviation = None if weight is None else float(orthogonality_deviation(weight.double()))
        return {
            "kind": self.kind,
            "old_dim": self.old_dim,
            "new_dim": self.new_dim,
            "common_dim": self.common_dim,
            "dim_mismatch": self.dim_mismatch,
            "with_forward": self.forward is not None,
            **self.hyper,
            "orthogonality_deviation": deviation,
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat ``{"forward.weight", "forward.bias", "backward.A" | "backward.weight", "backward.bias"}``:
        contiguous CPU tensors, ready for ``safetensors.torch.save_file``."""
        tensors: dict[str, torch.Tensor] = {}
        for prefix, module in (("forward", self.forward), ("backward", self.backward)):
            if module is not None:
                for name, tensor in module.state_dict().items():
                    tensors[f"{prefix}.{name}"] = tensor.detach().to("cpu").contiguous()
        return tensors

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Load tensors written by ``state_dict`` (strict: missing or unexpected keys raise)."""
        expected = set(self.state_dict())
        if set(tensors) != expected:
            raise ValueError(
                f"adapter tensors do not match this pair: missing {sorted(expected - set(tensors))}, "
                f"unexpected {sorted(set(tensors) - expected)}"
            )
        for prefix, module in (("forward", self.forward), ("backward", self.backward)):
            if module is not None:
                own = {k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + ".")}
                module.load_state_dict(own, strict=True)

    def save(self, path: str | Path) -> None:
        """Write the tensors and ``describe()`` + history (JSON metadata) to a safetensors file."""
        metadata = {
            "format": ADAPTERS_FORMAT,
            "describe": json.dumps(self.describe()),
            "history": json.dumps(self.history),
        }
        save_file(self.state_dict(), str(path), metadata=metadata)

    @classmethod
    def load(cls, path: str | Path) -> "AdapterPair":
        """Rebuild a pair saved by ``save`` (no pickle; modules rebuilt from the JSON description)."""
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        if metadata.get("format") != ADAPTERS_FORMAT:
            raise ValueError(
                f"{path} is not a Compatibility Lab adapter file (format {metadata.get('format')!r}, "
                f"expected {ADAPTERS_FORMAT!r})"
            )
        info = json.loads(metadata["describe"])
        shape_keys = (
            "kind", "old_dim", "new_dim", "common_dim", "dim_mismatch", "with_forward", "orthogonality_deviation"
        )
        forward, backward = build_adapters(
            info["kind"],
            info["old_dim"],
            info["new_dim"],
            dim_mismatch=info["dim_mismatch"],
            with_forward=info["with_forward"],
            forward_init="identity",
            backward_init="identity",
        )
        pair = cls(
            kind=info["kind"],
            old_dim=info["old_dim"],
            new_dim=info["new_dim"],
            dim_mismatch=info["dim_mismatch"],
            forward=forward,
            backward=backward,
            hyper={k: v for k, v in info.items() if k not in shape_keys},
            history=json.loads(metadata.get("history", "[]")),
        )
        pair.load_state_dict(tensors)
        return pair
