"""Altair charts of the dashboard, built from plain numpy/pandas data (no Streamlit, no database)."""
from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

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


def summary_line(summary: dict, digits: int = 1, *, bold: bool = True) -> str:
    """``AC 33.3% · AA 45.2% · ACA 12.0%`` (markdown, bold names; ``bold=False``: plain, for a chart's title), the
    same unit as the tables."""
    mark = "**" if bold else ""
    return " · ".join(f"{mark}{name}{mark} {percent(summary.get(name), digits)}" for name in SUMMARY_METRICS)


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
                 valid: np.ndarray | None = None, paired: dict | None = None, gain: Sequence | None = None,
                 tie_readings: dict | None = None) -> pd.DataFrame:
    """Lower-triangle cells as rows: query, gallery, value, status (self / pass / fail / n/c), label, and, when
    stored, the paired verdict (pass / fail / unresolved), its interval, the update gain Γ of each cross-test and a
    Recall@k cell's ties (``tie_readings``, as stored: share tied, the three readings, whether they decide)."""
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
                         "gain": None if g is None else float(g), "ties": tie_cell(tie_readings, t, k)})
    return pd.DataFrame(rows)


def tie_cell(tie_readings: dict | None, t: int, k: int) -> str:
    """``12.5 % tied · 30.8 / 38.9 / 46.1 % · ties decide the verdict`` (pessimistic / expected / optimistic), ``none
    tied`` where no query is, empty without stored ties."""
    if not tie_readings or tie_readings["tied"][t][k] is None:
        return ""
    if not tie_readings["tied"][t][k]:
        return "none tied"
    readings = " / ".join(f"{100 * tie_readings[r][t][k]:.1f}" for r in tie_readings["readings"])
    decide = tie_readings.get("decide")
    decided = " · ties decide the verdict" if decide and decide[t][k] else ""
    return f"{100 * tie_readings['share'][t][k]:.1f} % tied · {readings} %{decided}"


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
    if "ties" in frame and frame["ties"].astype(bool).any():
        tooltip.append(alt.Tooltip("ties:N", title="ties: share; pessimistic / expected / optimistic"))
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


def side_by_side(panels: Sequence[alt.TopLevelMixin], title: str) -> alt.HConcatChart:
    """Charts left to right in one figure (one title, one download)."""
    return alt.hconcat(*panels, spacing=36).properties(title=title)


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
                 alt.Tooltip(f"{value}:Q", format=".1%" if percent_axis else ".3f", title=y_title)],
    ).properties(title=title, height=260)


# ---------------------------------------------------------------------------------------------- geometry


RETRIEVAL_COLOURS = {"both correct": "#54a24b", "lost by the update": "#e45756", "gained by the update": "#4c78a8",
                     "both wrong": "#9d755d", "not stored": "#bab0ac"}
FADED = "#d9d9d9"  # points outside the searched / highlighted classes
LEGEND_ROWS = 20  # legend entries per column before another column starts (no entry is ever dropped)
# drag pans, the wheel zooms, shift + drag draws the box (Vega-Lite has point and interval selections, no lasso)
PAN = "[mousedown[!event.shiftKey], window:mouseup] > window:mousemove!"
BOX_DRAG = "[mousedown[event.shiftKey], window:mouseup] > window:mousemove!"


def class_palette(n: int) -> list[str]:
    """``n`` distinct colours: Tableau 10 / 20 up to 20 classes, beyond that hues around the colour wheel by the
    golden angle in three lightness bands, so neighbouring classes in the legend never look alike."""
    import colorsys

    if n <= 10:
        return ["#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
                "#bab0ac"][:n]
    if n <= 20:
        return ["#4c78a8", "#9ecae9", "#f58518", "#ffbf79", "#54a24b", "#88d27a", "#b79a20", "#f2cf5b", "#439894",
                "#83bcb6", "#e45756", "#ff9d98", "#79706e", "#bab0ac", "#d67195", "#fcbfd2", "#b279a2", "#d6a5c9",
                "#9e765f", "#d8b5a5"][:n]
    colours = []
    for i in range(n):
        r, g, b = colorsys.hls_to_rgb((i * 0.381966) % 1.0, (0.38, 0.55, 0.70)[i % 3], 0.75)
        colours.append(f"#{round(255 * r):02x}{round(255 * g):02x}{round(255 * b):02x}")
    return colours


def _map_colour(points: pd.DataFrame, colour_by: str, model_names: Sequence[str]) -> alt.Color:
    """The colour channel of the map for one colour-by column (``app.map_explore.COLOUR_BY``)."""
    if colour_by == "model":
        return alt.Color("model:N", title="model",
                         scale=alt.Scale(domain=list(model_names), range=list(OLD_NEW_COLOURS)))
    if colour_by == "retrieval":
        domain = [d for d in RETRIEVAL_COLOURS if d in set(points["retrieval"])]
        return alt.Color("retrieval:N", title="top-1 retrieval (old gallery)", sort=domain,
                         scale=alt.Scale(domain=domain, range=[RETRIEVAL_COLOURS[d] for d in domain]))
    if colour_by == "drift":
        return alt.Color("drift:Q", title="drift (1 - cos old, new)", scale=alt.Scale(scheme="viridis"))
    order = list(points.sort_values("label")["class"].drop_duplicates())
    columns = -(-len(order) // LEGEND_ROWS)
    return alt.Color("class:N", title="class", sort=order,
                     scale=alt.Scale(domain=order, range=class_palette(len(order))),
                     legend=alt.Legend(symbolLimit=len(order) + 1, columns=columns, labelLimit=160))


def projection_chart(points: pd.DataFrame, means: pd.DataFrame, prototypes: pd.DataFrame, lines: pd.DataFrame, *,
                     model_names: Sequence[str], title: str, facet: bool, colour_by: str = "class",
                     highlight: Sequence[str] = (), query_row: int | None = None,
                     pick: str = "pick", box: str = "box", highlight_rows: Sequence[int] = ()) -> alt.TopLevelMixin:
    """Old and new features in one 2-D map: colour = ``colour_by`` (a column of ``points``), shape = model; class
    means ringed, prototypes as +. Classes in ``highlight`` keep their colour and the others fade; the points
    of image ``query_row`` are ringed; points of the stored rows ``highlight_rows`` (texts found by search) too keep
    their colour. Selections for ``st.altair_chart(on_select=...)``: ``pick`` (click a
    point: its ``row`` and ``model``) and ``box`` (shift + drag: an x/y interval); drag pans, the wheel zooms."""
    points, means = (d.assign(highlighted=d["class"].isin(highlight) if len(highlight) else True)
                     for d in (points, means))
    if len(highlight_rows):
        found = points["row"].isin(highlight_rows)
        points = points.assign(highlighted=found | (points["class"].isin(highlight) if len(highlight) else False))
    colour = _map_colour(points, colour_by, model_names)
    faded = lambda c: alt.condition(alt.datum.highlighted, c, alt.value(FADED))  # noqa: E731
    legend_pick = alt.selection_point(fields=["class"], bind="legend") if colour_by == "class" else None
    click = alt.selection_point(name=pick, fields=["row", "model"], on="click", toggle=False, clear="dblclick")
    brush = alt.selection_interval(name=box, encodings=["x", "y"], on=BOX_DRAG, zoom=False, translate=BOX_DRAG,
                                   clear="dblclick")
    shape = alt.Shape("model:N", title="model", scale=alt.Scale(domain=list(model_names), range=list(OLD_NEW_SHAPES)))
    x = alt.X("x:Q", title=None, axis=alt.Axis(labels=False, ticks=False, grid=False))
    y = alt.Y("y:Q", title=None, axis=alt.Axis(labels=False, ticks=False, grid=False))

    def seen(on: float, off: float):  # opacity: dimmed outside the class picked in the legend
        return alt.value(on) if legend_pick is None else alt.condition(legend_pick, alt.value(on), alt.value(off))
    tooltip = [c for c in ("image", "text", "class", "model", "row", "retrieval") if c in points]
    if "drift" in points and points["drift"].notna().any():
        tooltip.append(alt.Tooltip("drift:Q", format=".3f", title="drift (1 - cos)"))
    params = [click, brush] + ([legend_pick] if legend_pick is not None else [])
    mean_colour = colour if colour_by == "class" else alt.value("#555555")

    def layers(keep: Callable[[pd.DataFrame], pd.DataFrame], pan: str) -> alt.LayerChart:
        """The map's layers on the rows ``keep`` leaves of each table (all of them, or one model's)."""
        pan_zoom = alt.selection_interval(name=pan, bind="scales", on=PAN, translate=PAN)
        out = []
        if len(keep(lines)):
            out.append(alt.Chart(keep(lines)).mark_line(strokeWidth=0.8, opacity=0.35, color="#777777").encode(
                x=x, y=y, detail="row:N", order="model_index:Q"))
        out.append(alt.Chart(keep(points)).mark_point(filled=True, size=28).encode(
            x=x, y=y, color=faded(colour), shape=shape, order=alt.Order("highlighted:N"),
            opacity=seen(0.75, 0.08), tooltip=tooltip).add_params(*params, pan_zoom))
        query = keep(points[points["row"] == query_row])
        if len(query):
            out.append(alt.Chart(query).mark_point(size=420, strokeWidth=2.5, color="black", filled=False).encode(
                x=x, y=y, shape=shape, tooltip=[alt.Tooltip("class:N", title="query"), "model", "row"]))
        if len(keep(means)):
            out.append(alt.Chart(keep(means)).mark_point(filled=True, size=260, stroke="black", strokeWidth=1.5).encode(
                x=x, y=y, color=faded(mean_colour), shape=shape, opacity=seen(1.0, 0.1),
                tooltip=[alt.Tooltip("class:N"), alt.Tooltip("model:N", title="class mean of")]))
        if len(keep(prototypes)):
            out.append(alt.Chart(keep(prototypes)).mark_point(shape="cross", filled=True, size=320,
                                                              color="black").encode(x=x, y=y, tooltip=[alt.Tooltip("class:N", title="fixed prototype of")]))
        return alt.layer(*out)

    rows_of_legend = min(points["class"].nunique(), LEGEND_ROWS) if colour_by == "class" else 4
    if facet:  # separate maps: different spaces, one per model, sharing the click and box selections
        views = [layers(lambda d, m=m: d[d["model"] == m] if "model" in d else d.iloc[:0], f"pan_{i}").properties(
            width=430, height=430, title=m) for i, m in enumerate(model_names)]
        with warnings.catch_warnings():  # Altair merges the selections both views share, as intended
            warnings.simplefilter("ignore", UserWarning)
            return alt.hconcat(*views).resolve_scale(x="independent", y="independent").properties(title=title)
    height = max(560, 18 * rows_of_legend + 60)  # the legend is never cut
    return layers(lambda d: d, "pan").properties(title=title, height=height)


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


# what a chart's axis says for a stored field (never the field's name)
AXIS_TITLES = {"prototype_cosine": "cos(feature, class prototype)", "centroid_energy": "share of energy on the centroid",
               "nc1": "NC1 (within-class variability)", "mean_drift_seen": "mean cos(old, new) of old classes",
               "AC_t": "AC of the first t models", "AA_t": "AA of the first t models"}


def axis_title(field: str) -> str:
    """A human axis title for a stored field (``AXIS_TITLES``), the field with spaces for one not listed."""
    return AXIS_TITLES.get(field, field.replace("_", " "))


def steps_chart(frame: pd.DataFrame, value: str, title: str, *, log: bool = False) -> alt.Chart:
    """One value per step (a line); ``log`` for values spanning orders of magnitude."""
    scale = alt.Scale(type="log") if log else alt.Scale(zero=False)
    return alt.Chart(frame.assign(step_shown=frame["step"].astype(float))).mark_line(point=True).encode(
        x=step_axis(frame["step"].tolist()),
        y=alt.Y(f"{value}:Q", title=axis_title(value) + (" (log scale)" if log else ""), scale=scale),
        tooltip=["step", alt.Tooltip(f"{value}:Q", format=".3f", title=axis_title(value))]).properties(title=title,
                                                                                                        height=220)


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
