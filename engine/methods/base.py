"""The contract between a compatible-learning method and the training loop.

A method is a small frozen dataclass: its fields are its hyper-parameters, its class variables say
what the loop must provide (old model, replay memory, which head, how to initialise each step) and
``loss`` turns one batch of model outputs into a scalar. The loop owns everything else.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from torch import nn
from torch.func import functional_call

from engine.models.net import ModelOutput, Net
from engine.core.vocab import METHOD_PARAMS

INIT_FROM = ("scratch", "previous")


@dataclass(frozen=True)
class StepContext:
    """What a loss may know about the current step of a class-incremental sequence.

    ``seen_classes`` and ``new_classes`` are class labels (not head outputs); the classes the
    previous model knew are ``seen_classes`` minus ``new_classes`` (``old_classes``).
    ``old_model`` is the frozen previous-step model (eval mode, no gradients) when the method
    ``needs_old_model`` and a previous step exists, else ``None``. ``fine_tunes``: the model was
    initialised from the previous step's (not from scratch, not a replacement). ``replay_classes``:
    the classes present in the step's training images only through the replay memory.
    """

    step: int
    seen_classes: tuple[int, ...]
    new_classes: tuple[int, ...]
    old_model: Net | None = None
    fine_tunes: bool = False
    replay_classes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.step < 1:
            raise ValueError(f"steps are numbered from 1, got step={self.step}")
        missing = sorted(set(self.new_classes) - set(self.seen_classes))
        if missing:
            raise ValueError(f"new classes {missing} are not among the seen classes; seen_classes must include them")

    @property
    def old_classes(self) -> tuple[int, ...]:
        """Classes learned before this step, in ``seen_classes`` order."""
        new = set(self.new_classes)
        return tuple(c for c in self.seen_classes if c not in new)


def resolve_init_seed(method: "Method | type[Method]", choice: str) -> str:
    """``"same"`` or ``"per_step"``: ``choice``, or under ``"auto"`` the one the method's paper prescribes."""
    return method.init_seed if choice == "auto" else choice


class Method(ABC):
    """Base of every method; subclasses are frozen dataclasses whose fields are hyper-parameters.

    Class variables (what the loop reads):
    - ``name``: registry key.
    - ``head``: ``"linear"`` (learnable, grown with new classes), ``"dsimplex"`` or ``"etf"``
      (fixed, K classes pre-allocated).
    - ``needs_old_model``: the loop passes the frozen previous model in ``ctx.old_model`` and its
      outputs on the same batch in ``old_out`` (both ``None`` at the first step).
    - ``uses_replay``: the loop keeps an experience-replay memory and mixes it into the batches.
    - ``default_views``: feature views (``engine.core.cell.VIEWS``) to evaluate the models with.
    - ``init_from``: ``"scratch"`` (a fresh model every step) or ``"previous"``
      (fine-tune the previous step's model), the protocol of the method's paper.
    - ``init_seed``: the initialisation a from-scratch model gets under ``model.init_seed = "auto"``:
      ``"per_step"`` (a new seed each step, independently trained models) unless the method's paper
      prescribes the ``"same"`` seed at every step (CoReS, paper 002 Sec. 5.1 and Tab. 9).
    """

    name: ClassVar[str]
    head: ClassVar[str]
    needs_old_model: ClassVar[bool]
    uses_replay: ClassVar[bool]
    default_views: ClassVar[tuple[str, ...]]
    init_from: ClassVar[str]
    init_seed: ClassVar[str] = "per_step"

    @abstractmethod
    def loss(
        self, out: ModelOutput, targets: torch.Tensor, ctx: StepContext, old_out: ModelOutput | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The batch loss and its named parts (floats, for logging; ``"loss"`` is the total).

        ``out`` is the current model on the batch; ``targets`` are head output indices (class
        labels already mapped by the head); ``old_out`` is ``ctx.old_model`` on the same inputs.
        """

    def step_lr(self, lr: float, ctx: StepContext) -> float:
        """The learning rate this step starts from; ``lr`` is the training config's (the default)."""
        return lr

    def balances_replay(self, ctx: StepContext) -> bool:
        """Whether the loop draws half of each batch from the replay memory at this step (default: no)."""
        return False

    def softmax_temperature(self) -> float:
        """The temperature dividing the logits of the stored softmax output (1.0: the plain softmax)."""
        return 1.0

    def __post_init__(self) -> None:
        """Check every hyper-parameter against its spec in :data:`engine.core.vocab.METHOD_PARAMS` (the one place)."""
        specs = METHOD_PARAMS[self.name]
        for f in fields(self):  # type: ignore[arg-type]
            problem = specs[f.name].problem(getattr(self, f.name))
            if problem:
                raise ValueError(f"{self.name}: {f.name} {problem}")

    def hparams(self) -> dict[str, Any]:
        """The hyper-parameters as a plain dict (what ``build_method`` takes back)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    def loss_key(self) -> tuple:
        """What identifies this method's training loss with its hyper-parameters; by default its own name and
        hyper-parameters. Methods sharing one loss (plain cross-entropy) return the same key."""
        return (self.name, repr(sorted(self.hparams().items())))

    def training_key(self, init_seed: str) -> tuple:
        """Everything that decides the models this method trains from a given config and seed, and the raw outputs
        stored for them: loss, head, initialisation (under the config's ``model.init_seed`` choice), old model,
        replay and the stored softmax's temperature. Methods with equal keys train identical models and store
        identical outputs, so a study trains them once (``psp`` and ``lsp`` are views of ``independent``)."""
        return (self.loss_key(), self.head, self.init_from, resolve_init_seed(self, init_seed),
                self.needs_old_model, self.uses_replay, self.softmax_temperature())


# ---------------------------------------------------------------------------------------------
# helpers shared by the methods


def parts_of(total: torch.Tensor, **parts: torch.Tensor | float) -> dict[str, float]:
    """The loss terms as floats for logging; ``"loss"`` is the total."""
    logged = {key: _as_float(value) for key, value in parts.items()}
    logged["loss"] = _as_float(total)
    return logged


def _as_float(value: torch.Tensor | float) -> float:
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


def detached(out: ModelOutput) -> ModelOutput:
    """The old model's outputs cut from any graph, whatever the loop did."""
    return ModelOutput(features=out.features.detach(), logits=out.logits.detach())


def call_frozen(module: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """``module(inputs)`` with the module's parameters detached: gradients reach ``inputs`` only.

    Used to apply the old classifier to new features (BCT) so that the old model can never
    receive a gradient, even if the loop forgot to freeze it.
    """
    frozen = {name: value.detach() for name, value in module.named_parameters()}
    return functional_call(module, frozen, (inputs,))


def first_step(method: Method, ctx: StepContext, old_out: ModelOutput | None) -> bool:
    """True when there is no previous model yet; checks the loop passed both or neither."""
    if ctx.old_model is None:
        return True
    if old_out is None:
        raise ValueError(
            f"method {method.name!r} got an old model but no old outputs; the loop must pass "
            "old_out = ctx.old_model(x) computed under torch.no_grad()"
        )
    return False


def old_class_outputs(ctx: StepContext, device: torch.device) -> torch.Tensor:
    """Head outputs of the classes the old model knew (mapped by the old model's head)."""
    if ctx.old_model is None:
        raise ValueError("old classes are only defined once there is an old model")
    classes = torch.tensor(ctx.old_classes, dtype=torch.long, device=device)
    return ctx.old_model.head.class_to_output(classes)


def check_same_dim(method: Method, new: torch.Tensor, old: torch.Tensor) -> None:
    """Raise a readable error when the old and new feature sizes differ."""
    if new.shape[-1] != old.shape[-1]:
        raise ValueError(
            f"method {method.name!r} compares old and new features directly, but the old model gives "
            f"{old.shape[-1]}-d features and the new one {new.shape[-1]}-d; use the same feature_dim "
            "for every step (or a fixed d-Simplex head, whose size is set by K)"
        )


@dataclass(frozen=True)
class FineTuning(Method):
    """Base of the methods that fine-tune the previous model with replay: the released code's two training options.

    - ``finetune_lr``: the learning rate of a step that fine-tunes the previous model
      (``ctx.fine_tunes``); ``None`` keeps the training config's ``lr`` at every step. The iamcl2r
      code pre-trains at 0.1 and fine-tunes at 0.001 (P1 Table V); the CL2R code uses 0.1 throughout.
    - ``balanced_replay`` (default on, as the released code): at such a step, half of each batch is
      drawn from the replay memory (``ctx.replay_classes``) and half from the step's other images, as
      the CL2R/iamcl2r ``BalancedBatchSampler`` from task 2 on; ``False``: batches are drawn from the
      pooled images. Only a finetune scenario with ``replay_per_class > 0`` has a memory to balance.
    A step that does not fine-tune (the first, or a replacement retrained from scratch) uses neither.
    """

    finetune_lr: float | None = None
    balanced_replay: bool = True

    def step_lr(self, lr: float, ctx: StepContext) -> float:
        """``finetune_lr`` when this step fine-tunes the previous model and it is set, else ``lr``."""
        return self.finetune_lr if self.finetune_lr is not None and ctx.fine_tunes else lr

    def balances_replay(self, ctx: StepContext) -> bool:
        """``balanced_replay`` at a fine-tuning step that has a replay memory."""
        return self.balanced_replay and ctx.fine_tunes and bool(ctx.replay_classes)
