"""Shared by several test modules; moved from tests/test_app_text_upgrade.py."""
from __future__ import annotations

QUERIES, GALLERY, SEED = 40, 120, 1


MODELS = ["minilm_l3", "minilm_l6", "minilm_l6_int8"]


SPEC = {"models": [{"path": f"pretrained:{m}", "label": m} for m in MODELS],
        "dataset": f"wordnet:task=qrels,queries={QUERIES},gallery={GALLERY},seed={SEED}", "views": ["encoder"],
        "metrics": ["recall@1"], "name": "text upgrade in a test"}


METRICS = ["recall@1", "recall@10", "map@10", "ndcg@10", "supersense_recall@1", "neighbour_recall@10"]


# (old, new) -> metric -> (old_old, new_old, new_new, diff, lo, hi, verdict); every number written by hand
ROWS = {
    (0, 1): {"recall@1": (0.200, 0.063, 0.230, -0.137, -0.160, -0.114, "not compatible"),
             "recall@10": (0.500, 0.200, 0.560, -0.300, -0.340, -0.260, "not compatible"),
             "map@10": (0.300, 0.110, 0.340, -0.190, -0.220, -0.160, "not compatible"),
             "ndcg@10": (0.340, 0.130, 0.390, -0.210, -0.240, -0.180, "not compatible"),
             "supersense_recall@1": (0.550, 0.400, 0.600, -0.150, -0.190, -0.110, "not compatible"),
             "neighbour_recall@10": (0.210, 0.020, None, -0.190, -0.200, -0.180, "not compatible")},
    (0, 2): {"recall@1": (0.200, 0.070, 0.228, -0.130, -0.155, -0.105, "not compatible"),
             "recall@10": (0.500, 0.210, 0.555, -0.290, -0.330, -0.250, "not compatible"),
             "map@10": (0.300, 0.120, 0.337, -0.180, -0.210, -0.150, "not compatible"),
             "ndcg@10": (0.340, 0.140, 0.386, -0.200, -0.230, -0.170, "not compatible"),
             "supersense_recall@1": (0.550, 0.410, 0.598, -0.140, -0.180, -0.100, "not compatible"),
             "neighbour_recall@10": (0.200, 0.019, None, -0.181, -0.190, -0.170, "not compatible")},
    (1, 2): {"recall@1": (0.230, 0.225, 0.228, -0.005, -0.020, 0.010, "too close to call"),
             "recall@10": (0.560, 0.554, 0.555, -0.006, -0.020, 0.008, "too close to call"),
             "map@10": (0.340, 0.336, 0.337, -0.004, -0.015, 0.007, "too close to call"),
             "ndcg@10": (0.390, 0.385, 0.386, -0.005, -0.016, 0.006, "too close to call"),
             "supersense_recall@1": (0.600, 0.630, 0.598, 0.030, 0.010, 0.050, "compatible"),
             "neighbour_recall@10": (0.800, 0.790, None, -0.010, -0.030, 0.010, "too close to call")},
}


ADAPTERS = [
    {"old": 0, "new": 1, "rows": [
        {"family": "post-hoc", "kind": "procrustes", "fitted_on": "1,000 gallery definitions embedded by both models",
         "pairs": 1000, "recall@1": 0.118, "recall@10": 0.400, "share_of_new_new": 0.513, "diff": -0.082, "lo": -0.100,
         "hi": -0.060, "verdict": "not compatible"},
        {"family": "paper 004", "kind": "perp", "fitted_on": "1,000 gallery definitions embedded by both models",
         "pairs": 1000, "recall@1": 0.210, "recall@10": 0.520, "share_of_new_new": 0.913, "diff": 0.010, "lo": -0.010,
         "hi": 0.030, "verdict": "too close to call"}]},
    {"old": 0, "new": 2, "rows": [
        {"family": "post-hoc", "kind": "affine", "fitted_on": "1,000 gallery definitions embedded by both models",
         "pairs": 1000, "recall@1": 0.240, "recall@10": 0.600, "share_of_new_new": 1.053, "diff": 0.040, "lo": 0.020,
         "hi": 0.060, "verdict": "compatible"}]},
    {"old": 1, "new": 2, "rows": []},
]


NOTES = ["Adapters were fitted on 1,000 definitions that are not in the gallery.",
         "neighbour recall@10 is label-free: new/new is its reference."]


def summary_payload() -> dict:
    """A ``text_upgrade`` payload in the engine's form; the matrices are the pairs' cells (diagonal: the self-tests)."""
    T = len(MODELS)
    matrices = {m: [[None] * T for _ in range(T)] for m in METRICS if m != "neighbour_recall@10"}
    pairs = []
    for (old, new), by_metric in ROWS.items():
        rows = []
        for metric, (oo, no, nn, diff, lo, hi, verdict) in by_metric.items():
            rows.append({"metric": metric, "old_old": oo, "new_old": no, "new_new": nn, "diff": diff, "lo": lo,
                         "hi": hi, "verdict": verdict})
            if metric in matrices:
                M = matrices[metric]
                assert M[old][old] in (None, oo) and M[new][new] in (None, nn), f"{metric}: two self-tests differ"
                M[old][old], M[new][old], M[new][new] = oo, no, nn
        pairs.append({"old": old, "new": new, "rows": rows})
    return {"corpus": {"task": "qrels", "queries": QUERIES, "gallery": GALLERY, "train_texts": 1000, "seed": SEED},
            "models": MODELS, "steps": [1, 2, 3], "k": 10, "level": 0.95, "resamples": 1000, "seed": 0,
            "metrics": METRICS, "matrices": matrices, "pairs": pairs, "adapters": ADAPTERS, "notes": NOTES}

