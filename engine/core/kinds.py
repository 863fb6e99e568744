"""Kinds named once (STYLE.md 14), torch-free: each kind of thing the engine, the CLI and the pages share is a frozen
:class:`Kind` record here with its label and help; implementations register in plain dicts on their own floor, and
nothing else spells a kind's name (``tests/test_kinds_named_once.py``).

- ECC tie rules (:data:`TIES`) and the one comparison :func:`beats`: strict ``>`` (an exact tie fails, the papers'
  rule) or ``>=`` (ties pass). Not the rank tie readings of Recall@k (``engine.core.vocab.RANK_TIE_READINGS``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kind:
    """One kind: its name (the key configs, payloads and flags use), its label (as pages and reports show it) and a
    one-line help."""

    name: str
    label: str
    help: str = ""


def _named(*kinds: Kind) -> dict[str, Kind]:
    return {k.name: k for k in kinds}


# ---------------------------------------------------------------------------------------------- ECC tie rules
TIES = _named(Kind("fail", ">", "strict ECC: a cross-test equal to its self-test fails (the papers' rule)"),
              Kind("pass", ">=", "ECC with ties passing: a cross-test equal to its self-test passes"))
TIE_RULES = tuple(TIES)
STRICT = "fail"  # the default tie rule
TIES_HELP = "ECC on a tie: strict > (fail) or >= (pass)"


def check_ties(ties: object) -> str:
    """``ties`` when it names a tie rule of :data:`TIES`; one line otherwise."""
    if ties not in TIES:
        raise ValueError(f"unknown tie rule {ties!r}; use 'fail' (strict >) or 'pass' (>=)")
    return str(ties)


def beats(cross: Any, old: Any, ties: str = STRICT) -> Any:
    """Whether ``cross`` passes ECC against ``old`` under the tie rule ``ties``: ``cross > old`` (``"fail"``) or
    ``cross >= old`` (``"pass"``); numbers or numpy arrays (elementwise; NaN never beats)."""
    return cross >= old if check_ties(ties) == "pass" else cross > old
