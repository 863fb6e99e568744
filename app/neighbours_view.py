"""The Feature geometry page's cross-model nearest neighbours (Streamlit): the query image, then its neighbours
in the old and in the new gallery side by side, with hit/miss and cosine distance. For a text comparison (its
items stored as texts) the query sentence and the retrieved texts, a query found by substring."""
from __future__ import annotations

import numpy as np
import streamlit as st

from app import images
from app import map_explore as mx
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


def pick_text_query(steps: list[int], default_step: int, texts: tuple[str, ...], same_set: bool) -> tuple[int, int, int]:
    """(query model step, query row, k) for text items: a substring search over the query texts, then one of the
    matching sentences; a stored query row from outside (``geometry_query``, a clicked map point) takes over."""
    c = st.columns([1, 2, 4, 1])
    q_step = c[0].selectbox("Query model", steps, index=steps.index(default_step), key="nn_query_step")
    chosen = st.session_state.get("geometry_query")
    if st.session_state.get("geometry_query_split", "query") != "query" and not same_set:
        chosen = None  # a row of another set (the gallery map of an open-set comparison)
    if chosen is not None and chosen != st.session_state.get("nn_applied_query") and 0 <= int(chosen) < len(texts):
        st.session_state["nn_applied_query"] = chosen  # a new query from outside: clear the search, select it
        st.session_state["nn_text_search"] = ""
        st.session_state["nn_text_row"] = int(chosen)
    search = c[1].text_input("Find a query sentence", key="nn_text_search", placeholder="part of a sentence",
                             help="Case-insensitive substring of the query texts")
    rows = mx.matching_rows(texts, search)
    if search.strip() and not rows:
        c[1].caption(f"No query text contains {plain(search.strip())}.")
    rows = rows or list(range(len(texts)))
    if st.session_state.get("nn_text_row") not in rows:
        st.session_state["nn_text_row"] = rows[0]
    row = c[2].selectbox(f"Query sentence ({len(rows):,} of {len(texts):,})", rows, key="nn_text_row",
                         format_func=lambda r: f"#{r}: {mx.short(texts[r], 100)}")
    k = c[3].slider("Neighbours", 1, 20, 5, key="nn_k")
    return q_step, int(row), int(k)


def label_name(label: int, classes: list[str]) -> str:
    """A label by the comparison's class names (a synset id on a qrels corpus, a supersense on the class task)."""
    return str(classes[label]) if 0 <= label < len(classes) else f"class {label}"


def show_text_gallery(nn: dict, texts: list[str] | None, title: str, classes: list[str]) -> None:
    """One gallery's neighbours as texts, ranked, each marked hit or miss, with its cosine distance and label."""
    hits = sum(n["hit"] for n in nn["neighbours"])
    st.markdown(f"**{plain(title)}** · {hits}/{len(nn['neighbours'])} hits · {nn['n_positives']} relevant among "
                f"{nn['n_gallery']:,} texts")
    texts = texts or ["(text not stored)"] * len(nn["neighbours"])
    for n, text in zip(nn["neighbours"], texts):
        mark = ":green[**✓ hit**]" if n["hit"] else ":red[✗ miss]"
        with st.container(border=True):
            st.markdown(f"**#{n['rank']}** {mark} · d={1 - n['similarity']:.3f} · {plain(label_name(n['label'], classes))}  \n{plain(text)}")


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
    query_texts = images.texts(url, new["id"], "query")  # None unless the items are texts
    hit = ("relevant (on WordNet's qrels task: the query's own synset's definition; on the class task: a definition "
           "of the same supersense)" if query_texts is not None else "same class as the query")
    st.caption("The query, embedded by the query model, searched in the gallery embedded by the old model and in the "
               f"gallery embedded by the new model (the two steps chosen above). ✓ = {hit}; "
               "d = cosine distance (1 - cosine similarity).")
    state_convention(experiment["config"], metrics="cosine similarity", views=view, gallery="instance",
                     eval_classes="all", ecc=False)
    steps = [v["step"] for v in versions]
    by_step = {v["step"]: v for v in versions}
    if query_texts is not None:
        show_text_neighbours(url, experiment, steps, by_step, (old, new), view, query_texts)
        return
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


def show_text_neighbours(url: str, experiment: dict, steps: list[int], by_step: dict[int, dict],
                         old_new: tuple[dict, dict], view: str, query_texts: tuple[str, ...]) -> None:
    """The query sentence and the texts nearest to it in the old and in the new gallery, side by side."""
    old, new = old_new
    classes = list(experiment["config"].get("dataset_classes") or [])  # names of the labels, stored with the comparison
    q_step, row, k = pick_text_query(steps, new["step"], query_texts, same_set_of(experiment["config"]))
    galleries = ((old, f"old gallery ({model_label(old)})"), (new, f"new gallery ({model_label(new)})"))
    try:
        results = [q.neighbours(url, by_step[q_step]["id"], gallery["id"], view, row, k) for gallery, _ in galleries]
    except ValueError as exc:
        st.warning(plain(exc))
        return
    query = results[0]["query"]
    st.markdown("**Query**")
    with st.container(border=True):
        st.markdown(plain(query_texts[row]))
        st.caption(f"relevant: {plain(label_name(query['label'], classes))} · query row {query['index']} · embedded by model step {q_step}")
    sides = st.columns(2)
    for side, nn, (gallery, title) in zip(sides, results, galleries):
        with side:
            rows = tuple(n["gallery_index"] for n in nn["neighbours"])
            stored = images.texts(url, gallery["id"], "gallery")
            show_text_gallery(nn, None if stored is None else [stored[r] for r in rows], title, classes)
