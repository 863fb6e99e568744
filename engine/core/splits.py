"""The class-incremental split's arithmetic, torch- and numpy-free, so a config is checked when it is read.

Used by :func:`engine.core.config.config_from_dict` (when the dataset's class count is known) and by
:func:`engine.data.scenario.build_scenario` (always).
"""
from __future__ import annotations

from collections.abc import Sequence


def check_split(num_classes: int, initial_classes: int, increment: int, num_steps: int | None) -> int:
    """The number of steps, after checking that initial + (steps - 1) x increment uses every class exactly."""
    if num_classes < 1 or initial_classes < 1:
        raise ValueError(f"a scenario needs at least one class and one initial class, got num_classes={num_classes} "
                         f"and initial_classes={initial_classes}")
    if initial_classes > num_classes:
        raise ValueError(f"initial_classes={initial_classes} is more than the {num_classes} classes available")
    rest = num_classes - initial_classes
    if rest and increment < 1:
        raise ValueError(f"increment must be at least 1 to add the {rest} classes left after the initial {initial_classes}, "
                         f"got {increment}")
    if rest % max(increment, 1):
        fits = rest // increment
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        raise ValueError(f"{num_classes} classes cannot be split into an initial {initial_classes} plus equal increments of "
                         f"{increment}: the {rest} remaining classes are not a multiple of {increment} ({fits} increments "
                         f"use {fits * increment} and leave {rest - fits * increment} classes out); choose an increment that "
                         f"divides {rest} ({', '.join(map(str, divisors))}) or change initial_classes")
    steps = 1 + (rest // increment if rest else 0)
    if num_steps is not None and num_steps != steps:
        used = initial_classes + max(increment, 0) * (num_steps - 1)
        raise ValueError(f"num_steps={num_steps} does not fit: {initial_classes} initial classes + {num_steps - 1} x "
                         f"{increment} = {used} classes, but there are {num_classes}, which take {steps} steps; "
                         f"set num_steps={steps} (or leave it out) or change the split")
    return steps


def check_held_out(num_classes: int, held_out_classes: int) -> int:
    """``held_out_classes`` after checking it leaves a class to train and, when not 0, evaluates at least two classes."""
    if held_out_classes < 0:
        raise ValueError(f"held_out_classes must be 0 or more, got {held_out_classes}")
    if held_out_classes == 1:
        raise ValueError("held_out_classes = 1 would evaluate a single class, where every neighbour is correct; "
                         "hold out at least 2 classes (or 0 for none)")
    if held_out_classes >= num_classes:
        raise ValueError(f"held_out_classes = {held_out_classes} leaves none of the {num_classes} classes to train; "
                         f"hold out at most {num_classes - 1}")
    return held_out_classes


def check_replacements(replacement_steps: Sequence[int], num_steps: int) -> frozenset[int]:
    """The replaced steps, after checking each is listed once and lies in 2..num_steps."""
    steps = [int(s) for s in replacement_steps]
    if len(set(steps)) != len(steps):
        raise ValueError(f"replacement_steps lists a step more than once: {steps}")
    if 1 in steps:
        raise ValueError("a replacement at step 1 is not possible: step 1 trains the first model, there is nothing to replace")
    outside = [s for s in steps if not 2 <= s <= num_steps]
    if outside:
        raise ValueError(f"replacement steps {outside} are outside this scenario's steps; choose steps in 2..{num_steps}")
    return frozenset(steps)
