"""The decision the engine stored with an upgrade check (``engine.upgrade.plan``), shown as it was stored: the page
re-derives nothing, it prints the one decision function's output."""
from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app.widgets import MISSING, plain
from engine.read.verdicts import forecast_line, interval, option_line, pct, recovery_line

PERCENT = st.column_config.NumberColumn(format="%.1f")


def decision_box(plan: dict[str, Any] | None) -> None:
    """The decision in one box, right under the verdict (the details are in :func:`plan_section`)."""
    if plan and "headline" in plan:
        st.info(plain(f"Decision: {plan['headline']}. {plan['reason']}"), icon=":material/route:")


def _adapters(plan: dict[str, Any], level: float) -> None:
    """The adapters' table: adapted -> old, its interval and verdict, and recovery against its ceiling."""
    old, new = plan["old_name"], plan["new_name"]
    recovery = {r["name"]: r for r in plan.get("recovery") or ()}
    rows = []
    for a in plan["adapters"]:
        r = recovery.get(a["name"], {})
        rows.append({"adapter": a["name"], "pairs fitted on": a.get("pairs"),
                     f"adapted → {old} %": None if a["adapted_old"] is None else 100 * a["adapted_old"],
                     f"{old} alone %": None if a["old_old"] is None else 100 * a["old_old"],
                     "interval of the gain": interval(a["compatibility"], level), "verdict": a["compatibility"]["verdict"],
                     f"share of {new}/{new} %": None if r.get("share_of_new_new") is None else 100 * r["share_of_new_new"],
                     f"share of {old}/{old} %": None if r.get("share_of_old_old") is None else 100 * r["share_of_old_old"],
                     "label-free %": None if r.get("label_free") is None else 100 * r["label_free"]})
    table = pd.DataFrame(rows).dropna(axis=1, how="all")
    st.dataframe(table, hide_index=True, placeholder=MISSING,
                 column_config={c: PERCENT for c in table.columns if c.endswith("%")})
    ceiling = next((r["ceiling"] for r in recovery.values() if r.get("ceiling") is not None), None)
    if ceiling is not None:
        st.caption(plain(f"Ceiling of a query-side adapter: {pct(ceiling)} of a full re-embedding ({old}/{old} ÷ "
                         f"{new}/{new}, known before any fit): the adapter makes {new}'s queries imitate {old} on "
                         f"{old}'s gallery. Share of {new}/{new} is recovery against a re-embedding, share of "
                         f"{old}/{old} against today's system; label-free is agreement with {new}'s own neighbours, "
                         "the reading adapter papers quote."))
    for r in recovery.values():
        if r.get("at_ceiling"):
            st.caption(plain(recovery_line(r, old, new)))


def _options(plan: dict[str, Any]) -> None:
    """The remedies side by side as the engine stored them: the one the decision took first-marked, verdict and
    interval, the model inference the rule ranks over the plan's horizon, one-time and per-query cost."""
    q = plan.get("queries")  # plans stored before the horizon have none
    over = f"embedded over {q:,} queries" if q else "embedded over the horizon"
    rows = [{"": "✓" if o.get("recommended") else "", "remedy": o["remedy"], "option": o["name"],
             "verdict": o["verdict"], "interval": MISSING if o["lo"] is None else interval(o, o["level"]),
             over: o.get("embeddings_at_horizon"), "embedded once": o["one_time"]["embeddings"],
             "embedded / query": o["per_query"]["embeddings"], "rewritten once": o["one_time"]["vectors"],
             "maps / query": o["per_query"]["vectors"]} for o in plan["options"]]
    horizon = f"{q:,} queries served" if q else "the plan's horizon"
    st.markdown(f"**Remedies side by side**: ✓ the cheapest that passes over {horizon} (model inference first, then "
                "stored vectors rewritten, then maps per query; `check-upgrade --expected-queries` sets the horizon)")
    st.dataframe(pd.DataFrame(rows), hide_index=True, placeholder=MISSING)
    with st.expander("Each option in words"):
        for o in plan["options"]:
            st.caption(plain(option_line(o, picked=bool(o.get("recommended")))))


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
    decision_box(plan)  # the verdict keeps its colour
    if plan.get("rule"):
        st.caption(plain(f"Rule: {plan['rule']}. Success: {plan['new_name']} alone vs {plan['old_name']} alone "
                         f"({plan.get('success')}); guardrail: {plan['new_name']}'s queries on {plan['old_name']}'s "
                         f"gallery vs {plan['old_name']} alone ({plan.get('guardrail')})."))
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
    if plan.get("forecast"):  # read before any adapter was fitted; the table below is what the fit recovered
        st.caption(plain("Forecast before fitting: " + forecast_line(plan["forecast"], plan["old_name"], plan["new_name"])))
    if plan.get("options"):  # plans stored before issue 42 have none
        _options(plan)
    if plan["adapters"]:
        _adapters(plan, level)
    st.markdown("\n".join(f"- {plain(what)}: {plain(value)}" for what, value in plan["numbers"].items()))
    for note in plan["notes"]:
        st.caption(plain(note))
    st.download_button("Download the plan (Markdown)", plan["markdown"], file_name="migration-plan.md",
                       mime="text/markdown", on_click="ignore", key=f"{key}_download")
