"""The method registry (a plain dict) and the validating factory."""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from engine.methods.base import Method
from engine.methods.plain import ER, ETF, LSP, PSP, CoReS, Independent
from engine.methods.regularised import BCT, BCTER, DSimplexFD, DSimplexHOC, MeanAlign, MeanAlignER
from engine.core.vocab import RETIRED_METHODS

METHODS: dict[str, type[Method]] = {
    "independent": Independent,
    "psp": PSP,
    "lsp": LSP,
    "bct": BCT,
    "bct_er": BCTER,
    "cores": CoReS,
    "dsimplex_fd": DSimplexFD,
    "dsimplex_hoc": DSimplexHOC,
    "er": ER,
    "etf": ETF,
    "mean_align": MeanAlign,
    "mean_align_er": MeanAlignER,
}


def method_hparam_names(name: str) -> tuple[str, ...]:
    """The hyper-parameters method ``name`` accepts, in declaration order."""
    return tuple(f.name for f in fields(_method_class(name)))  # type: ignore[arg-type]


def build_method(name: str, /, **hparams: Any) -> Method:
    """The method registered as ``name`` with the given hyper-parameters (others keep their defaults).

    Raises ``ValueError`` for an unknown method, an unknown hyper-parameter or an invalid value.
    """
    accepted = method_hparam_names(name)
    unknown = sorted(set(hparams) - set(accepted))
    if unknown:
        takes = ", ".join(accepted) if accepted else "no hyper-parameters"
        raise ValueError(f"method {name!r} has no hyper-parameter(s) {', '.join(unknown)}; it takes: {takes}")
    return METHODS[name](**hparams)


def _method_class(name: str) -> type[Method]:
    if name in RETIRED_METHODS:
        raise ValueError(RETIRED_METHODS[name])
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}")
    return METHODS[name]
