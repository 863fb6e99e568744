"""The upgrade verdict in words, from its JSON form (torch-free: the Upgrade check page renders stored reports)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.core.conventions import metric_name
from engine.results.verdict_words import interval_text
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
    if report.get("margin") or report.get("ties") == "pass":
        out.append(f"Rule: {rule_name(report.get('margin') or 0.0, report.get('ties') or 'fail')}.")
    return " ".join(out)
