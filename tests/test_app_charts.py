"""Chart specs of app/charts.py (step axes, series that coincide, colours, one unit for AC / AA / ACA).

Each expectation is derived from the data handed to the chart, never read back from the chart itself.
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from app import charts


def curves(methods: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame([{"method": m, "step": t + 1, "AC_t": v} for m, values in methods.items()
                         for t, v in enumerate(values)])


def layer_spec(chart) -> dict:
    spec = chart.to_dict()
    return spec["layer"][0] if "layer" in spec else spec


# identical curves: every method compatible at every step, the case that hid all but one line
SAME = {"bct": [1.0, 1.0, 1.0, 1.0], "cores": [1.0, 1.0, 1.0, 1.0], "psp": [1.0, 1.0, 1.0, 1.0]}


def test_step_axis_has_one_tick_per_whole_step():
    frame = curves(SAME)
    x = charts.step_curves(frame, value="AC_t", title="t", y_title="AC_t").to_dict()["encoding"]["x"]
    assert x["type"] == "quantitative"
    assert x["axis"]["tickMinStep"] == 1 and x["axis"]["format"] == "d"
    assert x["axis"]["values"] == [1, 2, 3, 4]  # steps 1..4 of the data, each once
    assert x["scale"]["domain"] == [0.5, 4.5]


def test_long_step_axes_leave_the_tick_count_to_vega_but_keep_whole_steps():
    frame = pd.DataFrame({"step": range(1, 51), "nc1": np.linspace(1, 2, 50)})
    x = charts.steps_chart(frame, "nc1", "NC1").to_dict()["encoding"]["x"]
    assert "values" not in x["axis"] and x["axis"]["tickMinStep"] == 1 and x["axis"]["format"] == "d"


def test_coinciding_curves_get_distinct_dashes_markers_colours_and_offsets():
    frame = curves(SAME)
    spec = charts.step_curves(frame, value="AC_t", title="t", y_title="AC_t").to_dict()
    enc = spec["encoding"]
    methods = list(SAME)
    for channel in ("color", "strokeDash", "shape"):
        assert enc[channel]["scale"]["domain"] == methods
        values = [str(v) for v in enc[channel]["scale"]["range"]]
        assert len(set(values)) == len(methods), channel
    data = pd.DataFrame(spec["datasets"][spec["data"]["name"]])
    offsets = (data["step_shown"] - data["step"]).round(9).groupby(data["method"]).unique()
    # one fixed offset per method, all different, within the spread, centred on the true step
    assert all(len(o) == 1 for o in offsets)
    shifts = sorted(float(o[0]) for o in offsets)
    assert shifts == pytest.approx([-charts.SERIES_SPREAD / 2, 0.0, charts.SERIES_SPREAD / 2])
    assert spec["mark"]["point"]["filled"] is True


def test_backfill_orderings_differ_by_dash_and_marker():
    fractions = [0.0, 0.5, 1.0]
    frame = pd.DataFrame([{"ordering": o, "fraction": f, "value": v} for o in ("random", "distance")
                          for f, v in zip(fractions, [0.2, 0.3, 0.4])])  # two identical curves
    refs = pd.DataFrame([{"kind": "self", "label": "self", "value": 0.4}, {"kind": "cross", "label": "x", "value": 0.2}])
    enc = layer_spec(charts.backfill_chart(frame, refs, metric="Recall@1"))["encoding"]
    assert enc["strokeDash"]["scale"]["range"][0] != enc["strokeDash"]["scale"]["range"][1]
    assert enc["shape"]["scale"]["range"][0] != enc["shape"]["scale"]["range"][1]
    # values span 20 percentage points: 5 ticks 4 points apart need no decimals
    assert enc["y"]["axis"]["format"] == ".0%"


@pytest.mark.parametrize("values, expected", [
    ([0.0, 1.0], ".0%"),        # 20 points between ticks
    ([0.45, 0.46], ".1%"),      # 1 point over 5 ticks: 0.2 points apart -> 45.2%, 45.4% (".0%" gave 45%, 45%, 46%)
    ([0.451, 0.452], ".2%"),    # 0.1 point: 0.02 apart
    ([0.5, 0.5], ".0%"),        # one value: a single tick
])
def test_percent_format_gives_distinct_tick_labels(values, expected):
    assert charts.percent_format(values) == expected
    lo, hi = min(values), max(values)
    if hi > lo:  # the labels of 5 evenly spaced ticks are all different at that precision
        digits = int(expected[1])
        labels = {f"{100 * v:.{digits}f}" for v in np.linspace(lo, hi, 5)}
        assert len(labels) == 5


def _lab(colour: str) -> np.ndarray:
    """sRGB hex -> CIE L*a*b* (D65), for a perceptual distance between two colours."""
    rgb = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    rgb = np.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ rgb
    xyz /= np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_series_colours_differ_from_each_other_and_from_old_new():
    palette = charts.SERIES_COLOURS[:6]  # up to six methods (the quick-demo study)
    distance = min(np.linalg.norm(_lab(a) - _lab(b)) for a, b in itertools.combinations(palette, 2))
    assert distance > 20, "two method colours are too close to tell apart"
    assert not set(c.lower() for c in charts.OLD_NEW_COLOURS) & set(c.lower() for c in charts.SERIES_COLOURS)
    old, new = charts.OLD_NEW_COLOURS
    assert np.linalg.norm(_lab(old) - _lab(new)) > 40


def test_summary_in_one_unit():
    # AC = 1 of 3 cross-tests passing; AA and ACA as stored fractions
    assert charts.summary_percent({"AC": 1 / 3, "AA": 0.452, "ACA": 0.12}) == pytest.approx(
        {"AC %": 100 / 3, "AA %": 45.2, "ACA %": 12.0})
    assert charts.summary_percent({"AC": float("nan"), "AA": None}) == {"AC %": None, "AA %": None, "ACA %": None}
    assert charts.summary_line({"AC": 1 / 3, "AA": 0.452, "ACA": 0.12}) == "**AC** 33.3% · **AA** 45.2% · **ACA** 12.0%"
