"""Drawing helpers shared by the Learn pages (not a page itself).

Streamlit sizes an Altair chart's *whole* view (legends and titles included) to the size it is
given, which squashes a scatter plot whose two axes must keep one scale. ``show_square`` pads the
legend outside a plot of exactly ``side`` x ``side`` pixels; ``show_wide`` fits a plot of fixed
height to the column's width. Put legends at the bottom (``legend=BOTTOM``) so they do not eat width.
"""
from __future__ import annotations

import altair as alt
import streamlit as st

BOTTOM = alt.Legend(orient="bottom", symbolOpacity=1)


def class_colors(num_classes: int = 10, scheme: str = "tableau10") -> alt.Scale:
    """One colour per class id "0", "1", ... that stays the same whichever classes a chart shows."""
    return alt.Scale(domain=[str(c) for c in range(num_classes)], scheme=scheme)


def show_square(chart: alt.TopLevelMixin, side: int) -> None:
    """Draw ``chart`` with a ``side`` x ``side`` plot area (equal scales stay equal); legends pad outside it."""
    st.altair_chart(chart.properties(width=side, height=side, autosize=alt.AutoSizeParams(type="pad")),
                    width="content", height="content")


def show_wide(chart: alt.TopLevelMixin, height: int) -> None:
    """Draw ``chart`` as wide as its column with a plot ``height`` pixels high."""
    st.altair_chart(chart.properties(height=height, autosize=alt.AutoSizeParams(type="fit-x", contains="padding")),
                    width="stretch", height="content")
