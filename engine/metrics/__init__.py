"""Evaluation core: retrieval metrics per cell, compatibility matrices and their summaries.

The package exports its numpy core only (summaries, ECC, paired verdicts, Definition 1), so that the dashboard
reads them without numba. The retrieval pass (``engine.metrics.retrieval``: ``retrieval_metrics``,
``cell_stats``; numpy and numba on the CPU, torch on a GPU: ``engine.metrics.device``) and the matrices built from it (``engine.metrics.compatibility``:
``compatibility_matrices``, ``CellFeatures``, ``MatrixResult``, ``stored_summary``) are imported from their modules.
"""
from engine.metrics.definition1 import definition1_check
from engine.metrics.paired import PairedOptions
from engine.metrics.summary import (
    aa_curve,
    ac_curve,
    average_accuracy,
    average_compatibility,
    average_compatibility_accuracy,
    ecc_pass,
    summarize,
    update_gain,
)

__all__ = [
    "definition1_check", "aa_curve", "ac_curve", "average_accuracy", "average_compatibility",
    "average_compatibility_accuracy", "ecc_pass", "summarize", "update_gain", "PairedOptions",
]
