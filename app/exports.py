"""Downloads of a chart (PNG, SVG, offline HTML, CSV of its data) and of a whole study (zip).

PNG and SVG come from vl-convert-python, which Altair calls when it saves; the HTML embeds the Vega,
Vega-Lite and vega-embed scripts (vl-convert's bundled copies), so it opens with no network. Nothing is
converted until a button is pressed: each button holds a function, and vl_convert is imported then.
"""
from __future__ import annotations

import importlib.util
import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

FORMATS = {"png": "image/png", "svg": "image/svg+xml", "html": "text/html", "csv": "text/csv"}


def can_export_images() -> bool:
    """PNG/SVG (and inline HTML) need vl-convert-python, pinned in requirements.txt."""
    return importlib.util.find_spec("vl_convert") is not None


def chart_bytes(chart: alt.TopLevelMixin, fmt: str) -> bytes:
    """The chart as ``png``, ``svg`` or self-contained ``html`` (scripts inline, no http(s) source)."""
    if fmt not in ("png", "svg", "html"):
        raise ValueError(f"unknown chart format {fmt!r}; use png, svg or html")
    with alt.data_transformers.disable_max_rows():  # the map draws up to 10,000 points; Altair stops at 5,000
        if fmt == "html":
            return chart.to_html(inline=True).encode()
        buffer = io.BytesIO() if fmt == "png" else io.StringIO()
        chart.save(buffer, format=fmt)
    value = buffer.getvalue()
    return value if isinstance(value, bytes) else value.encode()


def _within(part: pd.DataFrame, whole: pd.DataFrame) -> bool:
    """``part`` is ``whole`` or a row subset of it (a layer drawing some rows of another's data)."""
    if part is whole:
        return True
    return (list(part.columns) == list(whole.columns) and bool(part.index.isin(whole.index).all())
            and part.equals(whole.loc[part.index]))


def chart_data(chart: alt.TopLevelMixin) -> pd.DataFrame:
    """The data frames a chart draws (its own and its layers' / facet's), stacked; with several distinct ones a
    ``layer`` column numbers them in drawing order."""
    frames: list[pd.DataFrame] = []

    def walk(c: Any) -> None:
        data = getattr(c, "data", alt.Undefined)
        if isinstance(data, pd.DataFrame) and not any(_within(data, f) for f in frames):
            frames.append(data)
        for attr in ("layer", "hconcat", "vconcat", "concat", "spec"):
            child = getattr(c, attr, None)
            if child is None or child is alt.Undefined:
                continue
            for part in child if isinstance(child, list) else [child]:
                walk(part)

    walk(chart)
    if len(frames) <= 1:
        return frames[0] if frames else pd.DataFrame()
    return pd.concat([f.assign(layer=i) for i, f in enumerate(frames, start=1)], ignore_index=True)


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """A data frame as CSV whose text cells (and headers) a spreadsheet will not run as formulas
    (``engine.results.report.safe_cell``); numbers stay numbers."""
    from engine.read.matrices import safe_cell

    safe = frame.rename(columns=lambda c: safe_cell(str(c)))
    text = safe.select_dtypes(include=["object", "string"]).columns
    safe[text] = safe[text].map(safe_cell)
    return safe.to_csv(index=False).encode()


def _file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "chart"


def download_buttons(chart: alt.TopLevelMixin, name: str, *, key: str) -> None:
    """A small "Download" menu under a chart: PNG, SVG, HTML and CSV (the chart's data) buttons in one row."""
    stem = _file_stem(name)
    images = can_export_images()
    makers = {"png": lambda: chart_bytes(chart, "png"), "svg": lambda: chart_bytes(chart, "svg"),
              "html": lambda: chart_bytes(chart, "html"),
              "csv": lambda: csv_bytes(chart_data(chart))}
    with st.popover("Download", icon=":material/download:", help="this chart as PNG, SVG, HTML (works offline) or "
                    "CSV (its data)"):
        for col, (fmt, make) in zip(st.columns(len(makers)), makers.items()):
            col.download_button(fmt.upper(), make, file_name=f"{stem}.{fmt}", mime=FORMATS[fmt], on_click="ignore",
                                key=f"{key}_{fmt}", disabled=fmt != "csv" and not images,
                                help=None if images or fmt == "csv" else "needs the vl-convert-python package")


def study_download(experiments: Sequence[Mapping[str, Any]], matrices: Mapping[int, Sequence[Mapping[str, Any]]], *,
                   title: str, key: str, names: Mapping[int, Mapping[int, str | None]] | None = None) -> None:
    """A "Download this study" button: the zip of ``engine.results.bundle`` (config TOML, matrices CSV/JSON,
    summary Markdown), built when pressed; ``names``: experiment id -> {step: the user's model name}."""
    from engine.read.matrices import study_bundle

    st.download_button("Download this study (zip)", lambda: study_bundle(experiments, matrices, title=title, names=names),
                       file_name=f"{_file_stem(title)}.zip", mime="application/zip", on_click="ignore", key=key,
                       help="study.toml to rerun it, matrices.csv / matrices.json, summary.md")
