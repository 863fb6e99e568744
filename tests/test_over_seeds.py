"""A study's verdicts over seeds (engine.metrics.over_seeds) and the study table that prints them
(engine.results.study_summary.print_study, engine.results.report), checked against hand computations."""
from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest

from engine.metrics.over_seeds import ecc_gain, mean_verdicts, over_seeds
from engine.results.report import matrix_csv, render_summary_table
from engine.results.study_summary import print_study

nan = np.nan
T975_2DF = 4.302652730  # Student's t, 2 degrees of freedom, two-sided 95 %


def _paired(diffs: dict[tuple[int, int], tuple[float, float]], T: int = 2) -> dict:
    """A stored paired test: per cross-test (diff, item half-width)."""
    full = lambda: [[None] * T for _ in range(T)]  # noqa: E731
    out = {"diff": full(), "lo": full(), "hi": full(), "verdict": full(), "confidence": 0.95, "resamples": 1000, "seed": 0}
    for (t, k), (d, h) in diffs.items():
        out["diff"][t][k], out["lo"][t][k], out["hi"][t][k] = d, d - h, d + h
        out["verdict"][t][k] = "pass" if d - h > 0 else "fail" if d + h < 0 else "unresolved"
    return out


def test_the_mean_over_seeds_with_its_interval_and_verdict():
    seeds = [_paired({(1, 0): (d, 0.01)}) for d in (0.03, 0.05, 0.04)]
    got = mean_verdicts(seeds)
    sd = np.std([0.03, 0.05, 0.04], ddof=1)
    half = math.hypot(T975_2DF * sd / math.sqrt(3), 0.01)
    assert got["diff"][1][0] == pytest.approx(0.04)
    assert (got["lo"][1][0], got["hi"][1][0]) == pytest.approx((0.04 - half, 0.04 + half))
    assert got["verdict"][1][0] == "pass" and got["seeds"][1][0] == 3 and got["counts"] == {"pass": 1, "fail": 0,
                                                                                           "unresolved": 0}
    # a confident pass on one seed and a confident fail on another: the mean is too close to call
    split = mean_verdicts([_paired({(1, 0): (d, 0.01)}) for d in (0.04, -0.04, 0.01)])
    assert [s["verdict"][1][0] for s in [_paired({(1, 0): (d, 0.01)}) for d in (0.04, -0.04)]] == ["pass", "fail"]
    assert split["verdict"][1][0] == "unresolved"


def test_one_seed_keeps_its_item_interval():
    got = mean_verdicts([_paired({(1, 0): (-0.03, 0.01)})])
    assert (got["lo"][1][0], got["hi"][1][0]) == pytest.approx((-0.04, -0.02)) and got["verdict"][1][0] == "fail"
    assert got["interval"] == "one seed's items"


def test_gain_only_where_ecc_holds_else_undefined_with_why():
    passes = np.array([[0.5, nan], [0.55, 0.6]])  # Γ = 0.05 / 0.10
    fails = np.array([[0.5, nan], [0.45, 0.6]])  # Γ would be -0.5: not counted
    assert ecc_gain([passes, fails]) == {"mean": pytest.approx(0.5), "cells": 1, "why": None}
    g = ecc_gain([fails, fails])
    assert g["mean"] is None and "no cross-test passes ECC" in g["why"]
    flat = np.array([[0.5, nan], [0.55, 0.505]])  # passes ECC, but the new model is only 0.5 points better alone
    assert "not 1 point better" in ecc_gain([flat])["why"]
    tie = np.array([[0.5, nan], [0.5, 0.6]])
    assert ecc_gain([tie])["mean"] is None and ecc_gain([tie], ties="pass")["mean"] == 0.0


def _summary() -> dict:
    """Three seeds of one method: seed 0 passes confidently, the others fail; the first seed's entry is seed 0's."""
    runs = []
    for d in (0.04, -0.04, -0.03):
        C = np.array([[0.5, nan], [0.5 + d, 0.6]])
        runs.append({"matrix": C.tolist(), "paired": _paired({(1, 0): (d, 0.01)}), "ties": "fail", "AC": float(d > 0)})
    first = runs[0]
    entry = {**first, "AA": 0.55, "ACA": 0.5, "update_gain": [[None, None], [0.4, None]], "protocol": "instance",
             "eval_classes": "seen"}
    spread = {key: {"mean": float(np.mean([r["AC"] for r in runs])) if key == "AC" else 0.55, "std": 0.5, "n": 3}
              for key in ("AC", "AA", "ACA")}
    return {"study_id": 1, "seeds": [0, 1, 2], "replaced_steps": [],
            "methods": {"bct": {"main_view": "encoder", "init_seed": "same", "seeds": [0, 1, 2],
                                "views": {"encoder": {"recall@1": entry}},
                                "spread": {"encoder": {"recall@1": spread}},
                                "over_seeds": {"encoder": {"recall@1": over_seeds(runs)}}}}}


def test_the_study_table_counts_the_verdict_of_the_mean_not_seed_0(capsys):
    print_study(_summary())
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| bct"))
    assert row.split("|")[-2].strip() == "0/0/1"  # seed 0 alone would say 1/0/0
    assert row.split("|")[-3].strip() == "40.0"  # Γ only where ECC holds: seed 0's cell, 0.04 / 0.10 (not -40 and -30)
    assert "bct: mean Γ 40.0 % over 1 cells where ECC holds" in out
    mean = np.mean([0.04, -0.04, -0.03])
    assert f"bct: M2→M1 {100 * mean:+.1f} points" in out and "(t over 3 seeds): too close to call" in out
    assert "verdicts of each cross-test's mean over the seeds" in out


def test_the_summary_csv_carries_the_mean_verdicts_and_the_familywise_choice():
    s = _summary()["methods"]["bct"]
    row = {**s["views"]["encoder"]["recall@1"], "spread": s["spread"]["encoder"]["recall@1"],
           "over_seeds": s["over_seeds"]["encoder"]["recall@1"], "familywise": "bonferroni"}
    frame = pd.read_csv(io.StringIO(render_summary_table([("bct", row)], fmt="csv")))
    assert frame.loc[0, "familywise"] == "bonferroni"
    assert (frame.loc[0, "paired_pass"], frame.loc[0, "paired_fail"], frame.loc[0, "paired_unresolved"]) == (0, 0, 1)
    assert frame.loc[0, "mean_update_gain"] == pytest.approx((0.04) / 0.1)  # seed 0's cell, the only one passing ECC


def test_the_matrix_csv_names_the_familywise_choice_and_what_each_interval_resampled():
    C = np.array([[0.5, nan], [0.55, 0.6]])
    paired = {**_paired({(1, 0): (0.05, 0.01)}), "interval": [[None, None], ["two-way", None]], "familywise": "holm"}
    frame = pd.read_csv(io.StringIO(matrix_csv(C, names=["M1", "M2"], paired=paired)))
    cross = frame[frame["cell"] == "cross"].iloc[0]
    assert cross["familywise"] == "holm" and cross["paired_interval"] == "two-way"
    assert frame[frame["cell"] == "self"]["familywise"].isna().all()
