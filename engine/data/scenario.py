"""Class-incremental scenarios: an initial set of classes plus equal increments, in a seeded order.

``training="cumulative"``: step t trains on every class seen so far (D^t = D^{t-1} + X^t, the
PSP/CoReS protocol). ``training="finetune"``: step t trains on its new classes plus an experience
replay memory of ``replay_per_class`` images per past class (the CL2R protocol).

``held_out_classes = N`` (open set on the training dataset itself): the class order is drawn over every
class as usual and its **last N** classes are held out: no step trains on them, not even through replay, and
evaluation uses only them (``engine.run.data_setup``). Which classes these are depends only on the class order
(``class_order_seed`` or ``class_order``), so a seed names them; the steps split the first C - N classes.

``replacement_steps`` mark the steps where the model is replaced (IAM-CL2R). The papers' replacement
is a third-party model trained on more (external) data and then fine-tuned on the current task plus
replay; with no external data here, the replacing model of a finetune scenario trains on every
class seen so far (its ``train_classes`` are the seen classes, no replay).

Bad splits raise ``ValueError`` with a sentence that says what to change; no class is ever dropped.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.core.splits import check_held_out, check_replacements, check_split
from engine.core.vocab import TRAINING_MODES


@dataclass(frozen=True)
class Step:
    """One training step; class tuples list class ids in the scenario's class order."""

    index: int  # 1-based
    new_classes: tuple[int, ...]  # X^t: the classes that arrive at this step
    seen_classes: tuple[int, ...]  # every class learned up to and including this step
    train_classes: tuple[int, ...]  # classes whose full training data this step uses
    replay_classes: tuple[int, ...]  # past classes seen only through the replay memory (finetune with replay)
    replaced: bool = False  # the model is replaced at this step (IAM-CL2R)


@dataclass(frozen=True)
class Scenario:
    class_order: tuple[int, ...]
    steps: tuple[Step, ...]
    training: str
    replay_per_class: int
    held_out_classes: tuple[int, ...] = ()  # never trained by any step: the open-set evaluation classes

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def step(self, index: int) -> Step:
        """The step with 1-based ``index``."""
        if not 1 <= index <= len(self.steps):
            raise ValueError(f"step {index} does not exist; this scenario has steps 1..{len(self.steps)}")
        return self.steps[index - 1]


def build_scenario(*, num_classes: int, initial_classes: int, increment: int, num_steps: int | None = None,
                   class_order_seed: int | None = 0, class_order: Sequence[int] | None = None,
                   training: str = "cumulative", replay_per_class: int = 0,
                   replacement_steps: Sequence[int] = (), held_out_classes: int = 0) -> Scenario:
    """Validate the split and build the scenario.

    The class order is ``class_order`` when given (a permutation of 0..num_classes-1), else a
    permutation drawn with ``numpy.random.default_rng(class_order_seed)``, or 0..num_classes-1 when
    ``class_order_seed`` is None. ``num_steps`` is optional; when given it must match the split.
    ``held_out_classes``: the last ones of the class order, never trained; the steps use the rest exactly.
    """
    trained = num_classes - check_held_out(num_classes, held_out_classes)
    try:
        num_steps = check_split(trained, initial_classes, increment, num_steps)
    except ValueError as exc:
        if not held_out_classes:
            raise
        raise ValueError(f"with {held_out_classes} of the {num_classes} classes held out, {trained} are trained: {exc}") from None
    if training not in TRAINING_MODES:
        raise ValueError(f"unknown training mode {training!r}; use 'cumulative' or 'finetune'")
    if replay_per_class < 0:
        raise ValueError(f"replay_per_class must be 0 or more, got {replay_per_class}")
    if replay_per_class and training == "cumulative":
        raise ValueError(f"replay_per_class={replay_per_class} only applies to training='finetune': cumulative "
                         f"training already uses all the data of past classes")
    replaced = check_replacements(replacement_steps, num_steps)
    if class_order is not None:
        order = _check_order(class_order, num_classes)
    elif class_order_seed is None:
        order = tuple(range(num_classes))
    else:
        order = tuple(int(c) for c in np.random.default_rng(class_order_seed).permutation(num_classes))
    steps = []
    for t in range(1, num_steps + 1):
        start = 0 if t == 1 else initial_classes + increment * (t - 2)
        end = initial_classes + increment * (t - 1)
        new, seen, past = order[start:end], order[:end], order[:start]
        if training == "cumulative" or t in replaced:
            steps.append(Step(t, new, seen, seen, (), t in replaced))
        else:
            steps.append(Step(t, new, seen, new, past if replay_per_class else (), False))
    return Scenario(order, tuple(steps), training, replay_per_class, order[trained:])


def select_replay(labels: np.ndarray, classes: Sequence[int], per_class: int, seed: int) -> np.ndarray:
    """Indices (ascending) of a replay memory: ``per_class`` random images of each class in ``classes``.

    Class c's pick is a seeded shuffle, ``default_rng([seed, c]).permutation``, of its images in
    index order, cut to ``per_class``: it does not depend on the other classes or on when it is built,
    and a larger budget keeps the smaller one's images. A class with fewer images gives all of them;
    a class with none raises ``ValueError``.
    """
    if per_class < 0:
        raise ValueError(f"per_class must be 0 or more, got {per_class}")
    labels = np.asarray(labels)
    picks = [np.zeros(0, np.int64)]
    for c in classes:
        members = np.flatnonzero(labels == c)
        if len(members) == 0:
            raise ValueError(f"class {c} has no images to put in the replay memory")
        picks.append(np.random.default_rng([seed, int(c)]).permutation(members)[:per_class])
    return np.sort(np.concatenate(picks)).astype(np.int64)


def _check_order(class_order: Sequence[int], num_classes: int) -> tuple[int, ...]:
    order = tuple(int(c) for c in class_order)
    twice = sorted(c for c, n in Counter(order).items() if n > 1)
    if twice:
        raise ValueError(f"class_order lists classes {twice[:10]} more than once; each class must appear exactly once")
    outside = sorted(c for c in order if not 0 <= c < num_classes)
    if outside:
        raise ValueError(f"class_order has classes {outside[:10]} outside 0..{num_classes - 1}")
    missing = sorted(set(range(num_classes)) - set(order))
    if missing:
        raise ValueError(f"class_order misses classes {missing[:10]}{' ...' if len(missing) > 10 else ''}; "
                         f"every one of the {num_classes} classes must appear once")
    return order
