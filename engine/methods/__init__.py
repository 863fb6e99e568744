"""Compatible-learning methods: what each needs from the training loop, and its loss.

``METHODS`` maps names to method classes; ``build_method(name, **hparams)`` validates and builds
one. The paper settings (training settings and per-method hyper-parameters) live in the torch-free
:mod:`engine.core.presets`; each hyper-parameter's kind, range and default in :data:`engine.core.vocab.METHOD_PARAMS`.
"""
from engine.methods.base import Method, StepContext
from engine.methods.plain import ER, ETF, LSP, PSP, CoReS, Independent
from engine.methods.regularised import BCT, BCTER, DSimplexFD, DSimplexHOC, MeanAlign, MeanAlignER
from engine.methods.registry import METHODS, build_method, method_hparam_names

__all__ = [
    "BCT",
    "BCTER",
    "ER",
    "ETF",
    "LSP",
    "METHODS",
    "MeanAlign",
    "MeanAlignER",
    "PSP",
    "CoReS",
    "DSimplexFD",
    "DSimplexHOC",
    "Independent",
    "Method",
    "StepContext",
    "build_method",
    "method_hparam_names",
]
