"""Methods whose loss needs only the current model: compatibility, if any, comes from the head or the view."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.methods.base import FineTuning, Method, StepContext, parts_of
from engine.methods.losses import cross_entropy, dot_regression
from engine.models.net import ModelOutput



def _cross_entropy_only(
    out: ModelOutput, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, dict[str, float]]:
    ce = cross_entropy(out.logits, targets, temperature=temperature)
    return ce, parts_of(ce, ce=ce)


class _PlainCrossEntropy(Method):
    """Shared loss of the methods trained with plain mean cross-entropy over all head outputs."""

    def loss(
        self, out: ModelOutput, targets: torch.Tensor, ctx: StepContext, old_out: ModelOutput | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return _cross_entropy_only(out, targets)

    def loss_key(self) -> tuple:
        return ("cross-entropy", 1.0)  # temperature 1


@dataclass(frozen=True)
class Independent(_PlainCrossEntropy):
    """Independently trained models: the "Baseline" of paper 000 (A.6) and ITM of CoReS (P2 §5.1).

    Every step trains a fresh model on all classes seen so far with plain cross-entropy and a
    learnable linear head; nothing ties it to earlier models, so it is the lower bound of
    compatibility. Evaluated on the encoder (penultimate) features.
    """

    name = "independent"
    head = "linear"
    needs_old_model = False
    uses_replay = False
    default_views = ("encoder",)
    init_from = "scratch"


@dataclass(frozen=True)
class PSP(Method):
    """Probability Simplex Projections (paper 000, Eq. 2-4, Algorithm 1): independent training, softmax view.

    Training is independent cross-entropy with a learnable linear head; compatibility comes from
    the feature view alone: the softmax output truncated to the gallery model's classes, centred
    and L2-normalised (``engine.models.extract.simplex_projection``).

    Reading: the paper uses "a temperature factor of 12 in the cross-entropy loss to scale
    logits vectors during training" without saying multiply or divide. Here ``temperature``
    *divides* the logits, the usual meaning of a softmax temperature: CE(logits / temperature).
    The paper's value is then ``temperature=12``; the other reading (logits * 12, as in cosine
    classifiers) is ``temperature=1/12``. The default 1.0 switches it off.

    ``extraction_temperature``: the softmax the PSP view is computed from. ``"none"`` (default) is
    the plain softmax sigma(z) of Eq. 2, "z^k = W^k . phi^k(x) denotes the logit output": the paper
    puts the temperature in the loss "during training" only, and Algorithm 1 takes "the softmax or
    logit outputs" as they are. ``"training"`` stores softmax(z / temperature) instead (the other
    reading; ``bench/ablation_psp_temperature.py`` compares the two). Logits are stored unscaled
    either way.
    """

    temperature: float = 1.0
    extraction_temperature: str = "none"

    name = "psp"
    head = "linear"
    needs_old_model = False
    uses_replay = False
    default_views = ("psp",)
    init_from = "scratch"


    def loss(
        self, out: ModelOutput, targets: torch.Tensor, ctx: StepContext, old_out: ModelOutput | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return _cross_entropy_only(out, targets, self.temperature)

    def loss_key(self) -> tuple:
        """Cross-entropy at ``temperature``: with the default 1.0 PSP/LSP train exactly as ``independent``."""
        return ("cross-entropy", float(self.temperature))

    def softmax_temperature(self) -> float:
        """``temperature`` under ``extraction_temperature="training"``, else 1.0 (the plain softmax of Eq. 2)."""
        return float(self.temperature) if self.extraction_temperature == "training" else 1.0


@dataclass(frozen=True)
class LSP(PSP):
    """Logit Simplex Projections (paper 000, Eq. 6 and Algorithm 1): as PSP, evaluated on the logits.

    Same training (and the same ``temperature`` reading) as ``psp``; the view truncates, centres
    and L2-normalises the logits instead of the softmax. ``extraction_temperature`` only changes the
    stored softmax (the ``psp``/``softmax`` views of an LSP run): LSP itself is unchanged, since
    centring and L2-normalisation cancel any positive scale of the logits.
    """

    name = "lsp"
    default_views = ("lsp",)


@dataclass(frozen=True)
class ER(FineTuning, _PlainCrossEntropy):
    """Experience-replay baseline (P1 §5 "ER baseline", P3 §4.2).

    The previous model is fine-tuned on the new task's data plus a replay memory with plain
    cross-entropy and a learnable linear head that grows with the new classes ([REPO]).
    Evaluated on the encoder features.
    """

    name = "er"
    head = "linear"
    needs_old_model = False
    uses_replay = True
    default_views = ("encoder",)
    init_from = "previous"



@dataclass(frozen=True)
class CoReS(_PlainCrossEntropy):
    """CoReS (paper 002, Eq. 9-10): d-Simplex fixed classifier with K pre-allocated classes.

    Every upgrade trains a model from scratch (same seed) on all data seen so far with plain
    cross-entropy over *all* K outputs, averaged over the batch (Eq. 9): the not-yet-assigned
    outputs stay in the softmax denominator and push features away from future prototypes.
    No old model, no mapping: compatibility comes only from the shared fixed prototypes.
    """

    name = "cores"
    head = "dsimplex"
    init_seed = "same"  # paper 002, Sec. 5.1: "same random seed for initialisation at every upgrade"; Tab. 9
    needs_old_model = False
    uses_replay = False
    default_views = ("encoder",)
    init_from = "scratch"


@dataclass(frozen=True)
class ETF(Method):
    """Fixed simplex-ETF classifier with pre-allocated classes (Yang et al. 2022; baseline of paper 000, A.6).

    ``objective="ce"`` (ETF-CE): cross-entropy over all K fixed outputs.
    ``objective="dr"`` (ETF-DR): the dot-regression loss ``1/2 (w_y^T h_hat - 1)^2`` on the
    L2-normalised feature and the (unit) target prototype, as in the released code of Yang et al.
    (the "reg_dot_loss" with unit feature length). Each step trains from scratch.
    """

    objective: str = "ce"

    name = "etf"
    head = "etf"
    needs_old_model = False
    uses_replay = False
    default_views = ("encoder",)
    init_from = "scratch"


    def loss(
        self, out: ModelOutput, targets: torch.Tensor, ctx: StepContext, old_out: ModelOutput | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if self.objective == "ce":
            return _cross_entropy_only(out, targets)
        dr = dot_regression(out.features, out.logits, targets)
        return dr, parts_of(dr, dr=dr)
