"""The Compatibility page's uncertainty (AppTest on hand-made stored matrices): AC / AA / ACA intervals over seeds,
the pass / fail / unresolved count and AC's range next to every AC, family-wise verdicts (Holm, Bonferroni), and
the update gain shown only where it is defined."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from engine.core.config import RunConfig
from engine.metrics import summarize
from storage import create_experiment, create_study, get_engine, save_matrix, session_scope, set_experiment_status

MAIN = Path(__file__).resolve().parents[1] / "app" / "main.py"
nan = np.nan
SE = 0.01
Z95 = 1.959963985


def seed_matrix(c21: float) -> np.ndarray:
    """Self-tests 50 / 60 / 70 %; cross-tests +2.2 and +2.5 points over their self-test, C[2, 1] as given."""
    return np.array([[0.50, nan, nan], [0.522, 0.60, nan], [0.525, c21, 0.70]])


def paired_test(C: np.ndarray) -> dict:
    """A stored paired test whose intervals are the difference +/- 1.96 standard errors of one point."""
    T = C.shape[0]
    full = lambda: [[None] * T for _ in range(T)]  # noqa: E731
    out = {"diff": full(), "lo": full(), "hi": full(), "n": full(), "verdict": full(), "items": "queries",
           "resamples": 1000, "seed": 0, "confidence": 0.95}
    for t in range(T):
        for k in range(t):
            d = float(C[t, k] - C[k, k])
            lo, hi = d - Z95 * SE, d + Z95 * SE
            out["diff"][t][k], out["lo"][t][k], out["hi"][t][k], out["n"][t][k] = d, lo, hi, 400
            out["verdict"][t][k] = "pass" if lo > 0 else "fail" if hi < 0 else "unresolved"
    return out


SEED_C21 = {0: 0.57, 1: 0.57, 2: 0.65}  # C[2, 1] - C[1, 1] = -3, -3, +5 points


def store(s, exp, C, *, paired: bool) -> None:
    summary = {**summarize(C), "ties": "fail", "comparable": np.tril(np.ones(C.shape, bool)).tolist()}
    if paired:
        summary["paired"] = paired_test(C)
    counts = np.where(np.isnan(C), -1, 400).astype(np.int64)
    save_matrix(s, exp.id, metric="recall@1", gallery_kind="instance", view="encoder", values=C, valid_queries=counts,
                no_positive=np.zeros_like(counts), summary=summary)
    set_experiment_status(s, exp.id, "done")


@pytest.fixture
def stored(app_db) -> None:
    with session_scope(get_engine(app_db)) as s:
        cfg = RunConfig(name="bounds", methods=("bct",), seeds=tuple(SEED_C21))
        study = create_study(s, name="bounds", kind="compare", config=cfg.to_dict())
        for seed, c21 in SEED_C21.items():
            one = RunConfig(name="bounds", methods=("bct",), seed=seed)
            exp = create_experiment(s, name=f"bounds/bct/seed {seed}", method="bct", config=one.to_dict(),
                                    config_hash=f"b-{seed}", study_id=study.id)
            store(s, exp, seed_matrix(c21), paired=True)
        worse = RunConfig(name="worse", methods=("independent",))
        exp = create_experiment(s, name="worse", method="independent", config=worse.to_dict(), config_hash="w")
        store(s, exp, np.array([[0.60, nan], [0.62, 0.598]]), paired=False)  # new self 0.2 points below old self


def open_page(name: str) -> AppTest:
    """The Compatibility page showing the study or experiment whose label contains ``name``."""
    at = AppTest.from_file(str(MAIN), default_timeout=120).run()
    at.switch_page("app_pages/compatibility.py").run()
    group = next(g for g in at.selectbox(key="cm_group").options if name in g)
    at.selectbox(key="cm_group").set_value(group).run()
    assert not at.exception, at.exception
    return at


def test_seed_intervals_counts_and_ac_range_in_the_summary(stored):
    at = open_page("Study: bounds")
    row = at.dataframe[0].value.iloc[0]
    acs = [2 / 3, 2 / 3, 1.0]  # strict ECC per seed: C[2, 1] fails, fails, passes
    mean, sd = sum(acs) / 3, math.sqrt(sum((a - sum(acs) / 3) ** 2 for a in acs) / 2)
    half = 4.302652730 * sd / math.sqrt(3)  # t(0.975, 2 df) from the printed table
    assert row["AC %"] == pytest.approx(100 * mean)
    # a share: the t-interval is clipped to [0, 100] %
    assert row["AC % 95% CI"] == f"{100 * max(mean - half, 0):.1f} – {100 * min(mean + half, 1):.1f}"
    # the verdict of each cross-test's mean over the 3 seeds (t over seeds, widened by the item half-width 1.96 SE):
    # +2.2 and +2.5 points in every seed pass; C[2, 1] = -0.3 points, t half-width 11.5 -> too close to call
    assert row["cells ✓/✗/?"] == "2/0/1"
    assert row["AC % range (paired)"] == f"{100 * mean:.1f} – {100 * mean:.1f}"
    # Γ only where ECC holds (paper 002): 0.022 / 0.10 and 0.025 / 0.20 in every seed, (0.65 - 0.60) / 0.10 in seed 2
    gains = [0.22, 0.125, 0.22, 0.125, 0.22, 0.125, 0.5]
    assert row["mean Γ %"] == f"{100 * sum(gains) / 7:.1f}"

    # Bonferroni over 3 cells (z 2.394): +2.2 standard errors of the mean no longer clear 0, +2.5 do
    at.radio(key="cm_family").set_value("bonferroni").run()
    row = at.dataframe[0].value.iloc[0]
    assert row["cells ✓/✗/?"] == "1/0/2"
    lo = (1 / 3 + 1 / 3 + 2 / 3) / 3  # sure passes: (2, 0) in every seed, (2, 1) in seed 2
    assert row["AC % range (paired)"] == f"{100 * lo:.1f} – {100 * (lo + 1 / 3):.1f}"
    # Holm at 5 % on the means: p = 0.012 (+2.5 SE) clears 0.05 / 3, then p = 0.028 (+2.2 SE) misses 0.05 / 2
    at.radio(key="cm_family").set_value("holm").run()
    assert at.dataframe[0].value.iloc[0]["cells ✓/✗/?"] == "1/0/2"

    # one panel per seed: the count and AC's range next to its AC
    at.radio(key="cm_seed_mode").set_value("one per seed").run()
    at.radio(key="cm_family").set_value("bonferroni").run()
    lines = [m.value for m in at.markdown if "cells ✓/✗/?" in m.value]
    assert len(lines) == 3
    assert "cells ✓/✗/? 1/1/1 · AC range 33.3 – 66.7 %" in lines[0] and "Bonferroni" in lines[0]
    assert "cells ✓/✗/? 2/0/1 · AC range 66.7 – 100.0 %" in lines[2]


def test_update_gain_is_undefined_with_why_when_the_new_model_is_not_better(stored):
    at = open_page("worse")
    row = at.dataframe[0].value.iloc[0]
    assert row["mean Γ %"].startswith("undefined")
    assert row["cells ✓/✗/?"] == "1/0/–"  # 0.62 > 0.60 on point estimates, no paired test stored
    assert pd.isna(row["AC % range (paired)"])  # nothing to bound without a paired test
    captions = " ".join(c.value for c in at.caption).replace("\\", "")  # plain() escapes punctuation
    assert "M2→M1 undefined (new self-test -0.2 points from old" in captions
