"""Shared by several test modules; moved from tests/test_backfill_sources.py."""
from __future__ import annotations

import numpy as np


def hand_ndcg(top_rows, judged, k):
    """nDCG@k with linear gains, by hand: DCG = sum g_i / log2(i + 1), over the ideal DCG (NaN without judgements)."""
    if not judged:
        return np.nan
    gains = [judged.get(int(r), 0) for r in top_rows[:k]]
    dcg = sum(g / np.log2(i + 2) for i, g in enumerate(gains))
    best = sorted(judged.values(), reverse=True)[:k]
    return dcg / sum(g / np.log2(i + 2) for i, g in enumerate(best))

