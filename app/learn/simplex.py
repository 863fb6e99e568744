"""Learn: the probability simplex - softmax outputs, the centring projection, and a class added later (paper 000)."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from app.learn.common import BOTTOM, class_colors, show_square
from engine.learn.simplex import TRIANGLE, orthogonality_table, prototype_table, prototype_xy, simplex_points

CLASS_COLORS = class_colors(6)

st.title("The probability simplex")
st.markdown(
    "A classifier's softmax output is a point of the probability simplex, here the triangle of a 3-class model: "
    "the more confident the model, the closer its points sit to the corners. PSP turns it into a feature by "
    "**centring** it with $P = I - J/C$ (which moves the triangle's centre to the origin) and **normalising** it, so "
    "every feature lands on a circle around the class prototypes $v_y = e_y - \\tfrac{1}{C}\\mathbf{1}$. When a later "
    "model knows more classes, $P_{t,k} = [P_{k,k} \\mid 0]$ keeps the old classes' outputs and centres them: the new "
    "model's prototypes land exactly on the old ones, so its features can be compared with the old gallery."
)
st.caption("Paper 000, Def. 2 and Eqs. 2-5, Props. 1-2 (Appendices A-B), Figs. 1-2.")

controls, left, right = st.columns([0.9, 1.5, 1.5], gap="medium")
with controls:
    confidence = st.slider("Model confidence (logit margin)", 0.0, 8.0, 3.0, 0.5, key="sx_confidence",
                           help="Logits = confidence × one-hot(class) + noise.")
    noise = st.slider("Logit noise", 0.0, 3.0, 1.0, 0.1, key="sx_noise")
    new_classes = st.slider("Classes of the new model C^t", 3, 6, 4, key="sx_new_classes",
                            help="The old model knows classes 0-2; the new one also knows 3 .. C^t - 1.")
    per_class = st.slider("Points per class", 10, 80, 40, 10, key="sx_per_class")
    show_new = st.toggle("Show the new model", value=True, key="sx_show_new")

points = simplex_points(new_classes=new_classes, per_class=per_class, confidence=confidence, noise=noise)
points["class"] = points["label"].astype(str)
old = points[points["model"] == "old"]

with left:
    st.write("**Softmax outputs of the old 3-class model** (barycentric view)")
    corners = pd.DataFrame({"x": TRIANGLE[:, 0], "y": TRIANGLE[:, 1], "class": ["0", "1", "2"],
                            "name": ["e_0 = (1, 0, 0)", "e_1 = (0, 1, 0)", "e_2 = (0, 0, 1)"]})
    outline = pd.DataFrame({"x": np.r_[TRIANGLE[:, 0], TRIANGLE[0, 0]], "y": np.r_[TRIANGLE[:, 1], TRIANGLE[0, 1]],
                            "order": range(4)})
    centre = pd.DataFrame({"x": [0.5], "y": [np.sqrt(3) / 6], "name": ["o = (1/3, 1/3, 1/3)"]})
    tri_scale_x, tri_scale_y = alt.Scale(domain=[-0.1, 1.1]), alt.Scale(domain=[-0.12, 0.98])
    tri = (
        alt.Chart(outline).mark_line(color="gray").encode(x=alt.X("x:Q", scale=tri_scale_x, axis=None),
                                                          y=alt.Y("y:Q", scale=tri_scale_y, axis=None), order="order")
        + alt.Chart(old).mark_circle(size=35, opacity=0.7).encode(
            x="bx:Q", y="by:Q", color=alt.Color("class:N", scale=CLASS_COLORS),
            tooltip=[alt.Tooltip("p0:Q", format=".2f"), alt.Tooltip("p1:Q", format=".2f"), alt.Tooltip("p2:Q", format=".2f")])
        + alt.Chart(corners[corners["y"] < 0.5]).mark_text(dy=14, fontSize=12).encode(
            x="x:Q", y="y:Q", text="name", color=alt.Color("class:N", scale=CLASS_COLORS, legend=None))
        + alt.Chart(corners[corners["y"] > 0.5]).mark_text(dy=-12, fontSize=12).encode(
            x="x:Q", y="y:Q", text="name", color=alt.Color("class:N", scale=CLASS_COLORS, legend=None))
        + alt.Chart(centre).mark_point(shape="cross", size=120, color="black").encode(x="x:Q", y="y:Q", tooltip="name")
    )
    show_square(tri, 300)
    st.caption("Each corner is a one-hot label e_y; the cross is the centre o. Centring subtracts o.")

with right:
    st.write("**PSP features: centred (P = I − J/3) and normalised**")
    shown = points if show_new else old
    protos = prototype_xy(3).assign(x0=0.0, y0=0.0)
    protos["class"] = protos["label"].astype(str)
    circle = pd.DataFrame({"a": np.linspace(0, 2 * np.pi, 121)})
    circle["x"], circle["y"], circle["order"] = np.cos(circle["a"]), np.sin(circle["a"]), range(len(circle))
    sc = alt.Scale(domain=[-1.25, 1.25])
    markers = alt.Scale(domain=["old", "new"], range=["circle", "triangle-up"])
    psp = (
        alt.Chart(circle).mark_line(color="lightgray").encode(x=alt.X("x:Q", scale=sc, axis=None),
                                                              y=alt.Y("y:Q", scale=sc, axis=None), order="order")
        + alt.Chart(protos).mark_rule(strokeWidth=3).encode(x="x0:Q", y="y0:Q", x2="px", y2="py",
                                                            color=alt.Color("class:N", scale=CLASS_COLORS))
        + alt.Chart(shown).mark_point(size=45, opacity=0.6, filled=True).encode(
            x=alt.X("px:Q", scale=sc), y=alt.Y("py:Q", scale=sc),
            color=alt.Color("class:N", scale=CLASS_COLORS, title="class", legend=BOTTOM),
            shape=alt.Shape("model:N", scale=markers, title="model", legend=BOTTOM), tooltip=["model", "class"])
    )
    show_square(psp, 300)
    st.caption(f"Thick lines: the prototypes v_y/‖v_y‖. Triangles: the {new_classes}-class model's outputs after "
               f"P_{{{new_classes},3}} (keep the first 3 entries, centre, normalise). Its classes 0-2 land on the old "
               "prototypes; a class the old model never saw has no direction of its own there, which is why a "
               "cross-test is judged on the classes the old model learned (eval_classes = seen).")

st.subheader(f"Adding classes: the {new_classes}-class prototypes seen by the 3-class model")
table = prototype_table(new_classes, 3)
ortho = orthogonality_table(new_classes, 3)
m = st.columns(3)
m[0].metric("Prop. 2: $\\max_y |P_{t,k} v_y^t - v_y^k|$", f"{table['max |P_tk v_y^t - v_y^k|'].max():.1e}",
            help="Largest entry-wise difference over the old classes y = 0, 1, 2: zero up to rounding.")
m[1].metric("Prop. 1: $\\max |\\cos(v_c^t, [v_y^k, 0])|$", f"{ortho['cos(v_c^t, [v_y^k, 0])'].abs().max():.1e}",
            help="Every added class's prototype is orthogonal to every zero-padded old prototype.")
m[2].metric("$\\|v_y^t\\|$ vs $\\|v_y^k\\|$", f"{np.sqrt((new_classes - 1) / new_classes):.3f} vs {np.sqrt(2 / 3):.3f}",
            help="sqrt((C-1)/C): the prototypes themselves change with C, yet their projections coincide.")
st.dataframe(table, hide_index=True, width="stretch", column_config={
    "max |P_tk v_y^t - v_y^k|": st.column_config.NumberColumn(format="%.1e")})
st.caption("v_y^t is the new prototype e_y − (1/C^t)·1 in R^{C^t}; P_{t,k} keeps its first 3 entries and "
           "centres them, which gives back v_y^k = e_y − (1/3)·1 exactly.")
