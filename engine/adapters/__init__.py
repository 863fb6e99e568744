"""Mapping adapters trained on stored (frozen) features: paper 004's B_perp, B_lambda, F and the FCT baseline.

``fit_adapters`` trains them from old/new feature arrays of the same samples, ``AdapterPair``
applies, saves and describes them, ``combination_table`` evaluates the paper's query/gallery rows.
"""
from engine.adapters.fit import MIN_PER_CLASS, fit_adapters
from engine.adapters.losses import (
    lambda_orthogonality,
    orthogonality_deviation,
    squared_error,
    supervised_contrastive_loss,
)
from engine.adapters.modules import AffineAdapter, OrthogonalAdapter
from engine.adapters.pair import DIM_MISMATCH, KINDS, AdapterPair
from engine.adapters.table import COMBINATION_ROWS, EXTRA_ROWS, combination_table

__all__ = [
    "COMBINATION_ROWS",
    "DIM_MISMATCH",
    "EXTRA_ROWS",
    "KINDS",
    "MIN_PER_CLASS",
    "AdapterPair",
    "AffineAdapter",
    "OrthogonalAdapter",
    "combination_table",
    "fit_adapters",
    "lambda_orthogonality",
    "orthogonality_deviation",
    "squared_error",
    "supervised_contrastive_loss",
]
