"""Evaluation core: retrieval metrics per cell, compatibility matrices and their summaries."""
from engine.metrics.compatibility import CellFeatures, MatrixResult, compatibility_matrices, compatibility_matrix, stored_summary
from engine.metrics.paired import PairedOptions
from engine.metrics.definition1 import definition1_check
from engine.metrics.retrieval import cell_stats, metrics_from_stats, parse_metric, retrieval_metrics
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
    "CellFeatures", "MatrixResult", "compatibility_matrices", "compatibility_matrix", "definition1_check",
    "cell_stats", "metrics_from_stats", "parse_metric", "retrieval_metrics", "aa_curve", "ac_curve",
    "average_accuracy", "average_compatibility", "average_compatibility_accuracy", "ecc_pass", "summarize",
    "update_gain", "stored_summary", "PairedOptions",
]
