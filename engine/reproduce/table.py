"""A claim's stored matrices read back per seed, an interval over seeds, and the verdict words.

The interval is one function of the per-seed values (:data:`Interval`; default
:func:`engine.metrics.uncertainty.seed_interval`, Student-t over seeds): a hierarchical seeds-then-items bootstrap
replaces it by passing ``interval=``. Words: a paper value is *inside* / *outside* our interval (*unresolved* with
fewer than two seeds); a margin *reproduces* when our interval sits on the paper's side of zero (holds zero for a
printed tie), *does not* when it sits on the other side, else *unresolved*; an AC reproduces when the paper's AC is
inside our interval (clipped to [0, 1]) and the negative control's mean AC is not (else unresolved: a printed
AC of 0 that the control shows too is no evidence), does not when
the paper's AC is outside.
The negative control (independent encoders) must fail: its AC interval must lie below the paper's AC.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine

from engine.metrics.summary import average_compatibility
from engine.metrics.uncertainty import seed_interval
from engine.reproduce.claims import CONTROL, Claim, PaperCell
from storage import load_matrices, session_scope

Interval = Callable[[Sequence[float | None]], dict]  # values per seed -> {"mean", "lo", "hi", "n"}


@dataclass(frozen=True)
class Row:
    """One printed row: the paper's value, ours per seed with its interval, and the words."""

    claim: str
    method: str
    label: str
    paper: float | None
    values: tuple[float | None, ...]
    interval: dict
    inside: str
    verdict: str


def seed_matrices(db: Engine, runs: dict[tuple[int, str], int], claim: Claim, method: str) -> list[np.ndarray]:
    """``method``'s stored matrix (the claim's metric, gallery, view and eval classes) of every finished seed."""
    conv = claim.our_convention
    gallery = "template" if conv["gallery"] == "template" else "instance"
    out = []
    with session_scope(db) as s:
        for (seed, m), exp_id in sorted(runs.items()):
            if m != method:
                continue
            rows = [r for r in load_matrices(s, exp_id, metric=conv["metric"], gallery_kind=gallery, view=claim.view(method))
                    if r.eval_classes == conv["eval_classes"]]
            if rows:
                out.append(np.asarray(rows[0].values, dtype=np.float64))
    return out


def cell_value(C: np.ndarray, cell: tuple[int, int] | None) -> float:
    """The margin ``C[t, k] - C[k, k]`` of cross-test ``cell``, or the matrix's AC (strict ECC) when None."""
    if cell is None:
        return average_compatibility(C)
    t, k = cell
    return float(C[t, k] - C[k, k])


def _clipped(iv: dict, cell: tuple[int, int] | None) -> dict:
    """An AC interval clipped to [0, 1] (AC is a fraction; a t-interval over few seeds runs past it)."""
    if cell is not None or iv["lo"] is None:
        return iv
    return {**iv, "lo": max(0.0, iv["lo"]), "hi": min(1.0, iv["hi"])}


def _inside(paper: float, iv: dict) -> str:
    if iv["lo"] is None:
        return "unresolved"
    return "inside" if iv["lo"] - 1e-12 <= paper <= iv["hi"] + 1e-12 else "outside"


def _verdict(cell: PaperCell, iv: dict, control_ac: float | None) -> str:
    if iv["lo"] is None:
        return "unresolved"
    if cell.cell is None:  # AC: the paper's value inside our interval, and the control's mean AC outside it
        if _inside(cell.value, iv) == "outside":
            return "does not"
        tells = control_ac is None or not iv["lo"] <= control_ac <= iv["hi"]  # a paper AC of 0 the control shows too
        return "reproduces" if tells else "unresolved"
    lo, hi = iv["lo"], iv["hi"]
    if cell.value > 0:
        return "reproduces" if lo > 0 else ("does not" if hi < 0 else "unresolved")
    if cell.value < 0:
        return "reproduces" if hi < 0 else ("does not" if lo > 0 else "unresolved")
    return "reproduces" if lo <= 0 <= hi else "does not"  # a printed tie: our interval must hold 0


def claim_rows(db: Engine, claim: Claim, runs: dict[tuple[int, str], int], *, interval: Interval = seed_interval) -> list[Row]:
    """The claim's rows, then the negative control's (its margins of the same cross-tests and its AC)."""
    rows = []
    control = seed_matrices(db, runs, claim, CONTROL)
    control_ac = interval(tuple(cell_value(C, None) for C in control))["mean"]
    for cell in claim.cells:
        values = tuple(cell_value(C, cell.cell) for C in seed_matrices(db, runs, claim, cell.method))
        iv = _clipped(interval(values), cell.cell)
        rows.append(Row(claim.name, cell.method, cell.label, cell.value, values, iv, _inside(cell.value, iv),
                        _verdict(cell, iv, control_ac)))
    ac_paper = max((c.value for c in claim.cells if c.cell is None), default=None)
    for cell in {c.cell: c for c in claim.cells}.values():
        values = tuple(cell_value(C, cell.cell) for C in control)
        iv = _clipped(interval(values), cell.cell)
        if iv["lo"] is None:
            word = "unresolved"
        elif cell.cell is None:
            word = "fails (as it must)" if ac_paper is None or iv["hi"] < ac_paper else "does not fail: the test cannot tell"
        else:
            word = "fails (as it must)" if iv["hi"] < 0 else "does not fail: the test cannot tell"
        rows.append(Row(claim.name, f"{CONTROL} (control)", cell.label if cell.cell else "AC", None, values, iv, "", word))
    return rows


def _num(v: float | None, points: bool) -> str:
    if v is None:
        return "-"
    return f"{100 * v:+.1f}" if points else f"{v:.2f}"


def _ours(row: Row) -> str:
    points = row.label != "AC"
    iv = row.interval
    if iv["mean"] is None:
        return "not run"
    span = f" [{_num(iv['lo'], points)}, {_num(iv['hi'], points)}]" if iv["lo"] is not None else " (one seed)"
    return f"{_num(iv['mean'], points)}{span} (n={iv['n']})"


def render(claim: Claim, rows: Sequence[Row], *, markdown: bool = False) -> str:
    """The claim's table: text (header with its conventions and deviations) or the README's Markdown rows."""
    conv = lambda c: ", ".join(f"{k} {v}" for k, v in c.items())  # noqa: E731
    if markdown:
        out = []
        for r in rows:
            paper = "-" if r.paper is None else _num(r.paper, r.label != "AC")
            out.append(f"| {claim.name} | {conv(claim.paper_convention)} | {r.method} {r.label} | {paper} | {_ours(r)} "
                       f"| {r.verdict}{f' ({r.inside})' if r.inside else ''} |")
        return "\n".join(out)
    lines = [f"{claim.name}: {claim.source}", f"  paper's convention: {conv(claim.paper_convention)}",
             f"  ours:               {conv(claim.our_convention)}"]
    lines += [f"  differs: {d}" for d in claim.differs]
    lines.append("  margins in points (cross - old self-test); 95 % interval over seeds")
    lines.append(f"  {'method':<24}{'cell':<22}{'paper':>8}  {'ours':<34}{'paper in ours':<15}verdict")
    for r in rows:
        paper = "" if r.paper is None else _num(r.paper, r.label != "AC")
        lines.append(f"  {r.method:<24}{r.label:<22}{paper:>8}  {_ours(r):<34}{r.inside:<15}{r.verdict}")
    return "\n".join(lines)


MARKDOWN_HEADER = ("| cell | paper's convention | row | paper | ours: mean [95 % interval over seeds] | verdict |\n"
                   "|---|---|---|---|---|---|")
