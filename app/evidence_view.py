"""How often is the upgrade decision wrong? The evidence base's summary (``docs/evidence/summary.json`` and its operating
curve, written by ``bench/bench_evidence.py``) shown as stored: the page formats, it computes nothing."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import streamlit as st

SUMMARY = Path(__file__).resolve().parents[1] / "docs" / "evidence" / "summary.json"
FIGURE = SUMMARY.with_name("operating_curve.png")
MAX_BYTES = 4 << 20  # the committed summary is far smaller


def load_summary(path: Path = SUMMARY) -> dict[str, Any] | None:
    """The stored summary, or None when it is absent, too large or not a JSON object."""
    try:
        if path.stat().st_size > MAX_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def rate_words(r: dict[str, Any] | None, *, lower: bool = False) -> str:
    """``0.4 % (2/480; at most 1.3 %)``: a stored error rate with its 95 % upper bound, or an agreement with its lower
    one (``lower``: ``at least``; a summary stored before lower bounds shows none); ``–`` without draws."""
    if not r or not r.get("n"):
        return "–"
    if lower:
        bound = f"; at least {100 * r['lower']:.1f} %" if r.get("lower") is not None else ""
        return f"{100 * r['rate']:.1f} % ({r['k']}/{r['n']}{bound})"
    return f"{100 * r['rate']:.1f} % ({r['k']}/{r['n']}; at most {100 * r['upper']:.1f} %)"


def decision_rows(summary: dict[str, Any]) -> list[dict[str, str]]:
    """One row per sample size, then all draws: agreement with the whole corpus (and when both decide, alone and with a
    costlier remedy), false ship (and against a whole corpus that decides), false block, too close to call, a costlier
    remedy than needed and other disagreements."""
    parts = [(f"{100 * float(f):g} % of the queries", f, r) for f, r in summary["per_fraction"].items()]
    decided = summary.get("truth_decided", {})
    return [{"sample": label, "draws": str(r["draws"]), "agrees with the whole corpus": rate_words(r["agree"], lower=True),
             "agrees, when both decide": rate_words(r.get("agree_when_both_decide"), lower=True),
             "agrees or pays more, when both decide": rate_words(r.get("agree_or_costlier_when_both_decide"),
                                                                 lower=True),
             "false ship": rate_words(r["false_ship"]),
             "false ship, whole corpus decided": rate_words(decided.get(f, {}).get("false_ship")),
             "false block": rate_words(r["false_block"]),
             "too close to call": rate_words(r["too_close"]), "a costlier remedy": rate_words(r.get("costlier")),
             "other disagreement": rate_words(r["other"])}
            for label, f, r in [*parts, ("all", "all", summary["overall"])]]


def gap_rows(summary: dict[str, Any], reading: str = "guardrail") -> list[dict[str, str]]:
    """The verdict's error and too-close rates per bin of the true gap (points), one row per sample size."""
    out = []
    for f, rows in summary["bins"][reading].items():
        row = {"sample": f"{100 * float(f):g} %"}
        for b in rows:
            row[f"{b['bin']} pts off 0"] = ("–" if not b["draws"] else
                                           f"wrong {rate_words(b['error'])}; too close {100 * b['too_close']['rate']:.0f} %")
        out.append(row)
    return out


def markdown_table(rows: list[dict[str, str]]) -> str:
    """Rows of text as a Markdown table (a static summary: no dataframe widget to sort or resize)."""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r[h].replace("|", "/") for h in head) + " |" for r in rows])


def evidence_expander(path: Path = SUMMARY) -> None:
    """The expander "How often is this verdict wrong?" with the stored tables and picture (nothing when absent)."""
    summary = load_summary(path)
    if summary is None:
        return
    meta = summary.get("meta", {})
    with st.expander("How often is this verdict wrong?"):
        st.markdown(f"Measured on **{summary['runs']} real upgrades** (ordered pairs of text and image models, "
                    f"{len(summary.get('corpora', []))} corpora): each decided on the whole corpus (the truth), then "
                    f"from {summary['draws']} random samples of 1 %, 5 % and 10 % of the queries. A *false ship* is a "
                    "sampled \"ship\" where the whole corpus does not ship; a *false block* a sampled \"do not ship\" "
                    "where it ships or backfills; *a costlier remedy* a safe but dearer decision (an adapter where "
                    "shipping as is would do, a corpus transform or a backfill where an adapter would). Each error rate carries its one-sided "
                    "95 % upper bound, each agreement its lower one (Clopper-Pearson).")
        st.markdown(markdown_table(decision_rows(summary)))
        st.caption("The compatibility verdict (new queries on the old gallery vs the old model alone) by how far the "
                   "whole corpus's difference lies from 0 (points, either side):")
        st.markdown(markdown_table(gap_rows(summary)))
        figure = path.with_name(FIGURE.name)
        if figure.is_file():
            st.image(str(figure), caption="Operating curves: the share of draws given each verdict against the true "
                     "gap on the whole corpus, per sample size (top: compatibility, bottom: new model alone). Near 0 "
                     "the sampled check says too close to call; the smaller the sample, the wider that band.")
        st.caption(f"{meta.get('command', '')} · {meta.get('machine', '')} · {meta.get('seconds', 0) / 60:.0f} min, "
                   f"load average {meta.get('load_average_start', ['?'])[0]} at the start · "
                   f"{len(summary.get('disagreements', []))} disagreements outside too close to call, each listed in "
                   "docs/evidence/summary.json")
