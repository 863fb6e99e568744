"""Which backfilling ordering is best: the one with the largest area under its curve (torch-free).

The Backfilling page and the upgrade verdict both name a best ordering; this is the one rule they share.
"""
from __future__ import annotations

import math
from collections.abc import Mapping


def best_by_area(areas: Mapping[str, float | None]) -> str | None:
    """The ordering with the largest area (M-tilde); the first listed among equal areas; None when no area is a number."""
    known = {name: a for name, a in areas.items() if a is not None and not math.isnan(a)}
    return max(known, key=known.__getitem__) if known else None
