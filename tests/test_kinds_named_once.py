"""Kinds named once (STYLE.md 14): each kind is a record in ``engine.core.kinds``; its rule is written there once."""
from __future__ import annotations

import numpy as np
import pytest

from engine.core.kinds import STRICT, TIE_RULES, TIES, beats, check_ties


def test_beats_is_the_ecc_comparison_under_each_tie_rule():
    cross = np.array([0.5, 0.6, 0.4, np.nan])
    old = np.array([0.5, 0.5, 0.5, 0.5])
    assert beats(cross, old, "fail").tolist() == [False, True, False, False]  # strict: an exact tie fails
    assert beats(cross, old, "pass").tolist() == [True, True, False, False]  # ties pass; NaN never beats
    assert beats(0.5, 0.5) is False and STRICT == "fail"  # the default is the papers' strict rule
    assert TIE_RULES == ("fail", "pass") and [TIES[t].label for t in TIE_RULES] == [">", ">="]


@pytest.mark.parametrize("bad", ["FAIL", "ge", None, 1])
def test_an_unknown_tie_rule_is_one_line(bad):
    with pytest.raises(ValueError, match="unknown tie rule") as e:
        beats(1.0, 0.0, bad)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown tie rule"):
        check_ties(bad)
