"""Text renderings of compatibility matrices: terminal, CSV, Markdown and LaTeX (one source of truth).

Row t = query model, column k = gallery model. A cross-test that fails the empirical compatibility
criterion is marked (``*`` in text/Markdown, a red cell in LaTeX), as the papers shade them.
Values are printed in percent; NaN prints as ``-`` (above the diagonal) or ``n/c`` (not comparable).
CSV is data, not a picture of the table: one row per lower-triangle cell (``CSV_COLUMNS``), the value a plain
fraction, the ECC verdict and the paired verdict in their own columns, and metric / view / gallery kind named in
every row; a Recall@k cell also carries its ties (``tie_share``, the value under each tie reading and whether ties
decide its verdict, :mod:`engine.metrics.ties`; empty for other metrics and for matrices stored before).
With a stored paired test (``engine.metrics.paired``), each cross-test also carries its verdict:
✓ pass (ECC holds and the paired interval lies above 0), ✗ fail, ? unresolved (the interval
straddles 0), followed by the counts; with ``gain``, the update gain of each cross-test is listed.
"""
from __future__ import annotations

import csv
import io
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.core.kinds import STRICT
from engine.core.conventions import model_names, replaced_note
from engine.metrics import ecc_pass, summarize
from engine.metrics.gain import gain_cells, gain_text
from engine.metrics.over_seeds import ecc_gain
from engine.metrics.uncertainty import familywise_verdicts, t_interval
from engine.metrics.paired import SYMBOLS, count_verdicts
from engine.results.verdict_words import tie_lines

FORMATS = ("text", "csv", "markdown", "latex")
CSV_COLUMNS = ("query_model", "gallery_model", "query_step", "gallery_step", "cell", "value", "ecc_pass",
               "paired_verdict", "paired_lo", "paired_hi", "update_gain", "metric", "view", "gallery_kind", "eval_classes",
               "ecc_ties", "familywise", "paired_interval", "tie_share", "value_pessimistic", "value_expected",
               "value_optimistic", "ties_decide")


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


def gain_line(C: np.ndarray, names: Sequence[str]) -> str:
    """``update gain Γ: M2→M1 54.7 %, M3→M1 undefined (...)`` over the cross-tests (CoReS Eq. 3), Γ only where the
    new model beats the old one on its own by a point (``engine.metrics.gain``), else undefined with why."""
    return "update gain Γ: " + (gain_text(C, names) or "undefined (no cross-test)")


def render_matrix(C: np.ndarray, *, fmt: str = "text", title: str = "", comparable: np.ndarray | None = None,
                  ties: str = STRICT, names: Sequence[str] | None = None, paired: dict | None = None,
                  gain: np.ndarray | None = None, replaced: Sequence[int] = (), metric: str = "", view: str = "",
                  gallery_kind: str = "", eval_classes: str = "", tie_readings: dict | None = None) -> str:
    """One matrix with its AC / AA / ACA line in the chosen format (AA and ACA in percent; CSV: ``matrix_csv``).

    ``paired`` is a stored paired test (``stored_summary(...)["paired"]``): verdict symbols per cell and their
    counts; ``gain`` a T x T update-gain matrix, listed under the table; ``replaced`` the steps whose model was
    replaced (retrained from scratch here), marked in the default names and explained under the table;
    ``tie_readings`` a Recall@k matrix's stored ties (``summary["tie_readings"]``), its tied cells listed under it.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    T = C.shape[0]
    names = list(names) if names else model_names(T, replaced)
    if gain is not None:  # Γ from the matrix under one rule, whatever an older row stored
        gain = gain_cells(C)[0]
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
        for line in _extra_lines(paired, None if gain is None else C, names, replaced, tie_lines(tie_readings, names, metric or "recall@k")):
            out.write(line + "\n")
    elif fmt == "csv":
        out.write(matrix_csv(C, names=names, comparable=comparable, ties=ties, paired=paired, gain=gain, metric=metric,
                             view=view, gallery_kind=gallery_kind, eval_classes=eval_classes, tie_readings=tie_readings))
        if replaced:
            out.write(f"# {replaced_note(replaced)}\n")
    elif fmt == "markdown":
        if title:
            out.write(f"**{title}**\n\n")
        out.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
        for name, row in zip(names, cells):
            out.write("| " + " | ".join([name] + row) + " |\n")
        out.write(f"\n{summary} (* fails ECC)\n")
        for line in _extra_lines(paired, None if gain is None else C, names, replaced, tie_lines(tie_readings, names, metric or "recall@k")):
            out.write(f"\n{line}\n")
    else:
        out.write("% requires \\usepackage[table]{xcolor}\n\\begin{tabular}{l" + "r" * T + "}\n")
        out.write(" & ".join(["query $\\backslash$ gallery"] + names) + " \\\\\n\\hline\n")
        for name, row in zip(names, cells):
            tex = [("\\cellcolor{red!20}" + c.replace("*", "")) if "*" in c else c for c in row]
            out.write(" & ".join([name] + tex) + " \\\\\n")
        out.write("\\end{tabular}\n% " + summary + "\n")
        for line in _extra_lines(paired, None if gain is None else C, names, replaced, tie_lines(tie_readings, names, metric or "recall@k")):
            out.write(f"% {line}\n")
    return out.getvalue()


def matrix_rows(C: np.ndarray, *, names: Sequence[str], comparable: np.ndarray | None = None, ties: str = STRICT,
                paired: dict | None = None, gain: np.ndarray | Sequence | None = None, metric: str = "", view: str = "",
                gallery_kind: str = "", eval_classes: str = "", tie_readings: dict | None = None) -> list[dict]:
    """The lower triangle as rows of ``CSV_COLUMNS``: numbers as floats (None where undefined), ``cell`` = self /
    cross / n/c / undefined, ``ecc_pass`` True/False on defined cross-tests (None on the diagonal), ``update_gain``
    None where Γ is undefined (``engine.metrics.gain``: the new model not a point better on its own)."""
    ecc = ecc_pass(C, ties=ties)
    if gain is not None:
        gain = gain_cells(C)[0]
    rows = []
    for t in range(C.shape[0]):
        for k in range(t + 1):
            defined = not np.isnan(C[t, k])
            if not defined:
                cell = "n/c" if comparable is not None and not comparable[t, k] else "undefined"
            else:
                cell = "self" if t == k else "cross"
            g = None if gain is None else gain[t][k]
            rows.append({
                "query_model": names[t], "gallery_model": names[k], "query_step": t + 1, "gallery_step": k + 1,
                "cell": cell, "value": float(C[t, k]) if defined else None,
                "ecc_pass": bool(ecc[t, k]) if cell == "cross" else None,
                "paired_verdict": (paired["verdict"][t][k] or None) if paired and t != k else None,
                "paired_lo": paired["lo"][t][k] if paired and t != k else None,
                "paired_hi": paired["hi"][t][k] if paired and t != k else None,
                "update_gain": None if g is None or np.isnan(g) else float(g),
                "metric": metric, "view": view, "gallery_kind": gallery_kind, "eval_classes": eval_classes, "ecc_ties": ties,
                "familywise": _familywise(paired) if paired and t != k else None,
                "paired_interval": _cell_interval(paired, t, k) if paired and t != k else None,
                **_tie_columns(tie_readings, t, k),
            })
    return rows


def _tie_columns(tie_readings: dict | None, t: int, k: int) -> dict:
    """A Recall@k cell's ties as CSV columns (empty without stored tie readings or counts)."""
    if not tie_readings or tie_readings["tied"][t][k] is None:
        return {}
    decide = tie_readings.get("decide")
    return {"tie_share": tie_readings["share"][t][k], **{f"value_{r}": tie_readings[r][t][k] for r in tie_readings["readings"]},
            "ties_decide": decide[t][k] if decide and t != k else None}


def _familywise(paired: dict) -> str:
    """How the verdicts beside it were judged: ``none`` (each cell alone), ``holm`` or ``bonferroni``."""
    return paired.get("familywise") or "none"


def _cell_interval(paired: dict, t: int, k: int) -> str | None:
    """What cell (t, k)'s interval resampled: two-way / queries / unchanged (a matrix stored before: None)."""
    kinds = paired.get("interval")
    return kinds[t][k] if isinstance(kinds, list) else kinds


def seed_spread(values: Sequence[float | None]) -> dict:
    """Mean and sample standard deviation over seeds: ``{"mean", "std", "n"}`` (None where undefined; std None for
    one seed; None and NaN values are left out and not counted)."""
    v = np.array([np.nan if x is None else x for x in values], dtype=np.float64)
    v = v[~np.isnan(v)]
    return {"mean": float(v.mean()) if len(v) else None, "std": float(v.std(ddof=1)) if len(v) > 1 else None, "n": int(len(v))}


FORMULA_STARTS = ("=", "+", "-", "@")


def safe_cell(value: Any) -> Any:
    """A CSV cell a spreadsheet will not run: text starting with ``= + - @`` or a control character (tab, CR, ...)
    gets a leading ``'`` (OWASP's advice for CSV injection); numbers, booleans and other text are unchanged."""
    if isinstance(value, str) and value and (value.startswith(FORMULA_STARTS) or unicodedata.category(value[0]) == "Cc"):
        return "'" + value
    return value


def csv_text(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """Rows as CSV with a header line; None is an empty cell, floats keep full precision, text that a spreadsheet
    would read as a formula neutralised (:func:`safe_cell`)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[safe_cell(c) for c in columns], lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows([{safe_cell(c): ("" if r.get(c) is None else safe_cell(r[c])) for c in columns} for r in rows])
    return out.getvalue()


def matrix_csv(C: np.ndarray, *, names: Sequence[str], **labels: Any) -> str:
    """``matrix_rows`` as CSV (``pandas.read_csv`` reads ``value`` as float and ``ecc_pass`` as bool)."""
    return csv_text(matrix_rows(C, names=names, **labels), CSV_COLUMNS)


def _extra_lines(paired: dict | None, C: np.ndarray | None, names: Sequence[str], replaced: Sequence[int],
                 tie_words: Sequence[str] = ()) -> list[str]:
    return (([paired_line(paired)] if paired else []) + ([gain_line(C, names)] if C is not None else [])
            + ([replaced_note(replaced)] if replaced else []) + list(tie_words))


def _value(s: dict, key: str, scale: float) -> str:
    """``s[key]``, or ``mean ± std`` over seeds when ``s["spread"]`` has several."""
    spread = (s.get("spread") or {}).get(key)
    if spread and spread.get("n", 0) > 1 and spread.get("std") is not None:
        return f"{scale * spread['mean']:.2f} ± {scale * spread['std']:.2f}"
    return _fmt(None if s.get(key) is None else scale * s[key])


def _gain(s: dict) -> dict:
    """Γ of a summary row over the cells where ECC holds: the seeds' (``over_seeds``) or the row's own matrix."""
    if s.get("over_seeds"):
        return s["over_seeds"]["gain"]
    if s.get("matrix") is not None:
        return ecc_gain([s["matrix"]], ties=s.get("ties") or STRICT)
    return {"mean": None, "cells": 0, "why": "undefined: no matrix"}


def _mean_gain(s: dict) -> str:
    g = _gain(s)
    return "-" if g["mean"] is None else f"{100 * g['mean']:.1f}"


def _verdict_counts(s: dict) -> dict:
    """pass / fail / unresolved counts of a summary row: the verdicts of the means over seeds when it has them,
    re-judged family-wise when the row says so (``familywise``: holm / bonferroni)."""
    test = (s.get("over_seeds") or {}).get("verdicts") or s.get("paired")
    if not test:
        return {}
    family = s.get("familywise") or "none"
    return count_verdicts(familywise_verdicts(test, method=family) if family != "none" else test["verdict"])


SUMMARY_CSV_COLUMNS = ("method", "familywise", "AC", "AA", "ACA", "AC_std", "AA_std", "ACA_std", "seeds", "mean_update_gain",
                       "update_gain_why",
                       "paired_pass", "paired_fail", "paired_unresolved", "AC_ci_lo", "AC_ci_hi", "AA_ci_lo", "AA_ci_hi",
                       "ACA_ci_lo", "ACA_ci_hi", "AC_paired_lo", "AC_paired_hi")


def _seed_ci(spread: dict | None) -> tuple[float | None, float | None]:
    """The 95 % Student-t interval of a share's mean over seeds (AC, AA, ACA) from its ``{"mean", "std", "n"}``,
    clipped to [0, 1] (None for one seed)."""
    if not spread or spread.get("n", 0) < 2 or spread.get("std") is None:
        return None, None
    return t_interval(spread["mean"], spread["std"], spread["n"], bounds=(0.0, 1.0))


def _summary_record(name: str, s: dict) -> dict:
    """One row of the numeric summary CSV: fractions (AA, ACA and Γ not in percent), mean and sample std over
    seeds when several with their 95 % Student-t interval, verdict counts as integers and the range of AC they
    leave open; None where undefined."""
    spread = s.get("spread") or {}
    many = {key: spread.get(key) for key in ("AC", "AA", "ACA") if spread.get(key) and spread[key].get("n", 0) > 1}
    counts = _verdict_counts(s)
    return {"method": name, "familywise": s.get("familywise") or "none",
            **{key: many[key]["mean"] if key in many else s.get(key) for key in ("AC", "AA", "ACA")},
            **{f"{key}_std": many[key]["std"] if key in many else None for key in ("AC", "AA", "ACA")},
            "seeds": max((v["n"] for v in many.values()), default=1),
            "mean_update_gain": _gain(s)["mean"], "update_gain_why": _gain(s)["why"],
            **{f"paired_{v}": counts.get(v) for v in ("pass", "fail", "unresolved")},
            **{f"{key}_ci_{end}": value for key in ("AC", "AA", "ACA")
               for end, value in zip(("lo", "hi"), _seed_ci(spread.get(key)))},
            **dict(zip(("AC_paired_lo", "AC_paired_hi"), _paired_ac(counts)))}


def _paired_ac(counts: dict) -> tuple[float | None, float | None]:
    """AC from the sure passes only to every cross-test not a sure failure (``engine.metrics.uncertainty.ac_range``)."""
    n = sum(counts.values())
    if not n:
        return None, None
    return counts["pass"] / n, (counts["pass"] + counts["unresolved"]) / n


def _counts(s: dict) -> str:
    n = _verdict_counts(s)
    if not n:
        return "-"
    return "/".join(str(n[v]) for v in ("pass", "fail", "unresolved"))


def render_summary_table(rows: Sequence[tuple[str, dict]], *, fmt: str = "markdown") -> str:
    """Paper-style table: one row per method with AC, AA (%), ACA (%), the mean update gain Γ (%) over the
    cross-tests where ECC holds and the paired verdicts (✓/✗/? counts; with ``"over_seeds"``, the verdicts of each
    cross-test's mean over the seeds, :mod:`engine.metrics.over_seeds`). With ``"spread"`` over several seeds,
    AC/AA/ACA print as mean ± std (sample std). CSV is numeric (``SUMMARY_CSV_COLUMNS``, fractions, one value per cell)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt == "csv":
        return csv_text([_summary_record(name, s) for name, s in rows], SUMMARY_CSV_COLUMNS)
    body = [[name, _value(s, "AC", 1), _value(s, "AA", 100), _value(s, "ACA", 100), _mean_gain(s), _counts(s)]
            for name, s in rows]
    head = ["method", "AC", "AA", "ACA", "mean Γ", "✓/✗/?"]
    if fmt == "latex":
        tex_head = head[:4] + ["mean $\\Gamma$", "pass/fail/unres."]
        lines = ["\\begin{tabular}{lrrrrr}", " & ".join(tex_head) + " \\\\", "\\hline"]
        lines += [" & ".join(c.replace("±", "$\\pm$") for c in r) + " \\\\" for r in body] + ["\\end{tabular}"]
        return "\n".join(lines) + "\n"
    if fmt == "text":
        return "\n".join(f"{r[0]:<16}" + "".join(f"{c:>16}" for c in r[1:]) for r in [head] + body) + "\n"
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in body]) + "\n"
