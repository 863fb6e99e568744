"""The Feature geometry page's explorer map (Streamlit): colour-by, class search and highlight, display sampling,
hover thumbnails (or texts, with a text search), click-to-query and the box list. The pure parts live in
``app.map_explore``."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from app import charts, images
from app import map_explore as mx
from app.widgets import MISSING, plain

TEXT_CLASS_COLOURS = 45  # text maps with more classes (qrels: one per item) open coloured by model
HOVER_IMAGES = 2_000  # drawn images per model up to which the map's tooltip carries thumbnails


def set_query_from_click(event: object, split: str) -> None:
    """A new click on the map makes its image the query: ``geometry_query`` (its stored row) and
    ``geometry_query_split`` (the map's split), read by the neighbours section."""
    row = mx.clicked_row(event)
    if row is None or row == st.session_state.get("geo_last_click"):
        return  # no click, or the same selection seen on an earlier rerun: leave a query typed since alone
    st.session_state["geo_last_click"] = row
    st.session_state["geometry_query"] = row
    st.session_state["geometry_query_split"] = split


def map_thumbnails(url: str, version_id: int, split: str) -> mx.ImageUris | None:
    """Rows of the map -> thumbnail URIs, from the stored image references of ``version_id``; None without them."""
    if images.images_note(url, version_id, split):
        return None
    return lambda frame: images.thumbnail_uris(url, version_id, split, tuple(int(r) for r in frame["row"]))


def show_map(points: pd.DataFrame, means: pd.DataFrame, protos: pd.DataFrame, lines: pd.DataFrame, *,
             payload: dict, model_names: list[str], conv: str, title: str,
             image_uris: mx.ImageUris | None = None, texts: tuple[str, ...] | None = None) -> alt.TopLevelMixin:
    """The explorer's map: colour-by, class search and highlight, display sampling, click-to-query and the list of
    the points in a box; ``image_uris`` (rows -> image URIs) adds thumbnails to that list and, on maps of at most
    ``HOVER_IMAGES`` drawn images per model, to the hover tooltip; ``texts`` (one per stored row of the split, for
    text items) put each point's text in the tooltip and the box list and add a text search. Returns the chart drawn
    (for its downloads)."""
    split = payload["params"]["split"]
    set_query_from_click(st.session_state.get("geo_map"), split)
    points = mx.with_colour_columns(points, model_names)
    classes = list(points.sort_values("label")["class"].drop_duplicates())
    if texts is not None and len(classes) > TEXT_CLASS_COLOURS:
        st.session_state.setdefault("geo_colour", "model")  # a qrels corpus: one "class" per text, past any legend
    e = st.columns([1, 1, 1])
    colour_by = e[0].selectbox("Colour by", list(mx.COLOUR_BY), key="geo_colour",
                               help="retrieved across models: is the nearest other image of the split, in the old "
                                    "model's gallery, of the same class for the old model (old/old) and for the new "
                                    "query (new/old)? drift: 1 - cosine between an image's old and new feature")
    search = e[1].text_input("Find classes", key="geo_search", placeholder="part of a class name",
                             help="matching classes keep their colour; the others fade")
    one = e[2].selectbox("Highlight class", [None, *classes], key="geo_highlight",
                         format_func=lambda c: "all classes" if c is None else c)
    matches = mx.matching_classes(classes, search)
    highlight = list(dict.fromkeys(matches + ([one] if one else [])))
    if search.strip():
        shown_names = ", ".join(matches[:12]) + (f" and {len(matches) - 12} more" if len(matches) > 12 else "")
        st.caption(f"{len(matches)} class(es) match {search.strip()!r}: {plain(shown_names)}" if matches
                   else f"No class matches {search.strip()!r}.")
    found: list[int] = []
    if texts is not None:
        needle = st.text_input("Find texts", key="geo_text_search", placeholder="part of a sentence or definition",
                               help="matching points keep their colour; the others fade")
        found = mx.matching_rows(texts, needle)
        if needle.strip():
            st.caption(f"{len(found):,} text(s) contain {plain(needle.strip())!s}" + (":" if found else "."))
        if found:
            st.dataframe(pd.DataFrame({"row": found, "text": [texts[r] for r in found]}), hide_index=True,
                         width="stretch", height=min(220, 36 + 35 * len(found)))
    column = mx.COLOUR_BY[colour_by]
    if column in ("retrieval", "drift") and not mx.has_explorer_columns(points):
        st.caption("This map was stored without per-point retrieval and drift (computed before they existed, or old "
                   "and new features do not share a space): colouring by class.")
        column = "class"
    drawn, note = mx.display_sample(points, mx.DISPLAY_LIMIT, payload["params"].get("seed", 0))
    if note:
        st.info(note[0].upper() + note[1:])
    if texts is not None:
        drawn = drawn.assign(text=[mx.short(texts[r]) for r in drawn["row"]])  # the tooltip's "text" field
    if image_uris is not None and drawn["row"].nunique() <= HOVER_IMAGES:
        drawn = drawn.assign(image=list(image_uris(drawn)))  # a Vega tooltip shows a field named "image"
    elif image_uris is not None:
        st.caption(f"Hover thumbnails appear on maps of at most {HOVER_IMAGES:,} images per model (each travels "
                   "inside the chart); the box list below shows them at any size.")
    query = st.session_state.get("geometry_query") if st.session_state.get("geometry_query_split") == split else None
    chart = charts.projection_chart(drawn, means, protos, lines, model_names=model_names, facet=not payload["joint"],
                                    colour_by=column, highlight=highlight, title=title,
                                    query_row=query,
                                    pick=mx.PICK, box=mx.BOX, highlight_rows=found)
    chart = charts.with_convention(chart, conv, 110)
    event = st.altair_chart(chart, width="stretch", on_select="rerun",
                            selection_mode=[mx.PICK, mx.BOX], key="geo_map")
    st.caption("Click a point to make it the query (ringed; the nearest neighbours below follow it); shift + drag to select a "
               "box, double-click to clear; drag to pan, scroll to zoom; click a legend entry to pick a class. "
               "Large ringed markers: class means; black +: fixed prototypes.")
    if query is not None and (points["row"] == query).any():
        name = points.loc[points["row"] == query, "class"].iloc[0]
        st.caption(f"Query: {split} {'text' if texts is not None else 'image'} #{query} ({plain(name)}), ringed on the map.")
    selected = mx.boxed_points(event, points)
    if len(selected):
        st.markdown(f"**Selected in the box**: {selected['row'].nunique():,} {'texts' if texts is not None else 'images'}, {len(selected):,} points")
        st.dataframe(mx.selection_table(selected, image_uris, texts), hide_index=True, placeholder=MISSING, width="stretch",
                     height=260,
                     column_config={"image": st.column_config.ImageColumn("image", width="small"),
                                    "drift": st.column_config.NumberColumn("drift (1 - cos)", format="%.3f")})
    return chart
