"""Learn: caps and expectations - paper 001's Monte-Carlo check of Definition 1 on shrinking hyperspherical caps."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from app.learn.common import BOTTOM, show_square, show_wide
from engine.learn.caps import (
    cap_expectations,
    distances_vs_dimension,
    distances_vs_shrink,
    prototype_pair,
    sample_cap,
)

DIMS = [2, 3, 4, 8, 16, 32, 64, 128, 256, 512]
COLORS = {"E[D_kt]": "#d62728", "E[D_kk]": "#1f77b4", "E[D_tt]": "#2ca02c"}
QUANTITY_COLORS = alt.Scale(domain=list(COLORS), range=list(COLORS.values()))
SIGN_WORDS = {"<= 0": "≤ 0", ">= 0": "≥ 0"}
NAMES = {"1a": "(1a)", "1b_old": "(1b), old ref.", "1b_new": "(1b), new ref."}


@st.cache_data(show_spinner="Monte-Carlo ...", max_entries=64)
def expectations(dim: int, theta_old: float, theta_new: float, samples: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    return cap_expectations(dim=dim, theta_old_deg=theta_old, theta_new_deg=theta_new, samples=samples, seed=seed)


@st.cache_data(show_spinner="Monte-Carlo across dimensions ...", max_entries=32)
def across_dimensions(theta_old: float, theta_new: float, seed: int) -> pd.DataFrame:
    return distances_vs_dimension(DIMS, theta_old_deg=theta_old, theta_new_deg=theta_new, samples=2000, seed=seed)


st.title("Caps and expectations")
st.markdown(
    "Paper 001 pictures each class's features as spread uniformly over a **cap** of the unit hypersphere around the "
    "class's fixed d-Simplex prototype, and a model update as that cap **shrinking** (θ_t ≤ θ_k). Definition 1 is then "
    "checked *in expectation* by Monte-Carlo: with cosine distance D, same-class pairs across models must be closer "
    "than old-old pairs, E[D_kt] ≤ E[D_kk] **(1a)**, and different-class pairs farther, E[D_kt] ≥ E[D_kk] **(1b)**. "
    "Measured against the new model instead (paper 000's wording of (1b), E[D_kt] ≥ E[D_tt]), shrinking caps make "
    "(1b) fail: new-new pairs of different classes end up even farther apart."
)
st.caption("Paper 001, Theorem 1 and Appendix A (Monte-Carlo check, Fig. 12; assumptions A1-A3); the appendix prints the "
           "different-class line with '≤', a typo for (1b)'s '≥'. Closed form: E[1 − a·b] = 1 − m_a m_b cos α, as in "
           "paper 000's Eq. 11, with m(θ, d) the mean cosine of a uniform cap and cos α = −1/d between two simplex "
           "vertices.")

controls, view = st.columns([1, 2.6], gap="large")
with controls:
    dim = st.select_slider("Dimension d", DIMS, value=16, key="caps_dim")
    theta_old = st.slider("Old cap angle θ_k (degrees)", 5, 90, 40, key="caps_theta_old")
    theta_new = st.slider("New cap angle θ_t (degrees)", 0, 90, 20, key="caps_theta_new")
    samples = st.select_slider("Monte-Carlo samples", [2000, 5000, 20000], value=20000, key="caps_samples")
    seed = st.number_input("Seed", 0, 999, 0, key="caps_seed")
    if theta_new > theta_old:
        st.warning("θ_t > θ_k: the new cap is larger, against assumption A3 of the theorem; (1a) and (1b) reverse.")

distances, checks = expectations(dim, float(theta_old), float(theta_new), int(samples), int(seed))

with view:
    cols = st.columns(3)
    for col, row in zip(cols, checks.itertuples()):
        verdict = "holds" if row.holds_mc else "fails"
        if not row.resolved:
            verdict += " (within noise)"
        col.metric(f"{NAMES[row.inequality]}: E[D_kt] − {row.reference}", f"{row.monte_carlo:+.4f}",
                   help=f"Monte-Carlo mean of the paired difference; must be {SIGN_WORDS[row.wanted]}. "
                        f"Standard error {row.std_error:.4f}; closed form {row.closed_form:+.4f}.")
        col.metric(f"{NAMES[row.inequality]} in expectation", verdict)
    if not checks["resolved"].all():
        st.info("'within noise': |difference| < 2 standard errors, so this Monte-Carlo cannot tell the sign. The "
                "different-class gap shrinks like 1/d: in high dimension it needs many more samples. The closed form "
                "(hover over the '?') still decides.")

    table = distances.assign(difference=distances["monte_carlo"] - distances["closed_form"]).rename(columns={
        "monte_carlo": "Monte-Carlo", "std_error": "std. error", "closed_form": "closed form",
        "difference": "MC − closed form"})
    st.dataframe(table, hide_index=True, width="stretch", column_config={
        c: st.column_config.NumberColumn(format="%.4f") for c in table.columns[2:]})

    shrink = distances_vs_shrink(dim=dim, theta_old_deg=float(theta_old))
    now = pd.DataFrame({"theta_new_deg": [float(theta_new)]})
    for col, case in zip(st.columns(2), ("same class", "different class")):
        data = shrink[shrink["case"] == case]
        lines = alt.Chart(data).mark_line(point=True).encode(
            x=alt.X("theta_new_deg:Q", title="new cap angle θ_t (degrees)", scale=alt.Scale(reverse=True)),
            y=alt.Y("value:Q", title="expected cosine distance", scale=alt.Scale(zero=False)),
            color=alt.Color("quantity:N", scale=QUANTITY_COLORS, title=None, legend=BOTTOM),
            tooltip=["quantity", alt.Tooltip("value:Q", format=".4f"), "theta_new_deg"])
        marker = alt.Chart(now).mark_rule(strokeDash=[4, 4], color="gray").encode(x="theta_new_deg:Q")
        with col:
            st.write(f"**{case.capitalize()}**, as the new cap shrinks")
            show_wide(lines + marker, 240)
    st.caption("Closed form, read right to left: the new cap shrinks from θ_k to a point (dashed: your θ_t). Same class: "
               "E[D_kt] (red) falls below E[D_kk] (blue) at once. Different class: E[D_kt] rises above E[D_kk] but "
               "stays below E[D_tt] (green), so (1b) against the new model fails.")

with st.expander("Fig. 12: the Monte-Carlo across dimensions (2,000 samples per point)", expanded=False):
    across = across_dimensions(float(theta_old), float(theta_new), int(seed))
    if not st.toggle("Also show E[D_tt]", key="caps_show_tt"):
        across = across[across["quantity"] != "E[D_tt]"]
    shown = [q for q in COLORS if q in set(across["quantity"])]
    for col, case in zip(st.columns(2), ("same class", "different class")):
        data = across[across["case"] == case]
        with col:
            st.write(f"**{case.capitalize()}**")
            show_wide(alt.Chart(data).mark_line(point=True).encode(
                x=alt.X("dim:Q", scale=alt.Scale(type="log", base=2), title="dimension d"),
                y=alt.Y("monte_carlo:Q", scale=alt.Scale(zero=False), title="Monte-Carlo E[D]"),
                color=alt.Color("quantity:N", title=None, legend=BOTTOM, scale=alt.Scale(
                    domain=shown, range=[COLORS[q] for q in shown])),
                tooltip=["dim", "quantity", alt.Tooltip("monte_carlo:Q", format=".4f")]), 220)

with st.expander("What a cap looks like in 2-D (d = 2: caps are arcs of the circle)", expanded=False):
    w0, w1 = prototype_pair(2)
    rng = np.random.default_rng(int(seed))
    frames = []
    for name, w in (("class y", w0), ("class y'", w1)):
        for model, theta in (("old (θ_k)", theta_old), ("new (θ_t)", theta_new)):
            xy = sample_cap(w, np.deg2rad(theta), 80, rng)
            radius = 1.0 if model.startswith("old") else 1.08  # draw the new cap just outside the old one
            frames.append(pd.DataFrame({"x": radius * xy[:, 0], "y": radius * xy[:, 1], "class": name, "model": model}))
    arcs = pd.concat(frames)
    protos = pd.DataFrame({"x0": 0.0, "y0": 0.0, "x": [w0[0], w1[0]], "y": [w0[1], w1[1]], "class": ["class y", "class y'"]})
    pair_colors = alt.Scale(domain=["class y", "class y'"], range=["#4c78a8", "#f58518"])
    circle = pd.DataFrame({"a": np.linspace(0, 2 * np.pi, 121)})
    circle["x"], circle["y"], circle["order"] = np.cos(circle["a"]), np.sin(circle["a"]), range(len(circle))
    sc = alt.Scale(domain=[-1.3, 1.3])
    pic = (alt.Chart(circle).mark_line(color="lightgray").encode(x=alt.X("x:Q", scale=sc, axis=None),
                                                                 y=alt.Y("y:Q", scale=sc, axis=None), order="order")
           + alt.Chart(protos).mark_rule(strokeWidth=2).encode(x="x0:Q", y="y0:Q", x2="x", y2="y",
                                                               color=alt.Color("class:N", scale=pair_colors))
           + alt.Chart(arcs).mark_point(filled=True, size=30, opacity=0.6).encode(
               x="x:Q", y="y:Q", color=alt.Color("class:N", title=None, legend=BOTTOM, scale=pair_colors),
               shape=alt.Shape("model:N", scale=alt.Scale(range=["triangle-up", "circle"]), title=None, legend=BOTTOM)))
    show_square(pic, 340)
    st.caption("Two of the three d-Simplex prototypes of the plane (lines, 120° apart, cos = −1/2). Old features "
               "(circles) spread over ±θ_k around their prototype, new ones (triangles, drawn slightly outside the "
               "circle) over ±θ_t.")
