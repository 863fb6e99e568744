"""Learn: Definition 1 by hand - every pair inequality of two toy models, next to the empirical criterion."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from app.learn.common import BOTTOM, class_colors, show_square
from engine.learn.definition1 import definition1_demo, two_model_clusters

PRESETS = {  # name -> slider values; each one makes a point the text below refers to
    "ECC passes, pairs fail": dict(d1_classes=4, d1_per_class=8, d1_spread_old=0.6, d1_spread_new=0.3, d1_drift=0,
                                   d1_shared=0.5),
    "Identical models": dict(d1_classes=4, d1_per_class=8, d1_spread_old=0.4, d1_spread_new=0.4, d1_drift=0,
                             d1_shared=1.0),
    "The new model drifts": dict(d1_classes=4, d1_per_class=8, d1_spread_old=0.6, d1_spread_new=0.3, d1_drift=40,
                                 d1_shared=0.5),
}
DEFAULTS = PRESETS["ECC passes, pairs fail"]
for key, value in DEFAULTS.items():
    st.session_state.setdefault(key, value)


def apply_preset(name: str) -> None:
    st.session_state.update(PRESETS[name])


st.title("Definition 1, by hand")
st.markdown(
    "Definition 1 asks **every pair** of images to behave: a new-model feature must be at least as close to an "
    "old feature of its own class as the old model's own features are **(1a)**, and at least as far from the "
    "other classes **(1b)**. The empirical compatibility criterion (ECC) only asks that retrieval with new queries "
    "against the old gallery beats the old model's own retrieval. Try the presets: ECC can pass while hundreds of "
    "pairs break Definition 1, and two identical models satisfy every pair yet fail ECC, which is strict."
)
st.caption("Paper 000, Def. 1 and Eq. 7 · paper 001, Def. 1 and Eq. 6 · paper 002, Eqs. 1-2 (after Shen et al. 2020). "
           "The papers disagree on the reference of (1b): papers 001/002 compare with the old model, paper 000 "
           "writes the new one; the toggle switches between them.")

controls, view = st.columns([1, 2.6], gap="large")
with controls:
    st.write("**Presets**")
    for name in PRESETS:
        st.button(name, on_click=apply_preset, args=(name,), key=f"d1_preset_{name}", width="stretch")
    st.slider("Classes", 2, 5, key="d1_classes")
    st.slider("Images per class", 3, 10, key="d1_per_class")
    st.slider("Old model spread", 0.0, 1.0, step=0.05, key="d1_spread_old",
              help="Standard deviation of the old model's features around their class centre.")
    st.slider("New model spread", 0.0, 1.0, step=0.05, key="d1_spread_new")
    st.slider("New model drift (degrees)", -90, 90, step=5, key="d1_drift",
              help="The new model puts every class centre this many degrees further round the circle.")
    st.slider("Shared error between models", 0.0, 1.0, step=0.1, key="d1_shared",
              help="Correlation of an image's noise in the two models: 1 = the new model makes the old model's "
                   "error (scaled), 0 = independent errors.")
    distance = st.radio("Distance d", ["cosine", "euclidean"], horizontal=True, key="d1_distance",
                        help="Recall@1 always ranks by cosine similarity, as in the papers.")
    new_reference = st.toggle("(1b) vs the new model", key="d1_reference_new",
                              help="Off: d(h_i^k, h_j^t) >= d(h_i^k, h_j^k) (papers 001/002). "
                                   "On: d(h_i^k, h_j^t) >= d(h_i^t, h_j^t) (paper 000).")
    seed = st.number_input("Seed", 0, 999, 0, key="d1_seed")

points = two_model_clusters(
    num_classes=st.session_state.d1_classes, per_class=st.session_state.d1_per_class,
    spread_old=st.session_state.d1_spread_old, spread_new=st.session_state.d1_spread_new,
    drift_deg=st.session_state.d1_drift, shared_noise=st.session_state.d1_shared, seed=int(seed),
)
demo = definition1_demo(points, distance=distance, reference_1b="new" if new_reference else "old")
counts, ecc = demo.counts, demo.ecc

with view:
    row = st.columns(3)
    row[0].metric("(1a) violated pairs", f"{counts['1a_violated']} / {counts['1a_pairs']}",
                  help="Ordered same-class pairs (i, j), i != j, with d(h_i^k, h_j^t) > d(h_i^k, h_j^k).")
    row[1].metric("(1b) violated pairs", f"{counts['1b_violated']} / {counts['1b_pairs']}",
                  help="Ordered different-class pairs whose cross distance is smaller than the reference.")
    holds = counts["1a_violated"] == 0 and counts["1b_violated"] == 0
    row[2].metric("Definition 1 (all pairs)", "holds" if holds else "fails")
    row = st.columns(3)
    row[0].metric("Self-test R@1 (old → old)", f"{ecc['old_self']:.3f}",
                  help="Recall@1 of the old model's queries against its own gallery (cosine, leave-one-out).")
    row[1].metric("Cross-test R@1 (new → old)", f"{ecc['cross']:.3f}", delta=f"{ecc['cross'] - ecc['old_self']:+.3f}",
                  help="Recall@1 of the new model's queries against the old gallery (cosine, leave-one-out).")
    row[2].metric("ECC: cross-test > self-test", "passes" if ecc["passes"] else "fails")
    st.caption("Which classes count: both toy models know every class shown, so the classes the old model learned "
               "(eval_classes = seen) and all of them coincide; in a class-incremental run they differ, and a cross-test "
               "on all classes also scores classes the old gallery model never learned.")

    show = st.radio("Draw the violated pairs of", ["(1a) same class", "(1b) different class", "nothing"],
                    horizontal=True, key="d1_show")
    options = ["every image"] + [f"image {i}" for i in points["image"]]
    if st.session_state.get("d1_focus") not in options:  # fewer images than before: back to all of them
        st.session_state["d1_focus"] = "every image"
    focus = st.selectbox("Only for old image i", options,
                         key="d1_focus", help="Lines go from the old feature of image i to the new feature of image j.")

    long = pd.concat([
        points.assign(model="old model k", x=points["old_x"], y=points["old_y"]),
        points.assign(model="new model t", x=points["new_x"], y=points["new_y"]),
    ])[["image", "label", "model", "x", "y"]]
    long["label"] = long["label"].astype(str)
    wanted = {"(1a) same class": "1a", "(1b) different class": "1b"}.get(show)  # None: draw nothing
    pairs = demo.pairs[~demo.pairs["holds"] & (demo.pairs["inequality"] == wanted)]
    if focus != "every image":
        pairs = pairs[pairs["i"] == int(focus.split()[1])]
    old_xy, new_xy = points[["old_x", "old_y"]].to_numpy(), points[["new_x", "new_y"]].to_numpy()
    ref_xy = new_xy if new_reference and show.startswith("(1b)") else old_xy
    i, j = pairs["i"].to_numpy(), pairs["j"].to_numpy()
    lines = pd.DataFrame({
        "x": old_xy[i, 0], "y": old_xy[i, 1], "x2": new_xy[j, 0], "y2": new_xy[j, 1],
        "pair": [f"({a}, {b})" for a, b in zip(i, j)], "cross": pairs["cross"].to_numpy(),
        "reference": pairs["reference"].to_numpy(),
    })
    references = pd.DataFrame({"x": ref_xy[i, 0], "y": ref_xy[i, 1], "x2": ref_xy[j, 0], "y2": ref_xy[j, 1]})
    extent = float(max(long["x"].abs().max(), long["y"].abs().max(), 1.0)) * 1.1
    scale = alt.Scale(domain=[-extent, extent])
    layers = [
        alt.Chart(pd.DataFrame({"x": [0.0], "y": [0.0]})).mark_point(shape="cross", size=150, color="black").encode(
            x=alt.X("x:Q", scale=scale, title=None), y=alt.Y("y:Q", scale=scale, title=None)),
        alt.Chart(lines).mark_rule(color="#333333", opacity=0.45 if focus == "every image" else 0.9,
                                   strokeWidth=1.2).encode(
            x="x:Q", y="y:Q", x2="x2", y2="y2",
            tooltip=["pair", alt.Tooltip("cross:Q", format=".3f", title="d(h_i^k, h_j^t)"),
                     alt.Tooltip("reference:Q", format=".3f", title="reference distance")]),
    ]
    if focus != "every image":  # one image: also draw the reference side of each violated inequality
        layers.append(alt.Chart(references).mark_rule(color="#888888", strokeDash=[5, 4], strokeWidth=1.5).encode(
            x="x:Q", y="y:Q", x2="x2", y2="y2"))
    layers.append(alt.Chart(long).mark_point(size=90, filled=True, opacity=0.85).encode(
        x="x:Q", y="y:Q",
        color=alt.Color("label:N", title="class", scale=class_colors(5, "set2"), legend=BOTTOM),
        shape=alt.Shape("model:N", title="feature", legend=BOTTOM,
                        scale=alt.Scale(domain=["old model k", "new model t"], range=["circle", "triangle-up"])),
        tooltip=["image", "label", "model"]))
    show_square(alt.layer(*layers), 460)
    side = "the new model's own pair (new i → new j)" if ref_xy is new_xy else "the old model's own pair (old i → old j)"
    st.caption(f"{len(lines)} violated pair{'s' if len(lines) != 1 else ''} drawn: solid lines join the old feature of "
               "image i to the new feature of image j (the cross distance)"
               + (f"; dashed lines are the reference, {side}" if focus != "every image" else
                  "; pick one image above to see the reference side too")
               + ". Circles: old model, triangles: new model, colour: class, +: the origin (with cosine distance "
               "only the direction from it counts).")
    with st.expander("The violated pairs as numbers"):
        st.dataframe(pairs.rename(columns={"cross": "d(h_i^k, h_j^t)", "reference": "reference distance"}).head(200),
                     hide_index=True, width="stretch")
