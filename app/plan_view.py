"""The migration plan the engine stored with an upgrade check (``engine.upgrade.migration``), shown as it was stored."""
from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app.widgets import MISSING, plain
from engine.upgrade.words import interval, pct


def plan_section(plan: dict[str, Any] | None, level: float, *, key: str = "up_plan") -> None:
    """The decision, the items to re-embed, the threshold re-mapped, the adapters, numbers and notes, a Markdown file."""
    st.subheader("Migration plan")
    if plan is None:
        st.caption("This check was stored before migration plans existed; run it again to get one "
                   "(or run check-upgrade ... --plan OUT).")
        return
    if "error" in plan:
        st.warning(plain(f"No migration plan for this pair: {plan['error']}"))
        return
    st.info(plain(f"Decision: {plan['headline']}. {plan['reason']}"), icon=":material/route:")  # the verdict keeps its colour
    k = st.columns(3)
    k[0].metric("Items to re-embed", f"{plan['items_to_reembed']:,}", f"of {plan['n_gallery']:,}", delta_color="off",
                delta_arrow="off")
    t = plan.get("threshold")
    if t:
        k[1].metric(plain(f"Similarity threshold under {plan['old_name']}"), f"{t['t_old']:.4g}",
                    f"precision {pct(t['precision'])}", delta_color="off", delta_arrow="off")
        k[2].metric(plain(f"Same precision under {plan['new_name']}"), "none" if t["t_new"] is None else f"{t['t_new']:.4g}",
                    None if t["t_new"] is None else f"precision {pct(t['precision_new'])}", delta_color="off",
                    delta_arrow="off")
    if plan["adapters"]:
        old = plan["old_name"]
        st.dataframe(pd.DataFrame([{"adapter": a["name"], "pairs fitted on": a.get("pairs"),
                                    f"adapted → {old} %": None if a["adapted_old"] is None else 100 * a["adapted_old"],
                                    f"{old} alone %": None if a["old_old"] is None else 100 * a["old_old"],
                                    "interval of the gain": interval(a["compatibility"], level),
                                    "verdict": a["compatibility"]["verdict"]} for a in plan["adapters"]]),
                     hide_index=True, placeholder=MISSING)
    st.markdown(plain("\n".join(f"- {what}: {value}" for what, value in plan["numbers"].items())))
    for note in plan["notes"]:
        st.caption(plain(note))
    st.download_button("Download the plan (Markdown)", plan["markdown"], file_name="migration-plan.md",
                       mime="text/markdown", on_click="ignore", key=f"{key}_download")
