"""The upgrade verdict in words, from its JSON form (torch-free: the Upgrade check page renders stored reports)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.core.conventions import metric_name
from engine.results.verdict_words import WORDS, interval_text
from engine.metrics.decision import Rule, equivalent

HEADS = {"compatible": "{new} is compatible with {old}", "not compatible": "{new} is not compatible with {old}",
         "too close to call": "Too close to call whether {new} is compatible with {old}"}
ALONE = {"better": "better than {old}.", "not better": "not better than {old}.",
         "too close to call": "too close to call against {old}."}
UNCHANGED_WORDS = "unchanged within +-{m:g} points of {old} (two one-sided tests at the margin)."
NOT_JUDGED = "not judged"  # the "better" verdict when new/new is not measured (no new gallery, or label-free)
UNJUDGED = {"none": "{new}'s own top-k on the new gallery is the reference (label-free), so it scores 100% by "
                    "definition; how {old} alone keeps it is the self-test above.",
            "gallery": "no new gallery was given, so {new} on its own (new/new) is not measured."}


def pct(x: float | None) -> str:
    """A fraction as a percentage with one decimal ('–' when missing)."""
    return "–" if x is None else f"{100 * x:.1f}%"


def share(x: float | None) -> str:
    """A fraction of the gallery to backfill, or 'never' when no fraction reaches the target."""
    return "never (no fraction reaches it)" if x is None else f"{100 * x:.0f}%"


def reach(x: float | None, who: str) -> str:
    """What backfilling reaches: ``reaches v1's self-test after 30% of the gallery``, or that no fraction does."""
    if x is None:
        return f"never reaches {who}'s self-test (no fraction of the gallery does)"
    return f"reaches {who}'s self-test after {100 * x:.0f}% of the gallery"


def interval(c: Mapping[str, Any], level: float) -> str:
    """A paired comparison's difference and interval, in points (the matrices' cells print the same form)."""
    return interval_text(c["diff"], c["lo"], c["hi"], level)


def rule_name(margin: float, ties: str) -> str:
    """The verdict's rule in words (strict ECC, ties passing, or a non-inferiority margin)."""
    return Rule(margin, ties).name


def _and_gallery(report: Mapping[str, Any]) -> str:
    """" in G groups" when the queries were resampled in groups, " and N gallery items" when the interval resampled the
    gallery too (``interval = "two-way"``), else ""."""
    groups = f" in {report['query_groups']:,} groups" if report.get("query_groups") else ""
    return groups + (f" and {report['n_gallery']:,} gallery items" if report.get("interval") == "two-way" else "")


def sentence(report: Mapping[str, Any]) -> str:
    """The verdict in one sentence, then one on the new model alone (what to do about it is the plan's:
    :func:`engine.upgrade.plan.migration_plan`, the one decision every surface prints).

    ``report`` is :meth:`engine.upgrade.verdict.UpgradeReport.to_json`'s dict (or the dataclass as a dict).
    """
    old, new, m, level = report["old_name"], report["new_name"], metric_name(report["metric"]), report["level"]
    c, b = report["compatibility"], report["better"]
    out = [f"{HEADS[c['verdict']].format(old=old, new=new)}: {new} queries against the {old} gallery score {m} "
           f"{pct(report['new_old'])} vs {pct(report['old_old'])} for {old} alone ({interval(c, level)} over {c['n']} queries"
           f"{_and_gallery(report)}).",
           (f"On its own {new} is not judged: "
            + UNJUDGED["none" if report.get("relevance") == "none" else "gallery"].format(old=old, new=new))
           if b["verdict"] == NOT_JUDGED else
           f"On its own {new} scores {pct(report['new_new'])} vs {pct(report['old_old'])} ({interval(b, level)}): "
           + (UNCHANGED_WORDS.format(old=old, m=report.get("margin") or 0.0)
              if equivalent(b["lo"], b["hi"], report.get("margin") or 0.0) else ALONE[b["verdict"]].format(old=old))]
    if c.get("tie") and report.get("ties") == "pass":
        out.append(f"Every query scores the same with {new} as with {old}: a tie, which ties passing accepts.")
    elif c.get("tie"):
        out.append(f"Every query scores the same with {new} as with {old}: a tie, which the papers' strict ECC (the "
                   "cross-test must score above the self-test) cannot pass; a margin or ties passing accepts it.")
    readings = report.get("tie_readings")
    if readings and readings.get("decide"):
        v, cells = readings["verdicts"], readings["cells"]
        out.append(f"Ties decide it: {new} is {WORDS[v['pessimistic']]} when tied negatives rank first and "
                   f"{WORDS[v['optimistic']]} when they rank after ({pct(cells['new/old']['share'])} of {new}/{old}'s "
                   f"queries and {pct(cells['old/old']['share'])} of {old}/{old}'s tie a negative within "
                   f"{readings['tolerance']:g} of their best positive).")
    if report.get("margin") or report.get("ties") == "pass":
        out.append(f"Rule: {rule_name(report.get('margin') or 0.0, report.get('ties') or 'fail')}.")
    return " ".join(out)


def tie_line(report: Mapping[str, Any]) -> str | None:
    """``ties within 1e-06: old/old 12.5% tied, Recall@1 30.8 / 38.9 / 46.1% (pessimistic / expected / optimistic);
    ...``: each cell of a Recall@k check whose queries tie, None when none does (or the check has no tie counts)."""
    readings = report.get("tie_readings")
    if not readings or not any(c["tied"] for c in readings["cells"].values()):
        return None
    who, m = {"old": report["old_name"], "new": report["new_name"]}, metric_name(report["metric"])
    cells = "; ".join(f"{'/'.join(who[side] for side in key.split('/'))} {pct(c['share'])} tied, {m} "
                      + " / ".join(f"{100 * c[r]:.1f}" for r in readings["readings"]) + "%"
                      for key, c in readings["cells"].items()
                      if c["share"] is not None and c["share"] == c["share"])  # null / NaN: no query has a positive
    return (f"ties within {readings['tolerance']:g} of the best positive: {cells} "
            f"({' / '.join(readings['readings'])}; the value is pessimistic on exact ties)")
