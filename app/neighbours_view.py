"""The Feature geometry page's cross-model nearest neighbours (Streamlit): the query image, then its neighbours
in the old and in the new gallery side by side, with hit/miss and cosine distance."""
from __future__ import annotations

import numpy as np
import streamlit as st

from app import images
from app import queries as q
from app.widgets import model_label, plain, state_convention
from engine.core.contract import same_set_of


def pick_query(url: str, steps: list[int], by_step: dict[int, dict], default_step: int, same_set: bool) -> tuple[int, int, int]:
    """(query model step, query row, k): the row comes from ``st.session_state["geometry_query"]`` (a stored query
    row, e.g. a clicked map point) when set, else from the class + sample pickers."""
    c = st.columns([1, 2, 2, 1])
    q_step = c[0].selectbox("Query model", steps, index=steps.index(default_step), key="nn_query_step")
    version = by_step[q_step]
    labels = images.labels(url, version["id"], "query")
    names = version["class_names"] or []

    def name(label: int) -> str:
        return names[label] if label < len(names) else f"class {label}"

    present = sorted({int(v) for v in labels})
    chosen = st.session_state.get("geometry_query")
    if st.session_state.get("geometry_query_split", "query") != "query" and not same_set:
        chosen = None  # a row of another image set (an open-set gallery map)
    if chosen is not None and chosen != st.session_state.get("nn_applied_query") and 0 <= int(chosen) < len(labels):
        st.session_state["nn_applied_query"] = chosen  # a new query from outside: point the pickers at it
        st.session_state["nn_class"] = int(labels[int(chosen)])
        st.session_state["nn_sample"] = int(chosen)
    label = c[1].selectbox("Query class", present, format_func=name, key="nn_class")
    rows = [int(r) for r in np.flatnonzero(labels == label)]
    if st.session_state.get("nn_sample") not in rows:
        st.session_state["nn_sample"] = rows[0]
    row = c[2].selectbox("Query image", rows, key="nn_sample",
                         format_func=lambda r: f"{rows.index(r) + 1} of {len(rows)} in its class (row {r})")
    k = c[3].slider("Neighbours", 1, 20, 5, key="nn_k")
    return q_step, int(row), int(k)


def show_gallery(nn: dict, pictures: list[bytes | None], title: str) -> None:
    """One gallery's neighbours: images (or class names) with hit/miss and cosine distance under each."""
    hits = sum(n["hit"] for n in nn["neighbours"])
    st.markdown(f"**{plain(title)}** · {hits}/{len(nn['neighbours'])} hits · {nn['n_positives']} positives among "
                f"{nn['n_gallery']} images" + (" · query's own image excluded" if nn["same_set"] else ""))
    captions = [f"{'✓ hit' if n['hit'] else '✗ miss'} · {n['name']} · d={1 - n['similarity']:.3f}"  # plain text
                for n in nn["neighbours"]]
    if all(p is not None for p in pictures) and pictures:
        st.image(pictures, caption=captions, width=72)
    else:
        for n, caption in zip(nn["neighbours"], captions):
            st.text(f"#{n['rank']}  {caption}")


def show_neighbours(url: str, experiment: dict, versions: list[dict], old: dict, new: dict, view: str) -> None:
    """The query image and its neighbours in the old and in the new gallery, side by side."""
    st.subheader("Nearest neighbours across models")
    st.caption("The query, embedded by the query model, searched in the gallery embedded by the old model and in the "
               "gallery embedded by the new model (the two steps chosen above). ✓ = same class as the query; "
               "d = cosine distance (1 - cosine similarity).")
    state_convention(experiment["config"], metrics="cosine similarity", views=view, gallery="instance",
                     eval_classes="all", ecc=False)
    steps = [v["step"] for v in versions]
    by_step = {v["step"]: v for v in versions}
    q_step, row, k = pick_query(url, steps, by_step, new["step"], same_set_of(experiment["config"]))
    galleries = ((old, f"old gallery ({model_label(old)})"), (new, f"new gallery ({model_label(new)})"))
    results = []
    try:
        for gallery, _ in galleries:
            results.append(q.neighbours(url, by_step[q_step]["id"], gallery["id"], view, row, k))
    except ValueError as exc:
        st.warning(plain(exc))
        return
    note = images.images_note(url, by_step[q_step]["id"], "query")
    if note:
        st.caption(note + " Neighbours are shown by class name.")
    query = results[0]["query"]
    left, *sides = st.columns([1, 3, 3])
    with left:
        st.markdown("**Query**")
        picture = images.thumbnails(url, by_step[q_step]["id"], "query", (row,))[0]
        if picture is not None:
            st.image(picture, width=96)
        st.caption(f"{plain(query['name'])} · row {query['index']} · model step {q_step}")
    for side, nn, (gallery, title) in zip(sides, results, galleries):
        with side:
            rows = tuple(n["gallery_index"] for n in nn["neighbours"])
            show_gallery(nn, images.thumbnails(url, gallery["id"], "gallery", rows) if not note else [], title)
