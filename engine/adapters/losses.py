"""Loss terms of paper 004 (Eqs. 2, 6, 7, 8): pure functions of tensors, computed in float32."""
from __future__ import annotations

import torch
from torch.nn import functional as F

MSE_REDUCTIONS = ("sum", "mean")


def squared_error(predicted: torch.Tensor, target: torch.Tensor, *, reduction: str = "sum") -> torch.Tensor:
    """Alignment loss ``||predicted - target||_2^2`` (L_B Eq. 2, L_F Eq. 7, FCT), averaged over the batch.

    ``"sum"``: the squared norm as printed (summed over dimensions, mean over samples).
    ``"mean"``: ``torch.nn.functional.mse_loss`` (also averaged over dimensions), the "Mean Squared
    Error" of the text; it equals ``"sum"`` divided by the feature dimension.
    """
    if reduction not in MSE_REDUCTIONS:
        raise ValueError(f"reduction must be one of {MSE_REDUCTIONS}, got {reduction!r}")
    diff = (predicted.float() - target.float()).pow(2)
    return diff.sum(dim=1).mean() if reduction == "sum" else diff.mean()


def orthogonality_deviation(weight: torch.Tensor) -> torch.Tensor:
    """``||W W^T - I||_F`` for ``W`` of shape ``(out, in)`` (``I`` is ``out x out``)."""
    weight = weight.float()
    eye = torch.eye(weight.shape[0], dtype=weight.dtype, device=weight.device)
    return torch.linalg.matrix_norm(weight @ weight.T - eye, ord="fro")


def lambda_orthogonality(weight: torch.Tensor, *, lam: float = 12.0, alpha: float = 1.0) -> torch.Tensor:
    """lambda-orthogonality regulariser (paper 004 Eq. 6): ``sigmoid(alpha (x - lam)) * x``, ``x = ||W W^T - I||_F``.

    About 0 when ``x`` is well below ``lam`` (the map may drift that far from orthogonal for free),
    about ``x`` (soft orthogonality, Eq. 3) when well above, exactly ``lam / 2`` at ``x = lam``.
    ``alpha`` sets the steepness (large alpha approaches the Heaviside step of Eq. 5); the paper
    does not state its value, ours defaults to 1 (transition about +-4 around ``lam``).
    ``lam = 0`` approaches Eq. 3 only for large ``alpha`` (with alpha = 1 the factor at x -> 0 is
    1/2); ``lam = inf`` switches the term off.
    """
    if not alpha > 0 or alpha == float("inf"):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    if not lam >= 0:
        raise ValueError(f"lam must be >= 0 (inf switches the regulariser off), got {lam}")
    x = orthogonality_deviation(weight)
    if lam == float("inf"):
        return x * 0.0
    return torch.sigmoid(alpha * (x - lam)) * x


def supervised_contrastive_loss(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    anchor_labels: torch.Tensor,
    candidate_labels: torch.Tensor | None = None,
    *,
    temperature: float = 0.1,
    exclude_same_index: bool = False,
) -> torch.Tensor:
    """Multi-positive supervised contrastive loss (paper 004 Eq. 8, StableRep form), mean over anchors.

    For L2-normalised anchor ``a_i`` and candidates ``c_j``:
    ``q_ij = softmax_j(a_i . c_j / temperature)``, ``p_ij = 1[y_j = y_i] / #{j: y_j = y_i}`` and
    ``loss_i = -sum_j p_ij log q_ij``. Every same-class candidate is a positive.

    ``candidate_labels`` defaults to ``anchor_labels`` (anchors and candidates are then the same
    samples in two spaces, row by row). ``exclude_same_index=True`` removes candidate ``i`` from
    anchor ``i``'s softmax and positives (StableRep's self-masking, for anchors and candidates
    that are the same vectors); by default it stays, as the same image seen by the other model is
    the alignment target. Anchors left with no positive are not averaged (0 when none has one).
    """
    if anchors.ndim != 2 or candidates.ndim != 2 or anchors.shape[1] != candidates.shape[1]:
        raise ValueError(
            f"anchors and candidates must be 2-D with the same width, got {tuple(anchors.shape)} and "
            f"{tuple(candidates.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if candidate_labels is None:
        candidate_labels = anchor_labels
    if anchor_labels.shape[0] != anchors.shape[0] or candidate_labels.shape[0] != candidates.shape[0]:
        raise ValueError("there must be one label per anchor and one per candidate")
    logits = F.normalize(anchors.float(), dim=1) @ F.normalize(candidates.float(), dim=1).T / temperature
    positive = anchor_labels.unsqueeze(1) == candidate_labels.unsqueeze(0)
    if exclude_same_index:
        if anchors.shape[0] != candidates.shape[0]:
            raise ValueError("exclude_same_index needs as many candidates as anchors (row i is anchor i's twin)")
        eye = torch.eye(anchors.shape[0], dtype=torch.bool, device=anchors.device)
        logits = logits.masked_fill(eye, float("-inf"))
        positive = positive & ~eye
    log_q = torch.log_softmax(logits, dim=1)
    counts = positive.sum(dim=1)
    has_positive = counts > 0
    if not bool(has_positive.any()):
        return logits.new_zeros(()) * anchors.sum()
    # where() keeps -inf (masked self) out of the sum instead of multiplying it by 0
    per_anchor = -torch.where(positive, log_q, torch.zeros_like(log_q)).sum(dim=1) / counts.clamp_min(1)
    return per_anchor[has_positive].mean()
