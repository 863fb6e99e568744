"""Methods that regularise the new model against the frozen previous one.

All of them train the first model (no previous model yet) with their classification loss alone,
and never send a gradient into the old model: its outputs are detached and its classifier is
applied with detached parameters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from engine.methods.base import (
    FineTuning,
    Method,
    StepContext,
    call_frozen,
    check_same_dim,
    detached,
    first_step,
    old_class_outputs,
    parts_of,
)
from engine.methods.losses import (
    class_mean_alignment,
    cross_entropy,
    feature_distance,
    info_nce,
    intra_class_variance,
)
from engine.models.net import ModelOutput



@dataclass(frozen=True)
class BCT(Method):
    """Backward-Compatible Training (Shen et al. 2020; baseline of papers 000, 001, 002).

    ``L = CE(new head, new features) + lam * CE(old head, new features)`` where the second term,
    the *influence loss*, applies the frozen previous classifier to the new model's features on
    the samples whose class the old model knew (mean over those samples, 0 when the batch has
    none); lam = 1 by default (the papers give no value). Each step trains from scratch, as in
    BCT and the paper-000/CoReS protocols (``bct_er`` fine-tunes with replay instead).

    Reading: only old classes enter the influence loss; BCT's optional "synthesised" old-classifier
    rows for new classes (old-model class means) are not used. BCT is undefined when the old and
    new feature sizes differ (the old classifier cannot read the new features): that raises.
    """

    lam: float = 1.0

    name = "bct"
    head = "linear"
    needs_old_model = True
    uses_replay = False
    default_views = ("encoder",)
    init_from = "scratch"


    def loss(
        self, out: ModelOutput, targets: torch.Tensor, ctx: StepContext, old_out: ModelOutput | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        ce = cross_entropy(out.logits, targets)
        if ctx.old_model is None:
            return ce, parts_of(ce, ce=ce, influence=0.0)
        old_head = ctx.old_model.head
        if ctx.old_model.feature_dim != out.features.shape[1]:
            raise ValueError(
                f"BCT applies the old classifier to the new features, so both models need the same feature "
                f"size; the old model has {ctx.old_model.feature_dim}-d features and the new one "
                f"{out.features.shape[1]}-d. Use the same feature_dim (or a projection) for every step"
            )
        old_outputs = old_class_outputs(ctx, targets.device)
        if old_outputs.numel() and int(old_outputs.max()) >= old_head.num_outputs:
            raise ValueError(
                f"the old classifier has {old_head.num_outputs} outputs but the step says the old model "
                f"knew classes {list(ctx.old_classes)}; old classes must map to old-head outputs"
            )
        known = torch.isin(targets, old_outputs)
        if bool(known.any()):
            old_logits = call_frozen(old_head, out.features[known])
            influence = F.cross_entropy(old_logits, targets[known])
        else:
            influence = out.features.new_zeros(())
        total = ce + self.lam * influence
        return total, parts_of(total, ce=ce, influence=influence)


@dataclass(frozen=True)
class BCTER(FineTuning, BCT):
    """BCT-ER (P1 §5, P3 §4.2): BCT fine-tuned from the previous model with an experience-replay memory."""

    name = "bct_er"
    uses_replay = True
    init_from = "previous"



@dataclass(frozen=True)
class DSimplexFD(FineTuning):
    """d-Simplex-FD (CL2R, Biondi et al. 2023; baseline of P1/P3): d-Simplex CE + feature distillation, with replay.

    ``L = CE over the K d-Simplex outputs + w_t * mean_i dist(f_new(x_i), f_old(x_i))`` against the
    frozen previous model on the same inputs; the model is fine-tuned from the previous one.

    Readings (P1 only says "d-Simplex fixed classifiers with mean square error loss"); the
    defaults follow the released CL2R code (NiccoBiondi/CompatibleLifelongRepresentation):
    - ``distance="cosine"``: ``1 - cos(f_new, f_old)`` (``F.cosine_embedding_loss`` on L2-normalised
      features), which is half the squared error between the normalised features; ``"l2"`` is the
      squared Euclidean distance on the raw features.
    - ``distill_on="old_classes"``: only samples of classes learned before this step (the replay
      samples in a class-incremental sequence, which the code distils); ``"all"``: every sample.
    - ``weight_schedule="sqrt_new_over_old"``: ``w_t = weight * sqrt(|new classes| / |old classes|)``
      (the code's ``update_criterion_weight`` with base 10); ``"constant"``: ``w_t = weight``.
    """

    weight: float = 10.0
    distance: str = "cosine"
    distill_on: str = "old_classes"
    weight_schedule: str = "sqrt_new_over_old"

    name = "dsimplex_fd"
    head = "dsimplex"
    needs_old_model = True
    uses_replay = True
    default_views = ("encoder",)
    init_from = "previous"


    def step_weight(self, ctx: StepContext) -> float:
        """The distillation weight w_t used at this step."""
        if self.weight_schedule == "constant" or not ctx.old_classes:
            return self.weight
        return self.weight * math.sqrt(len(ctx.new_classes) / len(ctx.old_classes))

    def loss(
        self, out: ModelOutput, targets: torch.Tensor, ctx: StepContext, old_out: ModelOutput | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        ce = cross_entropy(out.logits, targets)
        if first_step(self, ctx, old_out):
            return ce, parts_of(ce, ce=ce, distill=0.0)
        old = detached(old_out).features
        check_same_dim(self, out.features, old)
        per_sample = feature_distance(out.features, old, distance=self.distance)
        if self.distill_on == "old_classes":
            per_sample = per_sample[torch.isin(targets, old_class_outputs(ctx, targets.device))]
        distill = per_sample.mean() if per_sample.numel() else out.features.new_zeros(())
        total = ce + self.step_weight(ctx) * distill
        return total, parts_of(total, ce=ce, distill=distill)


@dataclass(frozen=True)
class DSimplexHOC(FineTuning):
    """d-Simplex-HOC (P1 Eq. 2-5, P3 Eq. 3-5): ``lam * L_SCE + (1 - lam) * L_iNCE(new, old)``, with replay.

    ``L_SCE`` is the d-Simplex cross-entropy over all K outputs; ``L_iNCE`` is InfoNCE whose
    anchor is the *old* model's feature of sample i, its positive the new feature of the same
    sample and its negatives the new features of the other samples, with similarity
    ``rho * cos`` (rho multiplies the cosine; P3 calls it tau, the iamcl2r code ``mu_``). Defaults
    lam = 0.1, rho = 10 (papers: rho 5 or 10; lam 0.5 for CUB). The model is fine-tuned from the
    previous one; at the first step (no previous model) the loss is plain L_SCE, as in iamcl2r.

    Readings: both terms are batch *means* (P1/P3 write sums; the ratio is unchanged, only the
    step size scales with the batch). ``negatives="paper"`` takes Eq. 4 literally: the denominator
    sums over j != i only, so the positive is excluded (needs batches of at least 2).
    ``negatives="repo"`` is iamcl2r's ``HocLoss``: same-class entries of each row, the positive
    included, are set to 0 and kept in the logsumexp over the whole row.
    """

    lam: float = 0.1
    rho: float = 10.0
    negatives: str = "repo"

    name = "dsimplex_hoc"
    head = "dsimplex"
    needs_old_model = True
    uses_replay = True
    default_views = ("encoder",)
    init_from = "previous"


    def loss(
        self, out: ModelOutput, targets: torch.Tensor, ctx: StepContext, old_out: ModelOutput | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        ce = cross_entropy(out.logits, targets)
        if first_step(self, ctx, old_out):
            return ce, parts_of(ce, ce=ce, nce=0.0)
        old = detached(old_out).features
        check_same_dim(self, out.features, old)
        nce = info_nce(old, out.features, targets, scale=self.rho, negatives=self.negatives)
        total = self.lam * ce + (1.0 - self.lam) * nce
        return total, parts_of(total, ce=ce, nce=nce)


@dataclass(frozen=True)
class MeanAlign(Method):
    """Class-mean alignment: a simple stand-in for LCE (Meng et al. 2021), which papers 000, 001 and 003 compare with.

    Not Meng et al.'s method (that one learns a transformation and an old-classifier boundary); the papers give no
    formula for LCE. What is implemented:
    ``L = CE + alpha * mean_c ||mu_new_c - mu_old_c||^2 + beta * mean_i ||f_new_i - mu_new_{y_i}||^2``
    where mu are batch class means of the new and old (frozen) features of the same samples,
    the alignment runs over the classes the old model knew (the old prototypes) present in the
    batch, and the compactness over every sample. Identity mapping, no learned transformation,
    no old-classifier boundary. alpha = 1, beta = 0.1 are untuned defaults (no published values).
    Each step trains from scratch (``mean_align_er`` fine-tunes with replay instead).
    """

    alpha: float = 1.0
    beta: float = 0.1

    name = "mean_align"
    head = "linear"
    needs_old_model = True
    uses_replay = False
    default_views = ("encoder",)
    init_from = "scratch"


    def loss(
        self, out: ModelOutput, targets: torch.Tensor, ctx: StepContext, old_out: ModelOutput | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        ce = cross_entropy(out.logits, targets)
        if first_step(self, ctx, old_out):
            return ce, parts_of(ce, ce=ce, align=0.0, compact=0.0)
        old = detached(old_out).features
        check_same_dim(self, out.features, old)
        align = class_mean_alignment(out.features, old, targets, old_class_outputs(ctx, targets.device))
        compact = intra_class_variance(out.features, targets)
        total = ce + self.alpha * align + self.beta * compact
        return total, parts_of(total, ce=ce, align=align, compact=compact)


@dataclass(frozen=True)
class MeanAlignER(FineTuning, MeanAlign):
    """Class-mean alignment fine-tuned from the previous model with an experience-replay memory (stand-in for LCE-ER)."""

    name = "mean_align_er"
    uses_replay = True
    init_from = "previous"

