"""Altair charts of the dashboard, built from plain numpy/pandas data (no Streamlit, no database)."""
from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import numpy as np
import pandas as pd

UNRESOLVED_AMBER = "#d98c00"
FAIL_RED = "#b71c1c"
FAIL_FILL = "#f8d0cc"
OLD_NEW_SHAPES = ("circle", "triangle-up")
CLASS_SCHEME = "tableau20"
OLD_NEW_COLOURS = ("#f58518", "#4c78a8")  # old model orange, new model blue, on every chart
# methods and orderings: Okabe-Ito hues that stay apart for colour-blind readers and never reuse the old/new pair
SERIES_COLOURS = ("#009e73", "#cc79a7", "#0072b2", "#d55e00", "#56b4e9", "#e69f00", "#000000", "#999999")
SERIES_DASHES = ([1, 0], [6, 3], [2, 2], [8, 3, 2, 3], [12, 4], [3, 5])
SERIES_SHAPES = ("circle", "square", "triangle-up", "diamond", "cross", "triangle-down")
SERIES_SPREAD = 0.2  # total width (in steps) over which coinciding step curves are spread apart
SUMMARY_METRICS = ("AC", "AA", "ACA")  # shown in percent in every table: "AC %", "AA %", "ACA %"
SUBTITLE_LINE_PX = 14  # height of one 10-px subtitle line


def percent(value: float | None, digits: int = 1) -> str:
    """A fraction as a percentage string; '–' for missing."""
    return "–" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{100 * value:.{digits}f}%"


def number(value: float | None, digits: int = 2) -> str:
    return "–" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{value:.{digits}f}"


def summary_percent(summary: dict) -> dict[str, float | None]:
    """AC, AA and ACA of a stored summary in one unit, percent (``"AC %"`` ...); None where not defined.

    The papers print AC as a fraction next to AA / ACA in percent; one unit per table reads without a legend.
    """
    out: dict[str, float | None] = {}
    for name in SUMMARY_METRICS:
        value = summary.get(name)
        out[f"{name} %"] = None if value is None or not np.isfinite(value) else 100 * float(value)
    return out


def summary_line(summary: dict, digits: int = 1) -> str:
    """``AC 33.3% · AA 45.2% · ACA 12.0%`` (markdown, bold names), the same unit as the tables."""
    return " · ".join(f"**{name}** {percent(summary.get(name), digits)}" for name in SUMMARY_METRICS)


def percent_format(values: Sequence[float], ticks: int = 5) -> str:
    """A d3 percent format with enough decimals that ``ticks`` ticks over the values' range get distinct labels."""
    finite = np.asarray([v for v in values if v is not None], float)
    finite = finite[np.isfinite(finite)]
    spread = float(finite.max() - finite.min()) if len(finite) else 1.0
    step = 100 * spread / ticks  # percentage points between two ticks
    digits = 0 if step >= 1 or step == 0 else min(3, int(np.ceil(-np.log10(step))))
    return f".{digits}%"


def series_encodings(names: Sequence[str], field: str, title: str) -> dict:
    """Colour, dash and marker shape per series, fixed by the series' order: curves that coincide stay apart."""
    names = list(dict.fromkeys(names))
    n = len(names)
    return {
        "color": alt.Color(f"{field}:N", title=title, scale=alt.Scale(domain=names, range=[
            SERIES_COLOURS[i % len(SERIES_COLOURS)] for i in range(n)])),
        "strokeDash": alt.StrokeDash(f"{field}:N", title=title, scale=alt.Scale(domain=names, range=[
            SERIES_DASHES[i % len(SERIES_DASHES)] for i in range(n)])),
        "shape": alt.Shape(f"{field}:N", title=title, scale=alt.Scale(domain=names, range=[
            SERIES_SHAPES[i % len(SERIES_SHAPES)] for i in range(n)])),
    }


def spread_steps(frame: pd.DataFrame, field: str) -> pd.DataFrame:
    """``frame`` with ``step_shown``: each series' steps moved by a small, fixed offset so equal curves do not hide."""
    names = list(dict.fromkeys(frame[field]))
    n = len(names)
    offsets = {name: (i - (n - 1) / 2) * (SERIES_SPREAD / max(n - 1, 1)) for i, name in enumerate(names)}
    return frame.assign(step_shown=frame["step"].astype(float) + frame[field].map(offsets).astype(float))


def step_axis(steps: Sequence[float], title: str | None = "step") -> alt.X:
    """A quantitative step axis with one tick per whole step (no 1, 1, 2, 2 labels), padded by half a step."""
    lo, hi = (float(min(steps)), float(max(steps))) if len(steps) else (1.0, 2.0)
    return alt.X("step_shown:Q", title=title, scale=alt.Scale(domain=[lo - 0.5, hi + 0.5], nice=False, zero=False),
                 axis=alt.Axis(tickMinStep=1, format="d", labelAngle=0,
                               values=list(range(int(lo), int(hi) + 1)) if hi - lo <= 20 else alt.Undefined))


def wrap(line: str, width: int = 80, separator: str = " · ") -> list[str]:
    """A long ' · '-separated line as lines of at most ``width`` characters (breaking only at separators)."""
    lines: list[str] = []
    for part in line.split(separator):
        if lines and len(lines[-1]) + len(separator) + len(part) <= width:
            lines[-1] += separator + part
        else:
            lines.append(part)
    return lines


def with_convention(chart: alt.TopLevelMixin, line: str, width: int = 80) -> alt.TopLevelMixin:
    """The chart with its convention as a subtitle, so an exported PNG/SVG/HTML still says what it shows."""
    title = chart.title if isinstance(chart.title, str) else getattr(chart.title, "text", "")
    lines = wrap(line, width)
    extra = {}
    if isinstance(getattr(chart, "height", None), int):  # a fixed height includes the title: keep the plot's size
        extra["height"] = chart.height + SUBTITLE_LINE_PX * len(lines)
    return chart.properties(title=alt.TitleParams(text=title or "", subtitle=lines, anchor="start",
                                                  subtitleColor="#555555", subtitleFontSize=10), **extra)


# ---------------------------------------------------------------------------------------------- matrices


def matrix_frame(C: np.ndarray, ecc: np.ndarray, names: Sequence[str], comparable: np.ndarray | None = None,
                 valid: np.ndarray | None = None, paired: dict | None = None, gain: Sequence | None = None) -> pd.DataFrame:
    """Lower-triangle cells as rows: query, gallery, value, status (self / pass / fail / n/c), label, and, when
    stored, the paired verdict (pass / fail / unresolved), its interval and the update gain Γ of each cross-test."""
    rows = []
    T = C.shape[0]
    symbols = {"pass": " ✓", "fail": " ✗", "unresolved": " ?"}
    for t in range(T):
        for k in range(t + 1):
            value = C[t, k]
            verdict = paired["verdict"][t][k] if paired else None
            if np.isnan(value):
                status = "n/c" if comparable is not None and not comparable[t, k] else "undefined"
                label = "n/c" if status == "n/c" else "–"
            else:
                status = "self" if t == k else ("fail" if ecc[t, k] == 0 else "pass")
                mark = symbols[verdict] if verdict else (" ✗" if status == "fail" else "")
                label = f"{100 * value:.1f}{mark}"
            lo, hi = (paired["lo"][t][k], paired["hi"][t][k]) if paired else (None, None)
            g = gain[t][k] if gain is not None else None
            rows.append({"query": names[t], "gallery": names[k], "value": None if np.isnan(value) else float(value),
                         "status": status, "label": label,
                         "queries": None if valid is None else int(valid[t, k]),
                         "verdict": verdict or "", "interval": "" if lo is None else f"[{100 * lo:+.1f}, {100 * hi:+.1f}] pts",
                         "gain": None if g is None else float(g)})
    return pd.DataFrame(rows)


def matrix_heatmap(frame: pd.DataFrame, names: Sequence[str], *, title: str, metric: str,
                   size: int | None = None, domain: tuple[float, float] | None = None) -> alt.LayerChart:
    """Lower-triangular heatmap (row = query model, column = gallery model).

    Passing cells are shaded blue by value (``domain``: shared colour range when matrices sit side by
    side); a cross-test failing the compatibility criterion is shaded red, boxed and marked ✗. With a paired
    test, cells are marked ✓ / ✗ / ? and an unresolved one (interval straddling 0) gets a dashed amber box.
    """
    n = len(names)
    cell = int(min(80, max(34, (size or 480) / n)))  # pixels per model: fixed band steps keep cells square
    values = frame["value"].dropna()
    lo, hi = domain or ((float(values.min()), float(values.max())) if len(values) else (0.0, 1.0))
    if hi - lo < 1e-6:
        lo, hi = lo - 0.05, hi + 0.05
    x = alt.X("gallery:O", sort=list(names), title="gallery model (old)", axis=alt.Axis(labelAngle=0, orient="top"))
    y = alt.Y("query:O", sort=list(names), title="query model (new)")
    tooltip = [alt.Tooltip("query:N", title="query model"), alt.Tooltip("gallery:N", title="gallery model"),
               alt.Tooltip("value:Q", title=metric, format=".2%"), alt.Tooltip("status:N", title="ECC"),
               alt.Tooltip("queries:Q", title="queries scored"), alt.Tooltip("verdict:N", title="paired test"),
               alt.Tooltip("interval:N", title="cross - self, 95% interval"), alt.Tooltip("gain:Q", title="update gain Γ", format=".1%")]
    failing = frame["status"] == "fail"
    mid = lo + 0.6 * (hi - lo)
    ink = np.where(failing, FAIL_RED, np.where(frame["value"].fillna(lo).to_numpy() > mid, "white", "#222222"))
    data = frame.assign(ink=ink)
    base = alt.Chart(data).encode(x=x, y=y, tooltip=tooltip)
    cells = base.transform_filter("datum.status !== 'fail' && datum.value !== null").mark_rect().encode(
        color=alt.Color("value:Q", scale=alt.Scale(scheme="blues", domain=[lo, hi]),
                        legend=alt.Legend(title=metric, format=".0%")))
    empty = base.transform_filter("datum.value === null").mark_rect(color="#eeeeee")
    fails = base.transform_filter("datum.status === 'fail'").mark_rect(
        color=FAIL_FILL, stroke=FAIL_RED, strokeWidth=2)
    unresolved = base.transform_filter("datum.verdict === 'unresolved'").mark_rect(
        fillOpacity=0, stroke=UNRESOLVED_AMBER, strokeWidth=3, strokeDash=[5, 3])
    text = base.mark_text(fontSize=12 if cell >= 44 else 9, fontWeight="bold").encode(
        text="label:N", color=alt.Color("ink:N", scale=None))
    return alt.layer(cells, empty, fails, unresolved, text).resolve_scale(color="independent").properties(
        title=title, width=alt.Step(cell), height=alt.Step(cell))


def step_curves(frame: pd.DataFrame, *, value: str, title: str, y_title: str, percent_axis: bool = True) -> alt.Chart:
    """AC_t or AA_t over steps, one line per method (in percent, as the tables).

    Methods differ by colour, dash and marker, and each is moved sideways by a fraction of a step, so
    methods with equal curves (e.g. every AC_t = 100%) stay visible; the tooltip gives the true step.
    """
    values = frame[value].tolist()
    axis = alt.Axis(format=percent_format(values)) if percent_axis else alt.Axis(format=".2f", tickMinStep=0.01)
    return alt.Chart(spread_steps(frame, "method")).mark_line(point=alt.OverlayMarkDef(size=60, filled=True)).encode(
        x=step_axis(frame["step"].tolist(), "after step t (first t models)"),
        y=alt.Y(f"{value}:Q", title=y_title, axis=axis, scale=alt.Scale(zero=False)),
        **series_encodings(frame["method"].tolist(), "method", "method"),
        tooltip=["method", alt.Tooltip("step:Q", format="d"),
                 alt.Tooltip(f"{value}:Q", format=".1%" if percent_axis else ".3f")],
    ).properties(title=title, height=260)


# ---------------------------------------------------------------------------------------------- geometry


def projection_chart(points: pd.DataFrame, means: pd.DataFrame, prototypes: pd.DataFrame, lines: pd.DataFrame, *,
                     model_names: Sequence[str], title: str, facet: bool) -> alt.TopLevelMixin:
    """Old and new features in one 2-D map: colour = class, shape = model; class means ringed, prototypes as +."""
    pick = alt.selection_point(fields=["class"], bind="legend")
    order = list(points.sort_values("label")["class"].drop_duplicates())
    colour = alt.Color("class:N", title="class", scale=alt.Scale(scheme=CLASS_SCHEME, domain=order), sort=order,
                       legend=alt.Legend(symbolLimit=40, columns=1 if points["class"].nunique() <= 20 else 2))
    shape = alt.Shape("model:N", title="model", scale=alt.Scale(domain=list(model_names), range=list(OLD_NEW_SHAPES)))
    x = alt.X("x:Q", title=None, axis=alt.Axis(labels=False, ticks=False, grid=False))
    y = alt.Y("y:Q", title=None, axis=alt.Axis(labels=False, ticks=False, grid=False))
    layers = []
    if len(lines):
        layers.append(alt.Chart(lines).mark_line(strokeWidth=0.8, opacity=0.35, color="#777777").encode(
            x=x, y=y, detail="row:N", order="model_index:Q"))
    layers.append(alt.Chart(points).mark_point(filled=True, size=28).encode(
        x=x, y=y, color=colour, shape=shape,
        opacity=alt.condition(pick, alt.value(0.7), alt.value(0.05)),
        tooltip=["class", "model", "row"],
    ).add_params(pick))
    if len(means):
        layers.append(alt.Chart(means).mark_point(filled=True, size=260, stroke="black", strokeWidth=1.5).encode(
            x=x, y=y, color=colour, shape=shape, opacity=alt.condition(pick, alt.value(1.0), alt.value(0.1)),
            tooltip=[alt.Tooltip("class:N"), alt.Tooltip("model:N", title="class mean of")]))
    if len(prototypes):
        layers.append(alt.Chart(prototypes).mark_point(shape="cross", filled=True, size=320, color="black").encode(
            x=x, y=y, tooltip=[alt.Tooltip("class:N", title="fixed prototype of")]))
    chart = alt.layer(*layers)
    if facet:  # separate maps: different spaces
        chart = chart.properties(width=430, height=430).facet(column=alt.Column("model:N", title=None))
        return chart.resolve_scale(x="independent", y="independent").properties(title=title)
    return chart.properties(title=title, height=560).interactive()


def drift_chart(frame: pd.DataFrame) -> alt.Chart:
    """Per-class cosine between the old and new class mean; classes the old model never saw are hatched grey."""
    many = len(frame) > 12  # long class names do not fit under narrow bars: hover for the name
    axis = alt.Axis(labels=False, ticks=False) if many else alt.Axis(labelAngle=-40, labelLimit=90)
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("class:N", sort=list(frame["class"]), title=f"class ({len(frame)}, in class order)", axis=axis),
        y=alt.Y("cosine:Q", title="cos(old mean, new mean)", scale=alt.Scale(domain=[min(-0.1, float(frame["cosine"].min())), 1])),
        color=alt.Color("trained by old model:N", scale=alt.Scale(domain=["yes", "no"], range=["#4c78a8", "#bab0ac"])),
        tooltip=["class", alt.Tooltip("cosine:Q", format=".3f"), "trained by old model"],
    ).properties(title="Drift of class means (1 = same direction)", height=230 if many else 200)


def angle_chart(frame: pd.DataFrame, references: pd.DataFrame, *, model_names: Sequence[str]) -> alt.LayerChart:
    """One tick per pair of classes: the angle between their centred means, per model; ◆ = regular simplex."""
    y = alt.Y("model:N", title=None, sort=list(model_names))
    colour = alt.Color("model:N", title="model", scale=alt.Scale(domain=list(model_names), range=list(OLD_NEW_COLOURS)),
                       legend=None)
    ticks = alt.Chart(frame).mark_tick(opacity=0.45, thickness=2, size=26).encode(
        x=alt.X("angle:Q", title="angle between centred class means (degrees)", scale=alt.Scale(zero=False)),
        y=y, color=colour, tooltip=["model", alt.Tooltip("angle:Q", format=".1f")])
    simplex = alt.Chart(references).mark_point(shape="diamond", filled=True, size=160, color="black").encode(
        x="angle:Q", y=y, tooltip=[alt.Tooltip("label:N", title=""), alt.Tooltip("angle:Q", format=".1f")])
    return alt.layer(ticks, simplex).properties(
        title="Angles between class means (◆ = regular simplex)", height=160)


def steps_chart(frame: pd.DataFrame, value: str, title: str, *, log: bool = False) -> alt.Chart:
    """One value per step (a line); ``log`` for values spanning orders of magnitude."""
    scale = alt.Scale(type="log") if log else alt.Scale(zero=False)
    return alt.Chart(frame.assign(step_shown=frame["step"].astype(float))).mark_line(point=True).encode(
        x=step_axis(frame["step"].tolist()),
        y=alt.Y(f"{value}:Q", title=value + (" (log scale)" if log else ""), scale=scale),
        tooltip=["step", alt.Tooltip(f"{value}:Q", format=".3f")]).properties(title=title, height=220)


# ---------------------------------------------------------------------------------------------- backfilling


def backfill_chart(curves: pd.DataFrame, references: pd.DataFrame, *, metric: str) -> alt.LayerChart:
    """Metric vs fraction backfilled, one line per ordering; dashed: the new model's self-test."""
    x = alt.X("fraction:Q", title="fraction of the gallery backfilled", axis=alt.Axis(format=".0%"),
              scale=alt.Scale(domain=[0, 1]))
    lines = alt.Chart(curves).mark_line(point=alt.OverlayMarkDef(size=40, filled=True)).encode(
        x=x, y=alt.Y("value:Q", title=metric, axis=alt.Axis(format=percent_format(
            [*curves["value"], *references["value"]])), scale=alt.Scale(zero=False)),
        **series_encodings(curves["ordering"].tolist(), "ordering", "ordering"),
        tooltip=["ordering", alt.Tooltip("fraction:Q", format=".0%"), alt.Tooltip("value:Q", format=".2%")],
    )
    rules = alt.Chart(references).mark_rule(strokeDash=[6, 4], color="black").encode(
        y="value:Q", tooltip=["label", alt.Tooltip("value:Q", format=".2%")])
    # the self-test label sits above its line at the left, the cross-test label below its line at the right
    self_label = alt.Chart(references[references["kind"] == "self"]).mark_text(
        align="left", baseline="bottom", dx=3, dy=-3, fontSize=11).encode(x=alt.datum(0), y="value:Q", text="label:N")
    cross_label = alt.Chart(references[references["kind"] == "cross"]).mark_text(
        align="right", baseline="top", dx=-3, dy=3, fontSize=11).encode(x=alt.datum(1), y="value:Q", text="label:N")
    return alt.layer(lines, rules, self_label, cross_label).properties(title=f"{metric} while backfilling", height=340)
