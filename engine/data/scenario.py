"""Class-incremental scenarios: T steps, initial classes + equal increments, seeded class order.

``training="cumulative"``: each step trains on every class seen so far (D^t = D^{t-1} + X^t, the
PSP/CoReS protocol). ``training="finetune"``: each step trains on its new classes plus an
experience-replay memory of ``replay_per_class`` images per past class (the CL2R protocol).
``replacement_steps`` mark the steps where the model is replaced by one trained anew (IAM-CL2R).
Bad splits raise ``ValueError`` with an explanation; no class is ever dropped silently.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TRAINING_MODES = ("cumulative", "finetune")


@dataclass(frozen=True)
class Step:
    index: int  # 1-based
    new_classes: tuple[int, ...]
    seen_classes: tuple[int, ...]  # in learning order
    train_classes: tuple[int, ...]  # classes whose full training data this step uses
    replay_classes: tuple[int, ...]  # past classes seen only through the replay memory
    replaced: bool = False


@dataclass(frozen=True)
class Scenario:
    class_order: tuple[int, ...]
    steps: tuple[Step, ...]
    training: str
    replay_per_class: int

    @property
    def num_steps(self) -> int:
        return len(self.steps)


def _check_order(order: Sequence[int], num_classes: int) -> tuple[int, ...]:
    order = tuple(int(c) for c in order)
    dup = sorted({c for c in order if order.count(c) > 1})
    if dup:
        raise ValueError(f"class_order lists classes {dup[:10]} more than once")
    bad = sorted(c for c in order if not 0 <= c < num_classes)
    if bad:
        raise ValueError(f"class_order has classes {bad[:10]} outside 0..{num_classes - 1}")
    missing = sorted(set(range(num_classes)) - set(order))
    if missing:
        raise ValueError(f"class_order misses classes {missing[:10]}{' ...' if len(missing) > 10 else ''}; "
                         f"every one of the {num_classes} classes must appear once")
    return order


def build_scenario(*, num_classes: int, initial_classes: int, increment: int, num_steps: int | None = None,
                   class_order_seed: int = 0, class_order: Sequence[int] | None = None, training: str = "cumulative",
                   replay_per_class: int = 0, replacement_steps: Sequence[int] = ()) -> Scenario:
    """Validate and build a scenario; see the module docstring."""
    if num_classes < 1 or initial_classes < 1:
        raise ValueError(f"need at least one class and one initial class, got num_classes={num_classes}, initial_classes={initial_classes}")
    if initial_classes > num_classes:
        raise ValueError(f"initial_classes={initial_classes} is more than the {num_classes} classes available")
    rest = num_classes - initial_classes
    if num_steps is None:
        if rest and (increment < 1 or rest % increment):
            raise ValueError(f"{num_classes} classes cannot be split into an initial {initial_classes} plus equal increments of "
                             f"{increment}: the {rest} remaining classes are not a multiple of {increment}; change the increment "
                             f"or set num_steps and num_classes")
        num_steps = 1 + (rest // increment if rest else 0)
    if num_steps < 1:
        raise ValueError(f"num_steps must be at least 1, got {num_steps}")
    if num_steps > 1 and increment < 1:
        raise ValueError(f"increment must be at least 1 for {num_steps} steps, got {increment}")
    used = initial_classes + increment * (num_steps - 1)
    if used != num_classes:
        raise ValueError(f"{initial_classes} + {num_steps - 1} x {increment} = {used} classes, but the dataset has {num_classes}; "
                         f"adjust num_steps/increment or the number of classes (classes are never dropped silently)")
    if training not in TRAINING_MODES:
        raise ValueError(f"unknown training mode {training!r}; use 'cumulative' or 'finetune'")
    if replay_per_class < 0:
        raise ValueError(f"replay_per_class must be >= 0, got {replay_per_class}")
    if replay_per_class and training == "cumulative":
        raise ValueError("replay_per_class only applies to training='finetune' (cumulative training already sees all past data)")
    rep = sorted({int(s) for s in replacement_steps})
    if len(rep) != len(tuple(replacement_steps)):
        raise ValueError(f"replacement_steps has duplicates: {list(replacement_steps)}")
    if any(not 2 <= s <= num_steps for s in rep):
        raise ValueError(f"replacement steps must lie in 2..{num_steps} (step 1 has no model to replace), got {rep}")
    if class_order is None:
        order = tuple(int(c) for c in np.random.default_rng(class_order_seed).permutation(num_classes))
    else:
        order = _check_order(class_order, num_classes)
    steps = []
    for t in range(1, num_steps + 1):
        lo = 0 if t == 1 else initial_classes + increment * (t - 2)
        hi = initial_classes + increment * (t - 1)
        new, seen = order[lo:hi], order[:hi]
        cumulative = training == "cumulative" or t in rep
        steps.append(Step(t, new, seen, seen if cumulative else new, () if cumulative else order[:lo], t in rep))
    return Scenario(order, tuple(steps), training, replay_per_class)


def select_replay(labels: np.ndarray, classes: Sequence[int], per_class: int, seed: int) -> np.ndarray:
    """Indices of a replay memory: ``per_class`` random images (all if fewer) of each class, seeded per class."""
    labels = np.asarray(labels)
    picks = []
    for c in classes:
        members = np.flatnonzero(labels == c)
        rng = np.random.default_rng([seed, int(c)])
        picks.append(np.sort(rng.choice(members, size=min(per_class, len(members)), replace=False)))
    return np.concatenate(picks) if picks else np.zeros(0, np.int64)
