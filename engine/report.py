"""Text renderings of compatibility matrices: terminal, CSV, Markdown and LaTeX (one source of truth).

Row t = query model, column k = gallery model. A cross-test that fails the empirical compatibility
criterion is marked (``*`` in text/CSV/Markdown, a red cell in LaTeX), as the papers shade them.
Values are printed in percent; NaN prints as ``-`` (above the diagonal) or ``n/c`` (not comparable).
"""
from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from engine.metrics import ecc_pass, summarize

FORMATS = ("text", "csv", "markdown", "latex")


def _cells(C: np.ndarray, comparable: np.ndarray | None, ties: str) -> list[list[str]]:
    ecc = ecc_pass(C, ties=ties)
    T = C.shape[0]
    rows = []
    for t in range(T):
        row = []
        for k in range(T):
            if k > t:
                row.append("-")
            elif np.isnan(C[t, k]):
                row.append("n/c" if comparable is not None and not comparable[t, k] else "-")
            else:
                mark = "*" if ecc[t, k] == 0 else ""
                row.append(f"{100 * C[t, k]:.2f}{mark}")
        rows.append(row)
    return rows


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def render_matrix(C: np.ndarray, *, fmt: str = "text", title: str = "", comparable: np.ndarray | None = None,
                  ties: str = "fail", names: Sequence[str] | None = None) -> str:
    """One matrix with its AC / AA / ACA line in the chosen format (AA and ACA in percent)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    T = C.shape[0]
    names = list(names) if names else [f"M{t + 1}" for t in range(T)]
    cells = _cells(C, comparable, ties)
    s = summarize(C, ties=ties)
    summary = (f"AC={_fmt(s['AC'])}  AA={_fmt(None if s['AA'] is None else 100 * s['AA'])}  "
               f"ACA={_fmt(None if s['ACA'] is None else 100 * s['ACA'])}")
    head = ["query \\ gallery"] + names
    out = io.StringIO()
    if fmt == "text":
        width = max(8, *(len(c) for row in cells for c in row), *(len(n) for n in names))
        if title:
            out.write(f"{title}\n")
        out.write(f"{head[0]:<16}" + "".join(f"{n:>{width + 1}}" for n in names) + "\n")
        for name, row in zip(names, cells):
            out.write(f"{name:<16}" + "".join(f"{c:>{width + 1}}" for c in row) + "\n")
        out.write(f"{summary}   (* = fails ECC: cross-test <= gallery model's self-test)\n")
    elif fmt == "csv":
        out.write(",".join(head) + "\n")
        for name, row in zip(names, cells):
            out.write(",".join([name] + row) + "\n")
    elif fmt == "markdown":
        if title:
            out.write(f"**{title}**\n\n")
        out.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
        for name, row in zip(names, cells):
            out.write("| " + " | ".join([name] + row) + " |\n")
        out.write(f"\n{summary} (* fails ECC)\n")
    else:
        out.write("% requires \\usepackage[table]{xcolor}\n\\begin{tabular}{l" + "r" * T + "}\n")
        out.write(" & ".join(["query $\\backslash$ gallery"] + names) + " \\\\\n\\hline\n")
        for name, row in zip(names, cells):
            tex = [("\\cellcolor{red!20}" + c[:-1]) if c.endswith("*") else c for c in row]
            out.write(" & ".join([name] + tex) + " \\\\\n")
        out.write("\\end{tabular}\n% " + summary + "\n")
    return out.getvalue()


def render_summary_table(rows: Sequence[tuple[str, dict]], *, fmt: str = "markdown") -> str:
    """Paper-style table: one row per method with AC, AA (%) and ACA (%)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    body = [[name, _fmt(s.get("AC")), _fmt(None if s.get("AA") is None else 100 * s["AA"]),
             _fmt(None if s.get("ACA") is None else 100 * s["ACA"])] for name, s in rows]
    head = ["method", "AC", "AA", "ACA"]
    if fmt == "csv":
        return "\n".join(",".join(r) for r in [head] + body) + "\n"
    if fmt == "latex":
        lines = ["\\begin{tabular}{lrrr}", " & ".join(head) + " \\\\", "\\hline"]
        lines += [" & ".join(r) + " \\\\" for r in body] + ["\\end{tabular}"]
        return "\n".join(lines) + "\n"
    if fmt == "text":
        return "\n".join(f"{r[0]:<16}{r[1]:>8}{r[2]:>8}{r[3]:>8}" for r in [head] + body) + "\n"
    return "\n".join(["| " + " | ".join(head) + " |", "|---|---|---|---|"] + ["| " + " | ".join(r) + " |" for r in body]) + "\n"
