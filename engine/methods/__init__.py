"""Compatible-learning methods: what each needs from the training loop, and its loss.

``METHODS`` maps names to method classes; ``build_method(name, **hparams)`` validates and builds
one; ``PRESETS`` (in ``engine.methods.presets``) holds training settings and per-method
hyper-parameters for a quick CPU run and for the papers' protocols.
"""
from engine.methods.base import Method, StepContext
from engine.methods.plain import ER, ETF, LSP, PSP, CoReS, Independent
from engine.methods.presets import PRESETS, method_hparams, training_settings
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
    "PRESETS",
    "PSP",
    "CoReS",
    "DSimplexFD",
    "DSimplexHOC",
    "Independent",
    "Method",
    "StepContext",
    "build_method",
    "method_hparam_names",
    "method_hparams",
    "training_settings",
]
