"""Feature geometry: old and new features in one 2-D map, drift, angles, neural collapse, nearest neighbours."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from app import charts, images
from app import map_explore as mx
from app import queries as q
from app.exports import download_buttons
from app.map_view import TEXT_CLASS_COLOURS, map_thumbnails, show_map
from app.neighbours_view import show_neighbours
from app.text_upgrade_view import text_task
from app.widgets import MISSING, analysis_result, pick_experiment, pick_steps, plain, state_convention
from engine.core.contract import CLASS_MEAN, PROTOTYPE, SAMPLE

url = q.db_url()
LINES_SHOWN = 150
ONE_TEXT_PER_CLASS = ("Class-based geometry does not apply here: on the qrels task each class is one text (a definition, "
                      "queried by its own example sentence), so class means, class drift, angles between class means, "
                      "neural collapse, Definition 1's same-class pairs and the stationarity probe have nothing to "
                      "measure. The drift of each text is the map's colour *drift*; a text comparison shows the map, "
                      "its text search and the neighbours below.")

PROBE_COLUMNS = {"step": "step", "classes": "classes", "prototypes": "prototypes",
                 "prototype_cosine": "cosine to own prototype", "centroid_energy": "energy along centroid",
                 "centroid_turn": "centroid turn (°)", "note": "note"}


def show_stationarity(rows: list[dict], config: dict, split: str) -> None:
    """The stored stationarity probe of every step: two charts, a table and how to read them."""
    st.markdown("**Stationarity probe** — encoder features against the classifier's prototypes, per step")
    probe = pd.DataFrame(rows)
    if probe.empty or probe["prototype_cosine"].isna().all():
        notes = sorted({n for n in probe.get("note", pd.Series(dtype=str)).dropna()})
        st.caption("Not available for this experiment" + (f": {plain('; '.join(notes))}" if notes else
                                                          " (computed before the probe existed: compute it again)"))
        return
    st.caption("How to read it: a stationary model puts each feature on its class prototype (cosine near 1); "
               "when the cosine is low and most of the feature energy lies along the centroid of the prototypes "
               "assigned so far, the features mostly say \"one of the classes seen so far\", and the centroid turn "
               "shows how far that direction, and with it the features, must move when classes are added.")
    if (probe["prototypes"] == "learned classifier rows").any():
        st.caption("This method learns its classifier: its weight rows of each step stand in for the prototypes, "
                   "and they move themselves from step to step.")
    conv = state_convention(config, views="encoder", retrieval=False, ecc=False,
                            extra=[f"{split} split", "images of each model's trained classes"])
    left, right = st.columns(2)
    for column, value, title in ((left, "prototype_cosine", "Mean cosine of a feature to its class prototype"),
                                 (right, "centroid_energy", "Share of feature energy along the assigned centroid")):
        points = probe[["step", value]].dropna()
        if len(points):
            column.altair_chart(chart := charts.with_convention(charts.steps_chart(points, value, title), conv, 60),
                                width="stretch")
            with column:
                download_buttons(chart, f"probe_{value}", key=f"dl_probe_{value}")
    table = probe[[c for c in PROBE_COLUMNS if c in probe]].rename(columns=PROBE_COLUMNS)
    st.dataframe(table, hide_index=True, placeholder=MISSING, width="stretch", column_config={
        "cosine to own prototype": st.column_config.NumberColumn(
            format="%.3f", help="mean over the images of the trained classes of cos(feature, its class prototype)"),
        "energy along centroid": st.column_config.NumberColumn(
            format="percent", help="sum of squared projections on the unit centroid of the assigned prototypes "
                                   "/ sum of squared feature norms"),
        "centroid turn (°)": st.column_config.NumberColumn(
            format="%.1f", help="angle between this step's assigned-prototype centroid and the previous step's"),
    })


st.title("Feature geometry")
st.caption("How the features of a new model sit relative to the old one's. Computations run in the engine worker and "
           "are stored, so each map is computed once.")

picked = pick_experiment(url, key="geo_experiment")
if picked is None:
    st.stop()
experiment, versions = picked
one_text_per_class = text_task(experiment["config"]) == "qrels"  # a text comparison's qrels task: classes are texts

c = st.columns([1, 1, 1, 1, 1, 2])
old, new = pick_steps(versions, key="geo_steps", columns=[c[0], c[1]])
views = [v for v in old["views"] if v in new["views"]]
main = q.main_view(experiment["method"])
view = c[2].selectbox("View", views, index=views.index(main) if main in views else 0,
                      key=f"geo_view_{experiment['id']}",  # each experiment starts on its main view
                      help="encoder features, raw logits/softmax, or PSP/LSP (both models projected onto the old "
                           "model's classes, as in the cross-test)")
split = c[3].selectbox("Split", ("gallery", "query"), key="geo_split")
method = c[4].radio("Map", ("umap", "pca"), key="geo_method", format_func=str.upper, horizontal=True,
                    help="UMAP shows neighbourhoods (seconds to compute); PCA is linear and instant")
max_points = c[5].select_slider("Points per model", (500, 1000, 2000, 5000, 10_000, 20_000, 50_000), value=2000,
                                key="geo_points", help=f"computed and stored; at most {mx.DISPLAY_LIMIT:,} per model "
                                                       "are drawn (sampled per class). UMAP of 50,000 takes minutes")
params = {"step_a": old["step"], "step_b": new["step"], "view": view, "split": split, "method": method,
          "max_points": max_points}
names = {0: f"step {old['step']} (old)", 1: f"step {new['step']} (new)"}

result = analysis_result(url, experiment, "projection", params, what="the feature map", button_key="geo_compute")
if result is not None:
    payload, array = result["payload"], result["array"]
    frame = pd.DataFrame(array, columns=payload["columns"])
    class_name = {c["label"]: c["name"] for c in payload["classes"]}
    stored_texts = images.texts(url, old["id"], split)  # None unless the items are texts
    items = "images" if stored_texts is None else "texts"
    if stored_texts is not None:  # a text comparison names its labels in its config (synset ids, or supersenses)
        named = list(experiment["config"].get("dataset_classes") or [])
        class_name.update({label: str(named[label]) for label in class_name if 0 <= label < len(named)})
    frame["class"] = frame["label"].astype(int).map(lambda y: class_name.get(y, f"class {y}"))
    frame["model"] = frame["model"].astype(int).map(names)
    frame["row"] = frame["row"].astype(int)
    for note in payload["notes"]:
        st.info(plain(note))
    conv = state_convention(experiment["config"], views=view, retrieval=False, ecc=False,
                            extra=[f"{split} split", f"sampling seed {payload.get('params', {}).get('seed', 0)}"])
    points = frame[frame["kind"] == SAMPLE]
    means = frame[frame["kind"] == CLASS_MEAN]
    protos = frame[frame["kind"] == PROTOTYPE]
    o = st.columns(4)
    show_lines = o[0].checkbox("Lines old → new", value=payload["joint"], disabled=not payload["joint"],
                               help=f"For {LINES_SHOWN} sampled images: where the same image moves")
    show_means = o[1].checkbox("Class means", value=stored_texts is None or len(payload["classes"]) <= TEXT_CLASS_COLOURS,
                               help="Off by default on a text map with one class per text (qrels): a mean would "
                                    "cover its one point")
    show_protos = o[2].checkbox(f"Fixed prototypes ({payload['prototypes']})", value=payload["prototypes"] > 0,
                                disabled=payload["prototypes"] == 0,
                                help=payload.get("prototype_note", "Fixed-prototype heads on the encoder view only"))
    lines = pd.DataFrame()
    if show_lines and payload["joint"]:
        rows = np.unique(points["row"])
        keep = rows[np.linspace(0, len(rows) - 1, min(LINES_SHOWN, len(rows))).astype(int)]
        lines = points[points["row"].isin(keep)].assign(model_index=lambda d: d["model"].eq(names[1]).astype(int))
    map_chart = show_map(points, means if show_means else means.iloc[:0], protos if show_protos else protos.iloc[:0],
                         lines, payload=payload, model_names=[names[0], names[1]], conv=conv,
                         title=f"{payload['embedding'].upper()} of L2-normalised {view} features · "
                               f"{payload['n_sampled']:,} of {payload['n_rows']:,} {split} {items} per model",
                         image_uris=map_thumbnails(url, old["id"], split),
                         texts=stored_texts)
    download_buttons(map_chart, f"map_{view}", key="dl_map")

if result is not None and one_text_per_class:
    same = [d["cosine"] for d in payload["drift"]]
    if same:
        st.metric("Mean cosine of the same text, old vs new model", f"{np.mean(same):.3f}",
                  help=f"over the {len(same):,} {split} texts of the map; 1 = the new model embeds each text where the "
                       "old one did")
    st.caption(ONE_TEXT_PER_CLASS)
elif result is not None:
    left, right = st.columns(2)
    with left:
        if payload["drift"]:
            drift = pd.DataFrame(payload["drift"]).rename(columns={"name": "class"})
            drift["trained by old model"] = np.where(drift["seen_old"], "yes", "no")
            st.altair_chart(chart := charts.with_convention(charts.drift_chart(drift), conv, 60), width="stretch")
            download_buttons(chart, "drift", key="dl_drift")
            seen = drift[drift["seen_old"]]
            if len(seen):
                st.caption(f"Mean drift cosine over the old model's classes: {seen['cosine'].mean():.3f}")
        else:
            st.caption("Drift needs old and new features of the same dimension.")
    with right:
        angles = pd.DataFrame([{"model": names[i], "angle": a} for i, m in enumerate(payload["collapse"])
                               for a in m.get("angles", [])])
        refs = pd.DataFrame([{"model": names[i], "label": f"regular simplex of {m['classes']} classes",
                              "angle": m["simplex_angle"]}
                             for i, m in enumerate(payload["collapse"]) if m.get("simplex_angle") is not None])
        if len(angles):
            st.altair_chart(chart := charts.with_convention(charts.angle_chart(angles, refs, model_names=[names[0], names[1]]),
                                                            conv, 60), width="stretch")
            download_buttons(chart, "angles", key="dl_angles")

    st.markdown("**Neural collapse** — each model on the classes it was trained on; 0 = perfect collapse")
    nc = pd.DataFrame([{
        "model": names[i], "classes": m["classes"], "images": m["n"], "NC1": m.get("nc1"),
        "NC2 (norms)": m.get("nc2_equinorm"), "NC2 (angles)": m.get("nc2_equiangularity"),
        "NC3": m.get("nc3"), "NC4": m.get("nc4"),
    } for i, m in enumerate(payload["collapse"])])
    st.dataframe(nc, hide_index=True, placeholder=MISSING, width="stretch", column_config={
        "NC1": st.column_config.NumberColumn(format="%.3f", help="within-class variability vs between-class spread"),
        "NC2 (norms)": st.column_config.NumberColumn(format="%.3f", help="equinorm: spread of the class-mean norms"),
        "NC2 (angles)": st.column_config.NumberColumn(format="%.3f", help="equiangularity: distance from a simplex"),
        "NC3": st.column_config.NumberColumn(format="%.3f", help="self-duality: class means vs classifier rows"),
        "NC4": st.column_config.NumberColumn(format="%.3f", help="share of predictions differing from nearest class mean"),
    })
    for i, m in enumerate(payload["collapse"]):
        for note in m.get("notes", []):
            st.caption(f"{names[i]}: {plain(note)}")
    d1 = payload["definition1"]
    st.markdown("**Definition 1** (Shen et al.) on sampled pairs, cosine distance")
    if d1:
        a, b, c = st.columns([1, 1, 2])
        a.metric("(1a) same class", charts.percent(d1.get("1a_fraction")),
                 help="share of same-class pairs with d(old_i, new_j) <= d(old_i, old_j)")
        b.metric("(1b) different class", charts.percent(d1.get("1b_fraction")),
                 help="share of different-class pairs with d(old_i, new_j) >= d(old_i, old_j)")
        c.caption(f"{d1.get('1a_pairs', 0)} same-class and {d1.get('1b_pairs', 0)} different-class pairs. A compatible "
                  "update keeps new features nearer to old features of their class than old features are to each "
                  "other (1a), and farther from other classes (1b).")
    else:
        st.caption("Needs old and new features of the same dimension.")

# ---- cross-model nearest neighbours: computed directly (one similarity row each), not a job
st.divider()
show_neighbours(url, experiment, versions, old, new, view)

# ---- neural collapse over every step
st.divider()
st.subheader("Geometry across all steps")
if one_text_per_class:
    st.caption("Not shown for a text comparison's qrels task: neural collapse, class drift and the stationarity probe "
               "are class-based, and each class is one text.")
geo = None if one_text_per_class else analysis_result(url, experiment, "geometry", {"view": view, "split": split},
                                                      what="the geometry across steps", button_key="geo_all_compute")
if geo is not None:
    g = geo["payload"]
    conv_all = state_convention(experiment["config"], views=view, retrieval=False, ecc=False,
                                extra=[f"{split} split", f"sampling seed {g.get('params', {}).get('seed', 0)}"])
    models = pd.DataFrame(g["models"])
    left, right = st.columns(2)
    if "nc1" in models and models["nc1"].notna().any():
        nc1 = models[["step", "nc1"]].dropna()
        left.altair_chart(chart := charts.with_convention(charts.steps_chart(
            nc1, "nc1", "NC1 (within-class variability) per step",
            log=bool(nc1["nc1"].max() > 50 * max(nc1["nc1"].min(), 1e-12))), conv_all, 60), width="stretch")
        with left:
            download_buttons(chart, "nc1_per_step", key="dl_nc1")
    pairs = pd.DataFrame(g["pairs"])
    if "mean_drift_seen" in pairs:
        drift = pairs.assign(step=pairs["new_step"])[["step", "mean_drift_seen"]].dropna()
        right.altair_chart(chart := charts.with_convention(charts.steps_chart(
            drift, "mean_drift_seen", "Mean drift cosine vs the previous step (old classes)"), conv_all, 60),
            width="stretch")
        with right:
            download_buttons(chart, "drift_per_step", key="dl_drift_steps")
    names_nc = {"step": "step", "classes": "classes", "n": "images", "nc1": "NC1", "nc2_equinorm": "NC2 (norms)",
                "nc2_equiangularity": "NC2 (angles)", "nc3": "NC3", "nc4": "NC4", "angle_mean": "mean angle (°)",
                "simplex_angle": "simplex angle (°)"}
    table = models[[c for c in names_nc if c in models]].rename(columns=names_nc)
    st.dataframe(table, hide_index=True, placeholder=MISSING, width="stretch",
                 column_config={c: st.column_config.NumberColumn(format="%.3f")
                                for c in table.columns if c not in ("step", "classes", "images")})
    if len(pairs):
        names_pair = {"old_step": "old step", "new_step": "new step", "mean_drift_seen": "drift (old classes)",
                      "mean_drift_all": "drift (all classes)", "1a_fraction": "Definition 1a",
                      "1b_fraction": "Definition 1b", "note": "note"}
        table = pairs[[c for c in names_pair if c in pairs]].rename(columns=names_pair)
        st.dataframe(table, hide_index=True, placeholder=MISSING, width="stretch", column_config={
            "drift (old classes)": st.column_config.NumberColumn(format="%.3f"),
            "drift (all classes)": st.column_config.NumberColumn(format="%.3f"),
            "Definition 1a": st.column_config.NumberColumn(format="percent"),
            "Definition 1b": st.column_config.NumberColumn(format="percent")})
    show_stationarity(g.get("stationarity", []), experiment["config"], split)
