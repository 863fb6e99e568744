"""Networks: backbones, heads (learnable, d-Simplex, ETF), the full ``Net`` and safetensors checkpoints."""
from engine.models.backbones import BACKBONES, TORCHVISION_ARCHS, Projection, build_backbone
from engine.models.checkpoint import load_checkpoint, read_checkpoint_meta, save_checkpoint
from engine.models.heads import (
    HEADS,
    LABEL_ALLOCATIONS,
    DSimplexHead,
    ETFHead,
    FixedHead,
    Head,
    LinearHead,
    dsimplex_prototypes,
    etf_prototypes,
)
from engine.models.net import ModelOutput, ModelSpec, Net, build_from_spec, build_model

__all__ = [
    "BACKBONES",
    "HEADS",
    "LABEL_ALLOCATIONS",
    "TORCHVISION_ARCHS",
    "DSimplexHead",
    "ETFHead",
    "FixedHead",
    "Head",
    "LinearHead",
    "ModelOutput",
    "ModelSpec",
    "Net",
    "Projection",
    "build_backbone",
    "build_from_spec",
    "build_model",
    "dsimplex_prototypes",
    "etf_prototypes",
    "load_checkpoint",
    "read_checkpoint_meta",
    "save_checkpoint",
]
