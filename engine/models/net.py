"""The full network: backbone -> optional projection -> head, and the factory that builds it."""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from torch import nn

from engine.models.backbones import BACKBONES, DEFAULT_SMALL_CNN_WIDTH, Projection, build_backbone
from engine.models.heads import HEADS, DSimplexHead, ETFHead, Head, LinearHead


class ModelOutput(NamedTuple):
    """``features``: the encoder view (projection output if any, else the backbone's); ``logits``: head output."""

    features: torch.Tensor
    logits: torch.Tensor


@dataclass(frozen=True)
class ModelSpec:
    """JSON-able description of a network's architecture; enough to rebuild it before loading weights.

    ``feature_dim`` is the resolved size of the features fed to the head; ``num_classes`` is the
    number of head outputs (K pre-allocated classes for fixed heads). ``frame_seed``: the seed of a random fixed
    classifier (the ETF head's frame), the run's seed so that every model of a run shares one frame; ``None``
    (checkpoints written before the field, and heads without a random frame) falls back to ``seed``.
    """

    backbone: str
    head: str
    num_classes: int
    feature_dim: int
    in_channels: int = 3
    width: int | None = None
    seed: int = 0
    label_allocation: str = "left_to_right"
    dsimplex_normalization: str = "row"
    linear_bias: bool = False
    frame_seed: int | None = None


class Net(nn.Module):
    """Backbone -> optional bias-free projection -> head; ``forward`` returns a ``ModelOutput``."""

    def __init__(self, spec: ModelSpec, backbone: nn.Module, projection: Projection | None, head: Head) -> None:
        super().__init__()
        self._spec = spec
        self.backbone = backbone
        self.projection = projection
        self.head = head

    @property
    def spec(self) -> ModelSpec:
        """The architecture as it is now (a linear head may have grown since construction)."""
        return replace(self._spec, num_classes=self.head.num_outputs)

    @property
    def feature_dim(self) -> int:
        return self.head.feature_dim

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder features only (what retrieval with the ``encoder`` view uses)."""
        features = self.backbone(x)
        if self.projection is not None:
            features = self.projection(features)
        return features

    def forward(self, x: torch.Tensor) -> ModelOutput:
        features = self.embed(x)
        return ModelOutput(features=features, logits=self.head(features))

    def frozen_copy(self) -> Net:
        """A deep copy in eval mode with gradients switched off (the "old model" of BCT, HOC, ...)."""
        old = copy.deepcopy(self)
        old.eval()
        old.requires_grad_(False)
        return old


def build_model(
    *,
    backbone: str,
    head: str,
    num_classes: int,
    feature_dim: int | None = None,
    in_channels: int = 3,
    width: int | None = None,
    seed: int = 0,
    label_allocation: str = "left_to_right",
    dsimplex_normalization: str = "row",
    linear_bias: bool = False,
    frame_seed: int | None = None,
) -> Net:
    """Build a seeded network; the global RNG is left untouched.

    ``num_classes`` is the number of head outputs: the classes seen so far for ``"linear"``, the K
    pre-allocated classes for ``"dsimplex"`` and ``"etf"``. ``feature_dim`` (default: what the head
    needs, else the backbone's output size) adds a bias-free projection when it differs from the
    backbone output; ``"dsimplex"`` always uses K-1 features. ``width`` sizes ``small_cnn``.
    ``frame_seed`` draws the ``"etf"`` head's frame (default ``seed``): a run passes its own seed so
    that every step's model shares one fixed classifier while the weights follow ``seed``.
    """
    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; known heads: {', '.join(sorted(HEADS))}")
    if backbone not in BACKBONES:
        raise ValueError(f"unknown backbone {backbone!r}; known backbones: {', '.join(sorted(BACKBONES))}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be positive, got {num_classes}")
    if head == "linear" and label_allocation != "left_to_right":
        raise ValueError("a linear head maps class y to output y; label_allocation applies to fixed heads only")
    if head != "linear" and linear_bias:
        raise ValueError(f"fixed head {head!r} has no bias; linear_bias applies to the linear head only")
    if head != "dsimplex" and dsimplex_normalization != "row":
        raise ValueError("dsimplex_normalization applies to the 'dsimplex' head only")
    if head != "etf" and frame_seed is not None:
        raise ValueError("frame_seed applies to the 'etf' head only (the d-Simplex has no random frame)")

    backbone_dim = _backbone_dim(backbone, width)
    resolved_dim = _resolve_feature_dim(head, num_classes, feature_dim, backbone_dim, backbone)
    spec = ModelSpec(
        backbone=backbone,
        head=head,
        num_classes=num_classes,
        feature_dim=resolved_dim,
        in_channels=in_channels,
        width=width,
        seed=seed,
        label_allocation=label_allocation,
        dsimplex_normalization=dsimplex_normalization,
        linear_bias=linear_bias,
        frame_seed=frame_seed,
    )
    return build_from_spec(spec)


def build_from_spec(spec: ModelSpec) -> Net:
    """Build the network a ``ModelSpec`` describes, initialised from ``spec.seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        backbone_module, backbone_dim = build_backbone(spec.backbone, in_channels=spec.in_channels, width=spec.width)
        projection = Projection(backbone_dim, spec.feature_dim) if spec.feature_dim != backbone_dim else None
        head_module = _build_head(spec)
    return Net(spec, backbone_module, projection, head_module)


def _backbone_dim(backbone: str, width: int | None) -> int:
    entry = BACKBONES[backbone]
    if entry.feature_dim is not None:
        return entry.feature_dim
    return DEFAULT_SMALL_CNN_WIDTH if width is None else width


def _resolve_feature_dim(head: str, num_classes: int, feature_dim: int | None, backbone_dim: int, backbone: str) -> int:
    if head == "dsimplex":
        if num_classes < 2:
            raise ValueError(f"a d-Simplex head needs at least 2 pre-allocated classes, got {num_classes}")
        if feature_dim is not None and feature_dim != num_classes - 1:
            raise ValueError(
                f"a d-Simplex head with K={num_classes} classes works on K-1={num_classes - 1} features, "
                f"not {feature_dim}; leave feature_dim unset"
            )
        return num_classes - 1
    resolved = backbone_dim if feature_dim is None else feature_dim
    if resolved < 1:
        raise ValueError(f"feature_dim must be positive, got {resolved}")
    if head == "etf" and resolved < num_classes - 1:
        raise ValueError(
            f"an ETF head with {num_classes} classes needs at least {num_classes - 1} features but {backbone!r} "
            f"gives {resolved}; set feature_dim >= {num_classes - 1} to add a projection"
        )
    return resolved


def _build_head(spec: ModelSpec) -> Head:
    if spec.head == "linear":
        return LinearHead(spec.feature_dim, spec.num_classes, bias=spec.linear_bias)
    if spec.head == "dsimplex":
        return DSimplexHead(
            spec.num_classes, normalization=spec.dsimplex_normalization, label_allocation=spec.label_allocation
        )
    if spec.head == "etf":
        frame_seed = spec.seed if spec.frame_seed is None else spec.frame_seed
        return ETFHead(spec.num_classes, spec.feature_dim, seed=frame_seed, label_allocation=spec.label_allocation)
    raise ValueError(f"unknown head {spec.head!r}; known heads: {', '.join(sorted(HEADS))}")
