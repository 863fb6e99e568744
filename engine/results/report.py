"""Text renderings of compatibility matrices: terminal, CSV, Markdown and LaTeX (one source of truth).

Row t = query model, column k = gallery model. A cross-test that fails the empirical compatibility
criterion is marked (``*`` in text/CSV/Markdown, a red cell in LaTeX), as the papers shade them.
Values are printed in percent; NaN prints as ``-`` (above the diagonal) or ``n/c`` (not comparable).
With a stored paired test (``engine.metrics.paired``), each cross-test also carries its verdict:
✓ pass (ECC holds and the paired interval lies above 0), ✗ fail, ? unresolved (the interval
straddles 0), followed by the counts; with ``gain``, the update gain of each cross-test is listed.
"""
from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from engine.results.conventions import model_names, replaced_note
from engine.metrics import ecc_pass, summarize
from engine.metrics.paired import SYMBOLS, count_verdicts

FORMATS = ("text", "csv", "markdown", "latex")


_LATEX_SYMBOLS = {"pass": "$\\checkmark$", "fail": "$\\times$", "unresolved": "?"}


def _cells(C: np.ndarray, comparable: np.ndarray | None, ties: str, verdicts: list | None = None,
           latex: bool = False) -> list[list[str]]:
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
                v = verdicts[t][k] if verdicts else None
                symbol = f" {(_LATEX_SYMBOLS if latex else SYMBOLS)[v]}" if v else ""
                mark = "*" if ecc[t, k] == 0 else ""
                row.append(f"{100 * C[t, k]:.2f}{mark}{symbol}")
        rows.append(row)
    return rows


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def paired_line(paired: dict) -> str:
    """``paired test (95 % bootstrap interval, 1000 resamples, seed 0): 2 ✓ pass, 1 ✗ fail, 0 ? unresolved``."""
    n = count_verdicts(paired["verdict"])
    return (f"paired test ({100 * paired['confidence']:g} % bootstrap interval over {paired.get('items', 'queries')}, "
            f"{paired['resamples']} resamples, seed {paired['seed']}): "
            + ", ".join(f"{n[v]} {SYMBOLS[v]} {v}" for v in ("pass", "fail", "unresolved")))


def gain_line(gain: np.ndarray, names: Sequence[str]) -> str:
    """``update gain Γ (%): M2→M1 54.7, ...`` over the defined cross-tests (CoReS Eq. 3)."""
    T = gain.shape[0]
    parts = [f"{names[t]}→{names[k]} {100 * gain[t, k]:.1f}" for t in range(T) for k in range(t) if not np.isnan(gain[t, k])]
    return "update gain Γ (%): " + (", ".join(parts) if parts else "undefined")


def render_matrix(C: np.ndarray, *, fmt: str = "text", title: str = "", comparable: np.ndarray | None = None,
                  ties: str = "fail", names: Sequence[str] | None = None, paired: dict | None = None,
                  gain: np.ndarray | None = None, replaced: Sequence[int] = ()) -> str:
    """One matrix with its AC / AA / ACA line in the chosen format (AA and ACA in percent).

    ``paired`` is a stored paired test (``stored_summary(...)["paired"]``): verdict symbols per cell and their
    counts; ``gain`` a T x T update-gain matrix, listed under the table; ``replaced`` the steps whose model was
    replaced (retrained from scratch here), marked in the default names and explained under the table.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    T = C.shape[0]
    names = list(names) if names else model_names(T, replaced)
    cells = _cells(C, comparable, ties, paired["verdict"] if paired else None, latex=fmt == "latex")
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
        for line in _extra_lines(paired, gain, names, replaced):
            out.write(line + "\n")
    elif fmt == "csv":
        out.write(",".join(head) + "\n")
        for name, row in zip(names, cells):
            out.write(",".join([name] + row) + "\n")
        if replaced:
            out.write(f"# {replaced_note(replaced)}\n")
    elif fmt == "markdown":
        if title:
            out.write(f"**{title}**\n\n")
        out.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
        for name, row in zip(names, cells):
            out.write("| " + " | ".join([name] + row) + " |\n")
        out.write(f"\n{summary} (* fails ECC)\n")
        for line in _extra_lines(paired, gain, names, replaced):
            out.write(f"\n{line}\n")
    else:
        out.write("% requires \\usepackage[table]{xcolor}\n\\begin{tabular}{l" + "r" * T + "}\n")
        out.write(" & ".join(["query $\\backslash$ gallery"] + names) + " \\\\\n\\hline\n")
        for name, row in zip(names, cells):
            tex = [("\\cellcolor{red!20}" + c.replace("*", "")) if "*" in c else c for c in row]
            out.write(" & ".join([name] + tex) + " \\\\\n")
        out.write("\\end{tabular}\n% " + summary + "\n")
        for line in _extra_lines(paired, gain, names, replaced):
            out.write(f"% {line}\n")
    return out.getvalue()


def _extra_lines(paired: dict | None, gain: np.ndarray | None, names: Sequence[str], replaced: Sequence[int]) -> list[str]:
    return (([paired_line(paired)] if paired else []) + ([gain_line(gain, names)] if gain is not None else [])
            + ([replaced_note(replaced)] if replaced else []))


def _value(s: dict, key: str, scale: float) -> str:
    """``s[key]``, or ``mean ± std`` over seeds when ``s["spread"]`` has several."""
    spread = (s.get("spread") or {}).get(key)
    if spread and spread.get("n", 0) > 1 and spread.get("std") is not None:
        return f"{scale * spread['mean']:.2f} ± {scale * spread['std']:.2f}"
    return _fmt(None if s.get(key) is None else scale * s[key])


def _mean_gain(s: dict) -> str:
    g = s.get("update_gain")
    if not g:
        return "-"
    vals = np.array([[np.nan if v is None else v for v in row] for row in g], dtype=np.float64)
    vals = vals[~np.isnan(vals)]
    return f"{100 * vals.mean():.1f}" if len(vals) else "-"


def _counts(s: dict) -> str:
    p = s.get("paired")
    if not p:
        return "-"
    n = count_verdicts(p["verdict"])
    return "/".join(str(n[v]) for v in ("pass", "fail", "unresolved"))


def render_summary_table(rows: Sequence[tuple[str, dict]], *, fmt: str = "markdown") -> str:
    """Paper-style table: one row per method with AC, AA (%), ACA (%), the mean update gain Γ (%) over the
    cross-tests and the paired verdicts (✓/✗/? counts). With ``"spread"`` over several seeds, AC/AA/ACA
    print as mean ± std (sample std)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    body = [[name, _value(s, "AC", 1), _value(s, "AA", 100), _value(s, "ACA", 100), _mean_gain(s), _counts(s)]
            for name, s in rows]
    head = ["method", "AC", "AA", "ACA", "mean Γ", "✓/✗/?"]
    if fmt == "csv":
        return "\n".join(",".join(r) for r in [head] + body) + "\n"
    if fmt == "latex":
        tex_head = head[:4] + ["mean $\\Gamma$", "pass/fail/unres."]
        lines = ["\\begin{tabular}{lrrrrr}", " & ".join(tex_head) + " \\\\", "\\hline"]
        lines += [" & ".join(c.replace("±", "$\\pm$") for c in r) + " \\\\" for r in body] + ["\\end{tabular}"]
        return "\n".join(lines) + "\n"
    if fmt == "text":
        return "\n".join(f"{r[0]:<16}" + "".join(f"{c:>16}" for c in r[1:]) for r in [head] + body) + "\n"
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in body]) + "\n"
