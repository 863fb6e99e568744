"""The release report of a stored upgrade check as a download button (``engine.upgrade.release_report``, torch-free).

The page already holds the stored report and plan; the HTML is built when the button is pressed (its charts import
vl-convert then), from the same function ``check-upgrade --report`` writes with, so the file is the same report.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import streamlit as st

from engine.read.verdicts import report_context, report_data, report_html

STORED = ("this report was built from a stored check; check-upgrade --model ... --report measures the new model's "
          "embedding time")


def report_bytes(plan: Mapping[str, Any] | None, report: Mapping[str, Any], inputs: Mapping[str, Any],
                 notes: Sequence[str] = ()) -> bytes:
    """The HTML release report of a stored check (``plan`` None: stored before plans existed)."""
    context = report_context(inputs=inputs, notes=notes, throughput_note=STORED)
    return report_html(report_data(plan, report, context)).encode()


def report_button(plan: Mapping[str, Any] | None, report: Mapping[str, Any], *, inputs: Mapping[str, Any],
                  notes: Sequence[str] = (), key: str) -> None:
    """A "Download the release report (HTML)" button; nothing is rendered until it is pressed."""
    st.download_button("Download the release report (HTML)", lambda: report_bytes(plan, report, inputs, notes),
                       file_name="upgrade-report.html", mime="text/html", on_click="ignore", key=key,
                       icon=":material/summarize:", help="One self-contained HTML file for a release ticket: the "
                       "decision first, the inputs, the rule, each number with its interval, the cost of each option "
                       "and the curves (opens offline)")
