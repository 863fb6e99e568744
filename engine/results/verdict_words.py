"""One vocabulary for verdicts and backfilling needs on every page (torch-free).

A cross-test's paired verdict (``pass`` / ``fail`` / ``unresolved``, :mod:`engine.metrics.paired`) is said with the
words the Upgrade check and ``check-upgrade`` use (``engine.upgrade.words.HEADS``): compatible / not compatible /
too close to call. Backfilling needs are quoted per metric, the one that does not flatter first: mAP (every item of
the query's class counts), then Recall@k from the largest k, Recall@1 last with why it flatters.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from engine.core.conventions import metric_name
from engine.core.kinds import metric_parts
from engine.metrics.decision import Rule
from engine.metrics.uncertainty import ac_range

WORDS = {"pass": "compatible", "fail": "not compatible", "unresolved": "too close to call"}
ALONE_WORDS = {"pass": "better", "fail": "not better", "unresolved": "too close to call"}  # new self vs old self
RECALL1_ARTEFACT = ("Recall@1 flatters backfilling on an instance gallery: a query counts as found as soon as any one "
                    "item of its class is re-embedded and ranks first, so a few percent of the gallery can match the "
                    "new self-test while most of it is still old; mAP counts every item of the class.")


def verdict_word(verdict: str | None) -> str | None:
    """``pass`` -> 'compatible', ``fail`` -> 'not compatible', ``unresolved`` -> 'too close to call' (None stays None)."""
    return None if verdict is None else WORDS[verdict]


def matrix_verdict(verdicts: Sequence[Sequence[str | None]], tie_readings: Mapping | None = None) -> str | None:
    """The paired verdict of a stored matrix in words: one cross-test (two models) -> its word; several -> the
    count of each word ('2 compatible, 1 too close to call'); None when no cross-test has a verdict. ``tie_readings`` (as
    a Recall@k matrix stores them) adds where ties decide verdicts: '(ties decide it)', '; ties decide 2'."""
    flat = [v for t, row in enumerate(verdicts) for k, v in enumerate(row) if k < t and v]
    if not flat:
        return None
    decide = (tie_readings or {}).get("decide") or []
    decided = sum(bool(v) for t, row in enumerate(decide) for k, v in enumerate(row) if k < t)
    if len(flat) == 1:
        return WORDS[flat[0]] + (" (ties decide it)" if decided else "")
    return ", ".join(f"{flat.count(v)} {WORDS[v]}" for v in WORDS if flat.count(v)) + (f"; ties decide {decided}" if decided else "")


def metric_order(metrics: Iterable[str]) -> list[str]:
    """Metrics in the order backfilling needs are quoted: mAP (and mAP@k) first, then Recall@k from the largest k."""
    def key(m: str) -> tuple[int, int]:
        kind, k = metric_parts(m) or ("", None)
        if kind == "map":
            return (0, 0)
        if kind == "recall" and k is not None:
            return (1, -k)
        return (2, 0)
    return sorted(dict.fromkeys(metrics), key=key)


def needs_lines(reach: Mapping[str, float | None], target: str) -> list[str]:
    """Per metric, least flattering first: 'mAP: reaches v2's self-test after 100% of the gallery' (``reach``: the
    metric's smallest backfilled fraction that reaches ``target``'s self-test, None when none does)."""
    out = []
    for m in metric_order(reach):
        x = reach[m]
        got = (f"never reaches {target}'s self-test" if x is None
               else f"reaches {target}'s self-test after {100 * x:.0f}% of the gallery")
        out.append(f"{metric_name(m)}: {got}")
    return out


def artefact_note(metrics: Iterable[str]) -> str | None:
    """The sentence on Recall@1's artefact when Recall@1 is among the quoted metrics, else None."""
    return RECALL1_ARTEFACT if any(m.lower() == "recall@1" for m in metrics) else None


def interval_text(diff: float, lo: float, hi: float, level: float) -> str:
    """A paired difference and its interval in points: ``+1.2 points, 95% CI -0.5 to +2.9`` (check-upgrade's form)."""
    return f"{100 * diff:+.1f} points, {100 * level:g}% CI {100 * lo:+.1f} to {100 * hi:+.1f}"


RESAMPLED = {"two-way": "queries and gallery items", "images": "pairs, their images resampled", "queries": None,
             "unchanged": None}


def cell_verdict_lines(paired: Mapping | None, names: Sequence[str], tie_readings: Mapping | None = None) -> list[str]:
    """Each judged cross-test of a stored paired test in check-upgrade's words, then the rule and the family-wise
    choice: ``M2 → M1: too close to call (-0.3 points, 95% CI -2.1 to +1.5 over 400 queries and gallery items)``;
    ``tie_readings`` (as a Recall@k matrix stores them) adds ``; ties decide it (...)`` where they do."""
    if not paired:
        return []
    items = paired.get("items", "queries")
    kinds = paired.get("interval")
    out = []
    for t, row in enumerate(paired["verdict"]):
        for k, v in enumerate(row):
            if k >= t or not v:
                continue
            kind = kinds[t][k] if isinstance(kinds, list) else kinds
            over = RESAMPLED.get(kind) or items
            n = paired["n"][t][k] if paired.get("n") is not None else None
            extra = (" (no item changed: the exact bound on the share that could)" if kind == "unchanged" else "")
            out.append(f"{names[t]} → {names[k]}: {WORDS[v]} ({interval_text(paired['diff'][t][k], paired['lo'][t][k], paired['hi'][t][k], paired['confidence'])}"
                       f" over {'' if n is None else f'{n:,} '}{over}){extra}{_alone(paired, t, k, names)}"
                       + (f"; {decided}" if (decided := ties_decide_words(tie_readings, t, k)) else ""))
    if out and (ac := ac_line(paired)):
        out.append(ac)
    if out:
        family = paired.get("familywise") or "none"
        out.append(f"rule: {paired.get('rule') or Rule().name}; "
                   f"family-wise: {'each cross-test alone' if family == 'none' else family}; "
                   f"{paired.get('resamples', '?')} resamples, seed {paired.get('seed', '?')}")
    return out


def ties_decide_words(tie_readings: Mapping | None, t: int, k: int) -> str | None:
    """``ties decide it (not compatible when tied negatives rank first, compatible when they rank after)`` for a
    cross-test whose verdict differs between the pessimistic and the optimistic tie reading, else None."""
    decide = (tie_readings or {}).get("decide")
    if not decide or not decide[t][k]:
        return None
    v = tie_readings["verdicts"][t][k]
    return (f"ties decide it ({WORDS[v['pessimistic']]} when tied negatives rank first, {WORDS[v['optimistic']]} "
            f"when they rank after)")


def tie_lines(tie_readings: Mapping | None, names: Sequence[str], metric: str = "recall@k") -> list[str]:
    """Every cell of a Recall@k matrix with tied queries (stored ``tie_readings``, :mod:`engine.metrics.ties`): its tie
    share and the Recall@k under the pessimistic / expected / optimistic readings, and where ties decide the cell's
    verdict; [] when no query is tied (or the matrix has no tie counts)."""
    if not tie_readings:
        return []
    tied, share = tie_readings["tied"], tie_readings["share"]
    decide = tie_readings.get("decide")
    cells = [(t, k) for t, row in enumerate(tied) for k, n in enumerate(row) if k <= t and n]
    if not cells:
        return []
    out = [f"ties (a negative within {tie_readings['tolerance']:g} of the best positive, before the k-th place; the value "
           f"applies the pessimistic rule to exact ties): {metric_name(metric)} pessimistic / expected / optimistic"]
    for t, k in cells:
        readings = " / ".join(f"{100 * tie_readings[r][t][k]:.2f}" for r in tie_readings["readings"])
        line = f"{names[t]} → {names[k]}: {tied[t][k]:,} queries tied ({100 * share[t][k]:.1f} %); {readings} %"
        if decide and decide[t][k]:
            line += f"; {ties_decide_words(tie_readings, t, k)}"
        out.append(line)
    return out


def _alone(paired: Mapping, t: int, k: int, names: Sequence[str]) -> str:
    """``; on its own M2 is too close to call against M1 (-18.3 points, 95% CI ...)``: check-upgrade's second line for
    the pair, when the paired test has it (``alone``)."""
    a = paired.get("alone")
    v = a["verdict"][t][k] if a else None
    if v is None:
        return ""
    iv = interval_text(a["diff"][t][k], a["lo"][t][k], a["hi"][t][k], paired["confidence"])
    return f"; on its own {names[t]} is {ALONE_WORDS[v]}{' than' if v != 'unresolved' else ' against'} {names[k]} ({iv})"


def ac_line(paired: Mapping) -> str | None:
    """What the cross-tests' intervals leave open of AC (:func:`engine.metrics.uncertainty.ac_range`): from the share
    of sure passes to the share of cross-tests that are not sure failures; None without a judged cross-test."""
    verdicts = paired["verdict"]
    r = ac_range(np.zeros((len(verdicts), len(verdicts))), verdicts)
    if not r["cells"]:
        return None
    level = f"{100 * paired['confidence']:g}%"
    if r["AC_lo"] == r["AC_hi"]:
        return f"AC {r['AC_lo']:.2f}: every cross-test's {level} interval decides it"
    return (f"AC between {r['AC_lo']:.2f} and {r['AC_hi']:.2f} as the cross-tests' {level} intervals leave it "
            f"({r['pass']} sure pass(es), {r['unresolved']} too close to call, of {r['cells']})")
