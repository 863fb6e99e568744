"""A computed matrix as the CLIs print it: the table with each cross-test's paired verdict, then every verdict in
check-upgrade's words and intervals (``evaluate`` and ``compare-checkpoints`` call this one function)."""
from __future__ import annotations

from typing import Any

from engine.core.kinds import STRICT
from engine.metrics.compatibility import MatrixResult, stored_summary
from engine.results.report import render_matrix
from engine.results.verdict_words import cell_verdict_lines


def matrix_text(result: MatrixResult, name: str, /, *, title: str, ties: str = STRICT, names: list[str] | None = None,
                fmt: str = "text", **labels: Any) -> str:
    """Metric ``name``'s matrix of ``result`` in ``fmt``, its paired verdicts judged under the ECC tie rule ``ties`` as
    they are stored (:func:`engine.metrics.compatibility.stored_summary`); in text, one line per cross-test after it."""
    C = result.values[name]
    summary = stored_summary(result, name, ties=ties)
    paired, readings = summary.get("paired"), summary.get("tie_readings")
    text = render_matrix(C, fmt=fmt, title=title, comparable=result.comparable, ties=ties, names=names, paired=paired,
                         tie_readings=readings, **({"metric": name} | labels))
    if fmt == "text" and paired:
        text += "".join(f"{line}\n" for line in cell_verdict_lines(paired, names or [f"M{t + 1}" for t in range(C.shape[0])],
                                                                    readings))
    return text
