"""Learn: orthogonal vs affine vs lambda-orthogonal alignment of a 2-D source space onto a target (paper 004)."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from app.learn.common import class_colors, show_square, show_wide
from engine.learn.alignment import (
    MAPS,
    FittedMap,
    alignment_error,
    fit_maps,
    regulariser_curve,
    source_target,
)

TITLES = {"orthogonal": "Orthogonal B⊥", "affine": "Affine (λ = ∞)", "lambda-orthogonal": "λ-orthogonal B_λ"}


@st.cache_data(show_spinner="Fitting the three maps ...", max_entries=64)
def fit(classes: int, stretch: float, rotation: float, noise: float, lam: float, alpha: float, seed: int
        ) -> tuple[pd.DataFrame, dict[str, FittedMap]]:
    data = source_target(num_classes=classes, stretch=stretch, rotation_deg=rotation, noise=noise, seed=seed)
    source, target = data[["source_x", "source_y"]].to_numpy(), data[["target_x", "target_y"]].to_numpy()
    return data, fit_maps(source, target, data["label"].to_numpy(), lam=lam, alpha=alpha, seed=seed)


st.title("Orthogonal vs affine vs λ-orthogonal alignment")
st.markdown(
    "Paper 004 makes a new model compatible by mapping its features into the old model's space with a backward map B "
    "fitted on the same images (loss ‖B(new) − old‖²). A strictly **orthogonal** B is a rotation: it keeps the new "
    "space's geometry intact but cannot undo a stretch. A free **affine** B matches the old space best but bends the "
    "new one. The **λ-orthogonality** penalty σ(α(x − λ))·x on x = ‖WWᵀ − I‖_F lets the map move up to about λ away "
    "from orthogonal for free: slide λ from 0 (close to the rotation) to 2 (the affine map)."
)
st.caption("Paper 004, Sec. 3.2-3.3, Eqs. 2-6, Fig. 2 (the regulariser) and Fig. 3 (2-D MNIST toy, λ = 1). Fitted with "
           "engine.adapters.fit.fit_adapters (backward map only, full-batch Adam, 400 steps).")

controls, view = st.columns([1, 3.2], gap="large")
with controls:
    lam = st.slider("λ", 0.0, 3.0, 1.0, 0.1, key="al_lambda")
    alpha = st.select_slider("α (steepness)", [1.0, 5.0, 10.0, 20.0, 50.0], value=10.0, key="al_alpha",
                             help="Large α makes the penalty a step at x = λ (Fig. 2b); the paper does not state its α.")
    stretch = st.slider("Stretch of the new space", 0.0, 1.0, 0.6, 0.05, key="al_stretch",
                        help="The source is the target rotated and stretched by diag(1 + s, 1/(1 + s)).")
    rotation = st.slider("Rotation of the new space (degrees)", -180, 180, 60, 5, key="al_rotation")
    noise = st.slider("Noise", 0.0, 0.4, 0.15, 0.05, key="al_noise")
    classes = st.slider("Classes", 3, 8, 5, key="al_classes")
    seed = st.number_input("Seed", 0, 999, 0, key="al_seed")

data, fitted = fit(classes, stretch, float(rotation), noise, lam, alpha, int(seed))
data["class"] = data["label"].astype(str)
colors = class_colors()
extent = 1.1 * float(max(data[["source_x", "source_y", "target_x", "target_y"]].abs().max().max(),
                         *(abs(m.mapped).max() for m in fitted.values())))
sc = alt.Scale(domain=[-extent, extent])


def cloud(frame: pd.DataFrame, x: str, y: str, *, filled: bool, opacity: float, shape: str) -> alt.Chart:
    return alt.Chart(frame).mark_point(filled=filled, opacity=opacity, size=36, shape=shape).encode(
        x=alt.X(f"{x}:Q", scale=sc, title=None), y=alt.Y(f"{y}:Q", scale=sc, title=None),
        color=alt.Color("class:N", scale=colors, legend=None))


def scores(orthogonality: float, alignment: float, distortion: float) -> None:
    st.metric("‖WWᵀ − I‖_F", f"{orthogonality:.3f}", help="How far the map's matrix is from orthogonal.")
    st.metric("Alignment error", f"{alignment:.4f}", help="Mean ‖B(source_i) − target_i‖² over the points.")
    st.metric("Distance distortion", f"{100 * distortion:.1f}%",
              help="Mean relative change of the source's pairwise distances: 0% for an isometry.")


SIDE = 170  # every panel is square with the same domain, so rotations and stretches look like what they are
with view:
    source = data[["source_x", "source_y"]].to_numpy()
    target = data[["target_x", "target_y"]].to_numpy()
    cols = st.columns(4)
    with cols[0]:
        st.write("**Before: source ▲, target ○**")
        show_square(cloud(data, "target_x", "target_y", filled=False, opacity=0.5, shape="circle")
                    + cloud(data, "source_x", "source_y", filled=True, opacity=0.7, shape="triangle-up"), SIDE)
        scores(0.0, alignment_error(source, target), 0.0)
    for col, name in zip(cols[1:], MAPS):
        m = fitted[name]
        mapped = data.assign(mx=m.mapped[:, 0], my=m.mapped[:, 1])
        with col:
            st.write(f"**{TITLES[name]}**" + (f" (λ = {lam:g})" if name == "lambda-orthogonal" else ""))
            show_square(cloud(data, "target_x", "target_y", filled=False, opacity=0.35, shape="circle")
                        + cloud(mapped, "mx", "my", filled=True, opacity=0.75, shape="triangle-up"), SIDE)
            scores(m.orthogonality_error, m.alignment_error, m.distance_distortion)
    st.caption("Open circles: the target (old space). Filled triangles: the source (new space), before and after each "
               "map; colour is the class. 'Before' scores the identity map. The rotation keeps every distance (0% "
               "distortion) but cannot undo the stretch; the affine map aligns best by bending the source.")

left, right = st.columns([1.3, 1])
with left:
    st.write("**The fitted maps y = W x + b**")
    matrices = pd.DataFrame([{"map": TITLES[m.name], "w11": m.weight[0, 0], "w12": m.weight[0, 1],
                              "w21": m.weight[1, 0], "w22": m.weight[1, 1], "b1": m.bias[0], "b2": m.bias[1]}
                             for m in fitted.values()])
    st.dataframe(matrices, hide_index=True, width="stretch",
                 column_config={c: st.column_config.NumberColumn(format="%.4f") for c in matrices.columns[1:]})
with right:
    st.write("**The λ-orthogonality penalty (Fig. 2a)**")
    curve = regulariser_curve(lams=(lam,), alpha=alpha, x_max=max(3.0, 1.2 * fitted["affine"].orthogonality_error))
    reached = pd.DataFrame({"x": [fitted["lambda-orthogonal"].orthogonality_error]})
    show_wide(alt.Chart(curve).mark_line().encode(x=alt.X("x:Q", title="x = ‖WWᵀ − I‖_F"),
                                                  y=alt.Y("L_lambda:Q", title="L_λ(x)"))
              + alt.Chart(reached).mark_rule(color="#d62728", strokeDash=[4, 3]).encode(x="x:Q"), 200)
    st.caption("σ(α(x − λ))·x: almost free below λ, ≈ x above it. Red: where the λ-orthogonal map settled.")
