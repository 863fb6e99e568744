"""A claim's stored matrices read back per seed, an interval over seeds and items, and the verdict words.

The interval (:data:`INTERVALS`): by default the hierarchical bootstrap (:mod:`engine.metrics.hierarchical`): the
seeds resampled, then each drawn seed's test queries (verification: its images, each pair counted once per
combination of its two images' copies, so pairs that share an image stay together), the per-item outcomes recomputed
from the stored features (:mod:`engine.reproduce.outcomes`); ``seeds``: Student's t over the per-seed values
(:func:`engine.metrics.uncertainty.seed_interval`), also where the outcomes cannot be recomputed (no stored features,
or features that no longer give the stored matrix; the row says so). Fewer than two seeds: no interval (the seeds'
spread is unknown). Words: a paper value is *inside* / *outside* our interval (*unresolved* with
fewer than two seeds); a margin *reproduces* when our interval sits on the paper's side of zero, *does not* when
it sits on the other side, else *unresolved* (a printed tie: reproduces when our interval lies within +/- 1 point,
the rounding of two-decimal scores, does not when it lies outside that band); an AC reproduces when the paper's AC is
inside our interval (clipped to [0, 1]) and the negative control's mean AC is not (else unresolved: a printed
AC of 0 that the control shows too is no evidence), does not when
the paper's AC is outside.
The negative control (independent encoders) must fail: its AC interval must lie below the paper's AC.

A claim's :class:`~engine.reproduce.claims.Reading` s follow its own rows: the same cells and words under other eval
classes, or on one part of each cell's items, recomputed from the stored features. Every row carries its method's
training accuracy (each model's top-1 on its stored training images, mean and minimum over the models and seeds), and
every margin row (and an AC row of two models: its one cross-test) the upgrade's own gain behind it (:func:`engine.reproduce.outcomes.own_gain`: the newer model's
self-test minus the old one's on the same items, Student's t over seeds) beside the paper's: a margin the paper reads
as compatible presumes a newer model that is better at the evaluation, and the table says when ours is not. Every
method's rows also carry how far its features move from the first model to the second
(:func:`engine.reproduce.outcomes.same_image_cosines`: the same image's old and new features, on the test queries and
on the old classes' training images), the measured reason a margin fails when the upgrade itself is better.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine

from engine.metrics.hierarchical import SeedItems, ac_statistic, hierarchical_bootstrap, margin_statistic
from engine.metrics.summary import average_compatibility
from engine.metrics.uncertainty import seed_interval
from engine.reproduce.claims import CONTROL, Claim, PaperCell, Reading
from storage import load_matrices, session_scope

RESAMPLES = 1000
INTERVALS = {  # --interval: what the 95 % interval resamples (said in the table's header)
    "hierarchical": "hierarchical bootstrap over seeds, then each seed's test queries (pairs: their images)",
    "seeds": "Student-t over the seeds' values",
}
DEFAULT_INTERVAL = "hierarchical"


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
    interval_kind: str = "seeds"  # the INTERVALS key the row's interval is (hierarchical falls back to seeds)
    note: str | None = None  # why a hierarchical interval fell back to seeds only
    reading: Reading | None = None  # None: the claim's own convention
    training: dict | None = None  # the method's training accuracy: {"mean", "min", "n"} over models and seeds
    gain: dict | None = None  # a margin's own gain M(t, t) - M(k, k) over seeds: {"mean", "lo", "hi", "n"}
    paper_gain: float | None = None  # the paper's, where it prints both self-tests
    drift: dict | None = None  # same-image cosine, first to second model, mean over seeds: {"test", "trained", "n"}


@dataclass(frozen=True)
class SeedRuns:
    """One method's finished seeds under one convention: the stored matrices and, for the hierarchical interval, each
    seed's per-item outcomes (``items`` None: seeds only, ``why`` says why when it was not asked)."""

    matrices: tuple[np.ndarray, ...]
    items: tuple[SeedItems, ...] | None = None
    why: str | None = None


def seed_runs(db: Engine, experiments: Sequence[tuple[int, np.ndarray]], *, view: str, metric: str, gallery: str,
              eval_classes: str, interval: str = DEFAULT_INTERVAL) -> SeedRuns:
    """``experiments``' stored matrices (``(experiment id, matrix)`` per seed) with their per-item outcomes recomputed
    from the stored features when ``interval`` is hierarchical and the recomputed cells give the stored matrix."""
    if interval not in INTERVALS:
        raise ValueError(f"unknown interval {interval!r}; use one of {', '.join(INTERVALS)}")
    matrices = tuple(C for _, C in experiments)
    if interval == "seeds" or len(experiments) < 2:
        return SeedRuns(matrices)
    from engine.reproduce.outcomes import seed_items  # here: the table (and the CLI that imports it) loads no torch

    items = []
    for exp_id, C in experiments:
        try:
            got, again = seed_items(db, exp_id, view=view, metric=metric, gallery=gallery, eval_classes=eval_classes)
        except (ValueError, LookupError, OSError) as exc:
            return SeedRuns(matrices, None, f"experiment {exp_id}'s per-item outcomes cannot be recomputed ({exc})")
        if again.shape != C.shape or not np.allclose(again, C, atol=1e-9, equal_nan=True):
            return SeedRuns(matrices, None, f"experiment {exp_id}'s stored features no longer give its stored matrix")
        items.append(got)
    return SeedRuns(matrices, tuple(items))


def cell_interval(cell: tuple[int, int] | None, runs: SeedRuns, *, resamples: int = RESAMPLES) -> tuple[tuple, dict, str]:
    """``(values per seed, interval, kind)`` of a margin (``cell`` = (t, k)) or of AC (None) over ``runs``: the
    hierarchical bootstrap when ``runs`` has per-item outcomes (seeded by the cell), else Student's t over seeds."""
    values = tuple(cell_value(C, cell) for C in runs.matrices)
    if runs.items is None:
        return values, seed_interval(values), "seeds"
    T = runs.matrices[0].shape[0]
    stat = ac_statistic(T) if cell is None else margin_statistic(T, *cell)
    got = hierarchical_bootstrap(list(runs.items), stat, resamples=resamples, seed=(0,) if cell is None else (0, *cell))
    ok = not (np.isnan(got.lo) or np.isnan(got.hi))
    iv = {"mean": float(np.mean(values)), "lo": got.lo if ok else None, "hi": got.hi if ok else None, "n": len(values)}
    return values, iv, "hierarchical"


def seed_matrices(db: Engine, runs: dict[tuple[int, str], int], claim: Claim, method: str) -> list[tuple[int, np.ndarray]]:
    """``(experiment id, stored matrix)`` of ``method``'s every finished seed (the claim's metric, gallery, view and
    eval classes)."""
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
                out.append((exp_id, np.asarray(rows[0].values, dtype=np.float64)))
    return out


def method_runs(db: Engine, runs: dict[tuple[int, str], int], claim: Claim, method: str, *,
                interval: str = DEFAULT_INTERVAL, reading: Reading | None = None) -> SeedRuns:
    """:func:`seed_runs` of ``method`` under the claim's own convention, or :func:`reading_runs` under ``reading``."""
    conv = claim.our_convention
    gallery = "template" if conv["gallery"] == "template" else "instance"
    if reading is not None:
        ids = [exp_id for (seed, m), exp_id in sorted(runs.items()) if m == method]
        return reading_runs(db, ids, view=claim.view(method), metric=conv["metric"], gallery=gallery, reading=reading,
                            interval=interval)
    return seed_runs(db, seed_matrices(db, runs, claim, method), view=claim.view(method), metric=conv["metric"],
                     gallery=gallery, eval_classes=conv["eval_classes"], interval=interval)


def reading_runs(db: Engine, experiment_ids: Sequence[int], *, view: str, metric: str, gallery: str, reading: Reading,
                 interval: str = DEFAULT_INTERVAL) -> SeedRuns:
    """The experiments' matrices and per-item outcomes under ``reading``, recomputed from their stored features (a
    reading has no stored matrix of its own); no matrices, and ``why``, when one cannot be recomputed."""
    if interval not in INTERVALS:
        raise ValueError(f"unknown interval {interval!r}; use one of {', '.join(INTERVALS)}")
    from engine.reproduce.outcomes import seed_items  # here: the table loads no torch

    items, matrices = [], []
    for exp_id in experiment_ids:
        try:
            got, C = seed_items(db, exp_id, view=view, metric=metric, gallery=gallery, eval_classes=reading.eval_classes,
                                part=reading.part, rank_ties=reading.rank_ties)
        except (ValueError, LookupError, OSError) as exc:
            return SeedRuns((), None, f"experiment {exp_id} cannot be read as {reading.label} ({exc})")
        items.append(got)
        matrices.append(C)
    hierarchical = interval == "hierarchical" and len(items) >= 2
    return SeedRuns(tuple(matrices), tuple(items) if hierarchical else None)


def feature_drift(db: Engine, runs: dict[tuple[int, str], int], method: str, view: str = "encoder") -> dict | None:
    """``method``'s same-image cosines (first to second model) in ``view`` over its finished seeds:
    ``{"test", "trained", "n", "view"}`` means (NaN-free seeds only); None when no seed's features give them."""
    from engine.reproduce.outcomes import same_image_cosines  # here: the table loads no torch

    got = []
    for (seed, m), exp_id in sorted(runs.items()):
        if m == method:
            try:
                got.append(same_image_cosines(db, exp_id, view))
            except (ValueError, LookupError, OSError):
                return None
    if not got:
        return None
    mean = {k: float(np.nanmean(v)) if np.isfinite(v := [g[k] for g in got]).any() else None for k in ("test", "trained")}
    return {**mean, "n": len(got), "view": view}


def training_accuracy(db: Engine, runs: dict[tuple[int, str], int], method: str) -> dict:
    """``method``'s training accuracy over its finished seeds: ``{"mean", "min", "n"}`` over every model (None when
    nothing is stored)."""
    from engine.reproduce.outcomes import training_accuracy as per_model  # here: the table loads no torch

    values = np.array([a for (seed, m), exp_id in sorted(runs.items()) if m == method for a in per_model(db, exp_id)],
                      np.float64)
    values = values[~np.isnan(values)]
    if not len(values):
        return {"mean": None, "min": None, "n": 0}
    return {"mean": float(values.mean()), "min": float(values.min()), "n": int(len(values))}


def gain_interval(db: Engine, runs: dict[tuple[int, str], int], claim: Claim, method: str, cell: tuple[int, int],
                  reading: Reading | None = None) -> dict | None:
    """The own gain behind ``method``'s cross-test ``cell`` over its finished seeds (:func:`own_gain`), Student's t;
    None when a seed's stored features cannot give it."""
    from engine.reproduce.outcomes import own_gain  # here: the table loads no torch

    conv = claim.our_convention
    values = []
    for (seed, m), exp_id in sorted(runs.items()):
        if m != method:
            continue
        try:
            values.append(own_gain(db, exp_id, cell, view=claim.view(method), metric=conv["metric"],
                                   gallery="template" if conv["gallery"] == "template" else "instance",
                                   eval_classes=reading.eval_classes if reading else conv["eval_classes"],
                                   part=reading.part if reading else None,
                                   rank_ties=reading.rank_ties if reading else "pessimistic"))
        except (ValueError, LookupError, OSError):
            return None
    return seed_interval(values)


def _one_cross(cell: PaperCell, by_method: dict[str, SeedRuns]) -> tuple[int, int] | None:
    """The cross-test whose own gain a row shows: a margin's own, or an AC's when two models make one cross-test."""
    if cell.cell is not None:
        return cell.cell
    matrices = by_method[cell.method].matrices
    return (1, 0) if matrices and matrices[0].shape[0] == 2 else None


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


TIE_BAND = 0.01  # a margin printed as 0 from two-decimal scores lies within +/- 1 point


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
    # a printed tie: the paper prints two-decimal scores, so its margin lies within +/- TIE_BAND (1 point); ours
    # reproduces it when our whole interval lies in that band (an equivalence test: a wide interval that merely
    # holds 0 is no evidence of a tie), does not when it lies outside the band, else unresolved
    if -TIE_BAND <= lo and hi <= TIE_BAND:
        return "reproduces"
    return "does not" if lo > TIE_BAND or hi < -TIE_BAND else "unresolved"


def claim_rows(db: Engine, claim: Claim, runs: dict[tuple[int, str], int], *, interval: str = DEFAULT_INTERVAL,
               resamples: int = RESAMPLES) -> list[Row]:
    """The claim's rows, then the negative control's (its margins of the same cross-tests and its AC), under the
    claim's own convention, then under each of its readings."""
    training = {m: training_accuracy(db, runs, m) for m in claim.methods}
    drift = {m: feature_drift(db, runs, m, claim.view(m)) for m in claim.methods}  # in the view each is judged in
    rows = []
    for reading in (None, *claim.readings):
        rows += reading_rows(db, claim, runs, reading, training, drift, interval=interval, resamples=resamples)
    return rows


def reading_rows(db: Engine, claim: Claim, runs: dict[tuple[int, str], int], reading: Reading | None,
                 training: dict[str, dict], drift: dict[str, dict | None] | None = None, *,
                 interval: str = DEFAULT_INTERVAL, resamples: int = RESAMPLES) -> list[Row]:
    """:func:`claim_rows` under one reading (None: the claim's own convention); ``training`` and ``drift``: per
    method."""
    drift = drift or {}
    rows = []
    by_method = {m: method_runs(db, runs, claim, m, interval=interval, reading=reading) for m in claim.methods}
    control = by_method[CONTROL]
    control_ac = seed_interval([cell_value(C, None) for C in control.matrices])["mean"]
    for cell in claim.cells:
        values, iv, kind = cell_interval(cell.cell, by_method[cell.method], resamples=resamples)
        iv = _clipped(iv, cell.cell)
        gain = gain_interval(db, runs, claim, cell.method, cross, reading) if (cross := _one_cross(cell, by_method)) else None
        rows.append(Row(claim.name, cell.method, cell.label, cell.value, values, iv, _inside(cell.value, iv),
                        _verdict(cell, iv, control_ac), kind, by_method[cell.method].why, reading, training[cell.method],
                        gain, cell.gain, drift.get(cell.method)))
    ac_paper = max((c.value for c in claim.cells if c.cell is None), default=None)
    for cell in {c.cell: c for c in claim.cells}.values():
        values, iv, kind = cell_interval(cell.cell, control, resamples=resamples)
        iv = _clipped(iv, cell.cell)
        if iv["lo"] is None:
            word = "unresolved"
        elif cell.cell is None:
            word = "fails (as it must)" if ac_paper is None or iv["hi"] < ac_paper else "does not fail: the test cannot tell"
        else:
            word = "fails (as it must)" if iv["hi"] < 0 else "does not fail: the test cannot tell"
        rows.append(Row(claim.name, f"{CONTROL} (control)", cell.label if cell.cell else "AC", None, values, iv, "", word,
                        kind, control.why, reading, training[CONTROL], drift=drift.get(CONTROL)))
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


def _gain(row: Row) -> str:
    """A margin's own gain, ours with its interval, then the paper's: ``-5.8 [-6.9, -4.6]; paper +4.0``."""
    g = row.gain
    if not g or g["mean"] is None:
        return "-"
    span = f" [{_num(g['lo'], True)}, {_num(g['hi'], True)}]" if g["lo"] is not None else ""
    return f"{_num(g['mean'], True)}{span}" + ("" if row.paper_gain is None else f"; paper {_num(row.paper_gain, True)}")


def why_lines(rows: Sequence[Row]) -> list[str]:
    """Why a row the paper reads as compatible (a margin >= 0, or an AC above 0) does not reproduce, as measured: the
    newer model is itself no better at the evaluation (own gain interval below zero, the paper's above); else, when
    the features' drift is stored, how far the same image's feature moves from the old model to the new one. One line
    per method, cell and reason, naming every reading it holds under."""
    found: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        if r.verdict != "does not" or r.paper is None or r.paper < 0 or (r.label == "AC" and r.paper == 0):
            continue
        g, where = r.gain, "our convention" if r.reading is None else r.reading.label
        if g and g["hi"] is not None and g["hi"] < 0 and (r.paper_gain is None or r.paper_gain > 0):
            why = (f"the newer model is itself worse than the old one on these items (own gain {_gain(r)} points), so "
                   "no cross-test can be expected to beat the old self-test")
        elif r.drift and r.drift["test"] is not None:
            trained = "" if r.drift["trained"] is None else f"; {r.drift['trained']:.2f} on the old classes' training images"
            view = "" if r.drift.get("view", "encoder") == "encoder" else f" {r.drift['view'].upper()}"
            why = (f"the features move: the same test image's old and new{view} features have cosine "
                   f"{r.drift['test']:.2f}{trained} (1 = unmoved)")
        else:
            continue
        found.setdefault((r.method, r.label, why), []).append(where)
    return [f"why {method} {label} ({'; '.join(where)}): {why}" for (method, label, why), where in found.items()]


def _drift(row: Row) -> str:
    """The same-image cosines, test / trained: ``0.57 / 0.93``."""
    d = row.drift
    if not d:
        return "-"
    return " / ".join("-" if d[k] is None else f"{d[k]:.2f}" for k in ("test", "trained"))


def _training(row: Row) -> str:
    a = row.training
    if not a or a["mean"] is None:
        return "-"
    return f"{100 * a['mean']:.1f} % (min {100 * a['min']:.1f})"


SHORT = {"hierarchical": "seeds, then items", "seeds": "t over seeds"}  # the interval column's words
MARKDOWN_COLUMNS = ("cell", "paper's convention", "our convention", "row", "paper", "ours: mean [95 % interval] (seeds)",
                    "interval", "verdict (paper in ours)", "own gain: ours [t over seeds]; paper",
                    "same image old -> new: cos test / trained", "training accuracy: mean (min)")
CONVENTION_ORDER = "protocol / eval classes / gallery / metric"


def conv_text(c: dict[str, str]) -> str:
    """A convention as words: ``protocol closed-set, eval_classes all, ...``."""
    return ", ".join(f"{k} {v}" for k, v in c.items())


def row_convention(claim: Claim, row: Row) -> dict[str, str]:
    """The convention a row reads: the claim's own, or its reading's eval classes (and part) in their place."""
    if row.reading is None:
        return claim.our_convention
    return {**claim.our_convention, "eval_classes": row.reading.label}


def markdown_header(interval: str = DEFAULT_INTERVAL, *, environment: str = "", command: str = "") -> str:
    """The lines above the README's table: the command, where the numbers come from, the interval, the columns."""
    lines = []
    if command:
        lines.append(f"Regenerate: `{command}`.")
    if environment:
        lines.append(f"Made with: {environment}.")
    lines.append(f"Interval: 95 %, {INTERVALS[interval]}, {RESAMPLES} resamples; margins in points (cross-test minus the "
                 f"old model's self-test), AC as a share; n = seeds; conventions: {CONVENTION_ORDER}; own gain: the newer "
                 f"model's self-test minus the old one's on the cross-test's items (paper 002's Update Gain denominator); same "
                 f"image old -> new: the mean cosine of one image's features under the first and the second model, on the "
                 f"test queries / the old classes' training images; "
                 f"training accuracy: each model's top-1 on its stored training images, over the models and seeds.")
    lines.append("")
    lines.append("| " + " | ".join(MARKDOWN_COLUMNS) + " |")
    lines.append("|" + "---|" * len(MARKDOWN_COLUMNS))
    return "\n".join(lines)


def render(claim: Claim, rows: Sequence[Row], *, markdown: bool = False) -> str:
    """The claim's table: text (header with its conventions, deviations and notes, then each reading's rows) or the
    README's Markdown rows (:func:`markdown_header` goes above them)."""
    if markdown:
        out = []
        for r in rows:
            paper = "-" if r.paper is None else _num(r.paper, r.label != "AC")
            cells = (claim.name, " / ".join(claim.paper_convention.values()), " / ".join(row_convention(claim, r).values()),
                     f"{r.method} {r.label}", paper,
                     _ours(r), SHORT[r.interval_kind], f"{r.verdict}{f' ({r.inside})' if r.inside else ''}", _gain(r),
                     _drift(r), _training(r))
            out.append("| " + " | ".join(cells) + " |")
        return "\n".join(out)
    kinds = dict.fromkeys(r.interval_kind for r in rows) or {"seeds": None}
    lines = [f"{claim.name}: {claim.source}", f"  paper's convention: {conv_text(claim.paper_convention)}",
             f"  ours:               {conv_text(claim.our_convention)}"]
    lines += [f"  differs: {d}" for d in claim.differs]
    lines += [f"  note: {n}" for n in claim.notes]
    lines.append("  margins in points (cross - old self-test); 95 % interval: "
                 + "; ".join(f"{INTERVALS[k]}" + (f" ({RESAMPLES} resamples)" if k == "hierarchical" else "") for k in kinds))
    lines += [f"  seeds only for {r.method}{f' ({r.reading.label})' if r.reading else ''}: {r.note}"
              for r in {(r.method, r.reading): r for r in rows if r.note}.values()]
    reading: object = False
    for r in rows:
        if r.reading != reading:
            reading = r.reading
            lines.append(f"  under {'our convention' if reading is None else 'eval_classes ' + reading.label}:")
            lines.append(f"  {'method':<24}{'cell':<22}{'paper':>8}  {'ours':<34}{'paper in ours':<15}{'verdict':<36}"
                         f"{'own gain; paper':<34}{'cos test / trained':<20}training accuracy")
        paper = "" if r.paper is None else _num(r.paper, r.label != "AC")
        lines.append(f"  {r.method:<24}{r.label:<22}{paper:>8}  {_ours(r):<34}{r.inside:<15}{r.verdict:<36}"
                     f"{_gain(r):<34}{_drift(r):<20}{_training(r)}")
    lines += [f"  {w}" for w in why_lines(rows)]
    return "\n".join(lines)
