"""Loss terms the methods are built from: pure functions of feature, logit and target tensors.

Every function returns a scalar averaged over the batch (or over the classes present), so the
terms of a method combine with batch-size-independent weights. Feature terms are computed in
float32, so half-precision features under autocast cannot overflow the squared distances.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from engine.core.vocab import FEATURE_DISTANCES, NCE_NEGATIVES



def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """Mean softmax cross-entropy of ``logits / temperature`` over all outputs (1.0: plain CE)."""
    if temperature != 1.0:
        logits = logits / temperature
    return F.cross_entropy(logits, targets)


def info_nce(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    targets: torch.Tensor,
    *,
    scale: float,
    negatives: str = "paper",
) -> torch.Tensor:
    """InfoNCE between old-model anchors and new-model candidates (P1 Eq. 4-5), mean over the batch.

    ``s_ij = scale * cos(anchors_i, candidates_j)``; row i has its positive at j = i.
    - ``"paper"``: loss_i = -s_ii + log sum_{j != i} exp(s_ij), the denominator of Eq. 4 as
      printed (the positive is *not* in it). Needs at least two samples.
    - ``"repo"``: the iamcl2r ``HocLoss``: every same-class entry of row i (its diagonal included)
      is set to 0, not removed, and loss_i = -s_ii + log sum_j exp(s_ij) over the whole row, so
      each same-class pair adds exp(0) = 1 to the denominator.
    """
    if negatives not in NCE_NEGATIVES:
        raise ValueError(f"negatives must be one of {NCE_NEGATIVES}, got {negatives!r}")
    batch = anchors.shape[0]
    if negatives == "paper" and batch < 2:
        raise ValueError(
            "the paper's InfoNCE sums over the other samples of the batch, which is empty for a batch of "
            "one; drop the last incomplete batch (DataLoader drop_last=True) or use negatives='repo'"
        )
    sim = scale * (F.normalize(anchors.float(), dim=1) @ F.normalize(candidates.float(), dim=1).T)
    positive = sim.diagonal()
    if negatives == "paper":
        eye = torch.eye(batch, dtype=torch.bool, device=sim.device)
        negative = torch.logsumexp(sim.masked_fill(eye, float("-inf")), dim=1)
    else:
        same_class = targets.unsqueeze(1) == targets.unsqueeze(0)
        negative = torch.logsumexp(sim.masked_fill(same_class, 0.0), dim=1)
    return (negative - positive).mean()


def feature_distance(new: torch.Tensor, old: torch.Tensor, *, distance: str) -> torch.Tensor:
    """Per-sample distance between new and old features, shape ``(batch,)``.

    ``"l2"``: squared Euclidean distance ``||new - old||^2`` (summed over dimensions).
    ``"cosine"``: ``1 - cos(new, old)``, which is ``||n - o||^2 / 2`` for the L2-normalised
    features n, o (``F.cosine_embedding_loss`` with target 1, as in the CL2R code).
    """
    new, old = new.float(), old.float()
    if distance == "l2":
        return (new - old).pow(2).sum(dim=1)
    if distance == "cosine":
        return 1.0 - F.cosine_similarity(new, old, dim=1)
    raise ValueError(f"distance must be one of {FEATURE_DISTANCES}, got {distance!r}")


def dot_regression(features: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Dot-regression loss of Yang et al. 2022 for unit prototypes: mean of ``1/2 (w_y^T h_hat - 1)^2``.

    ``h_hat`` is the L2-normalised feature and ``w_y`` the fixed unit prototype of the target.
    Because a fixed head computes ``logits = features @ W^T`` (no bias), ``w_y^T h_hat`` is the
    target logit divided by the feature norm, so only the model outputs are needed. The loss is
    zero when every feature points exactly at its prototype.
    """
    target_logits = logits.float().gather(1, targets.unsqueeze(1)).squeeze(1)
    dots = target_logits / features.float().norm(dim=1).clamp_min(1e-12)
    return 0.5 * (dots - 1.0).pow(2).mean()


def class_means(features: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(labels, means, inverse)``: the distinct targets, the mean feature of each, and each sample's row."""
    features = features.float()
    labels, inverse = torch.unique(targets, return_inverse=True)
    sums = features.new_zeros(labels.shape[0], features.shape[1]).index_add(0, inverse, features)
    counts = torch.bincount(inverse, minlength=labels.shape[0]).to(features.dtype).unsqueeze(1)
    return labels, sums / counts, inverse


def class_mean_alignment(
    new: torch.Tensor, old: torch.Tensor, targets: torch.Tensor, classes: torch.Tensor
) -> torch.Tensor:
    """Mean over the ``classes`` present in the batch of ``||mean_new_c - mean_old_c||^2``.

    Class means are taken over the batch samples of each class; 0 when none of ``classes`` is present.
    """
    labels, new_means, _ = class_means(new, targets)
    _, old_means, _ = class_means(old, targets)
    keep = torch.isin(labels, classes)
    if not bool(keep.any()):
        return new.new_zeros(())
    return (new_means[keep] - old_means[keep]).pow(2).sum(dim=1).mean()


def intra_class_variance(features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over samples of ``||f_i - mean_{y_i}||^2`` around the batch class means (0 when collapsed)."""
    _, means, inverse = class_means(features, targets)
    return (features.float() - means[inverse]).pow(2).sum(dim=1).mean()
