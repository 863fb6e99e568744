"""The migration plan: what to do with an upgrade, from the verdict, the adapters and the roll-out curves.

One of four decisions, taken in this order (the first that applies):

1. **do not ship** when the new model is *not better* than the old one on its own (new/new vs old/old fails):
   there is nothing to gain from paying for the upgrade;
2. **ship as is** when the new model is compatible (new queries on the old gallery beat old/old under the rule);
3. **ship with adapter X** when some adapter makes the new queries compatible (adapted->old vs old/old passes);
   among several, the one with the highest lower interval end (then the first listed);
4. **backfill p % in order Y** (with or without an adapter) when some roll-out curve reaches the old self-test:
   the smallest fraction wins (then the larger area under its curve); the cost is ceil(p x gallery) items to
   re-embed. The curves are point estimates over the evaluated queries: the plan says so;
5. otherwise **do not ship yet**, naming what is unresolved (and the queries that would decide it when known).

Inputs are JSON-ready mappings (:meth:`engine.upgrade.verdict.UpgradeReport.to_json`, adapter and roll-out rows),
so the plan is torch-free and the dashboard renders a stored one. The threshold re-mapping
(:mod:`engine.metrics.threshold`) is passed in when the caller has scored pairs with known relevance.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.upgrade.words import NOT_JUDGED, interval, pct

DECISIONS = ("ship as is", "ship with adapter", "backfill", "do not ship", "do not ship yet")
# what a plan is decided from by default (engine.upgrade.migration; here, torch-free, for the command line's help)
DEFAULT_ADAPTERS = ("procrustes", "affine")  # post-hoc kinds fitted on a share of the gallery's pairs
DEFAULT_FIT_SHARE = 0.5
DEFAULT_PRECISION = 0.9  # the default old threshold: the lowest old score with this precision
THRESHOLD_K = 10  # candidates per query the threshold is measured on


@dataclass(frozen=True)
class Plan:
    """The decision, its reason, the numbers behind it and the cost in items to re-embed."""

    decision: str
    reason: str
    old_name: str
    new_name: str
    metric: str
    n_gallery: int
    adapter: str | None = None
    ordering: str | None = None
    fraction: float | None = None
    items_to_reembed: int = 0
    numbers: dict[str, Any] = field(default_factory=dict)
    threshold: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def headline(self) -> str:
        """The decision in a few words: ``ship with adapter X``, ``backfill p % in order Y``, ``ship as is``, ..."""
        return self.decision if self.decision not in ("ship with adapter", "backfill") else {
            "ship with adapter": f"ship with adapter {self.adapter}",
            "backfill": f"backfill {100 * (self.fraction or 0):.0f} % in order {self.ordering}"
                        + (f" with adapter {self.adapter}" if self.adapter else ""),
        }[self.decision]

    def to_markdown(self) -> str:
        """The plan as a short Markdown document (a heading, the decision, the numbers, the notes)."""
        head = self.headline()
        lines = [f"# Migration plan: {self.old_name} -> {self.new_name}", "", f"**Decision: {head}.** {self.reason}", "",
                 f"- metric: {self.metric}; gallery: {self.n_gallery:,} items; items to re-embed: {self.items_to_reembed:,}"]
        lines += [f"- {k}: {v}" for k, v in self.numbers.items()]
        if self.threshold:
            t = self.threshold
            new = "no new threshold reaches that precision" if t.get("t_new") is None else (
                f"{t['t_new']:.4g} for {self.new_name} (precision {pct(t['precision_new'])}, recall {pct(t['recall_new'])})")
            lines.append(f"- similarity threshold: {t['t_old']:.4g} under {self.old_name} (precision {pct(t['precision'])}, "
                         f"recall {pct(t['recall_old'])}) -> {new}")
        lines += [f"- note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def _best_adapter(adapters: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    passing = [a for a in adapters if a["compatibility"]["verdict"] == "compatible"]
    return max(passing, key=lambda a: a["compatibility"]["lo"], default=None)  # max keeps the first among equals


def _best_rollout(rollouts: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    reaching = [r for r in rollouts if r.get("to_old_self") is not None]
    return min(reaching, key=lambda r: (r["to_old_self"], -r.get("area", 0.0)), default=None)


def migration_plan(report: Mapping[str, Any], *, adapters: Sequence[Mapping[str, Any]] = (),
                   rollouts: Sequence[Mapping[str, Any]] | None = None,
                   threshold: Mapping[str, Any] | None = None) -> Plan:
    """The plan for ``report`` (an ``UpgradeReport.to_json()``), given the adapters' rows (``name``,
    ``compatibility`` = a paired verdict of adapted->old vs old/old, optional ``adapted_old``) and the roll-out rows
    (``ordering``, optional ``adapter``, ``to_old_self``, ``to_new_self``, ``area``; default the report's own
    backfill curves). See the module docstring for the order of the decisions."""
    old, new, level = report["old_name"], report["new_name"], report["level"]
    c, b, n = report["compatibility"], report["better"], int(report["n_gallery"])
    base = dict(old_name=old, new_name=new, metric=report["metric"], n_gallery=n,
                threshold=dict(threshold) if threshold else None)
    numbers = {f"{new} queries on the {old} gallery vs {old} alone": f"{pct(report['new_old'])} vs {pct(report['old_old'])} "
                                                                      f"({interval(c, level)}: {c['verdict']})",
               f"{new} alone vs {old} alone": f"{pct(report['new_new'])} vs {pct(report['old_old'])} "
                                               f"({interval(b, level)}: {b['verdict']})" if b["verdict"] != NOT_JUDGED
               else "not judged (no new gallery, or label-free: the new model's own top-k is the reference)"}
    for a in adapters:
        numbers[f"adapter {a['name']} -> {old} gallery vs {old} alone"] = (
            f"{pct(a.get('adapted_old'))} ({interval(a['compatibility'], level)}: {a['compatibility']['verdict']})")
    rollouts = list(report.get("backfill") or ()) if rollouts is None else list(rollouts)
    for r in rollouts:
        via = f" with adapter {r['adapter']}" if r.get("adapter") else ""
        numbers[f"backfill in order {r['ordering']}{via}"] = (
            f"never reaches the {old} self-test" if r.get("to_old_self") is None
            else f"reaches the {old} self-test at {100 * r['to_old_self']:.0f} %")
    if b["verdict"] == "not better":
        return Plan("do not ship", f"{new} is not better than {old} on its own ({interval(b, level)}): the upgrade "
                    "gains nothing a backfill could pay for.", numbers=numbers, **base)
    if c["verdict"] == "compatible":
        return Plan("ship as is", f"{new} queries on the {old} gallery already beat {old} alone ({interval(c, level)}); "
                    f"re-embed the gallery later, at leisure, for the rest of {new}'s gain.", numbers=numbers, **base)
    best = _best_adapter(adapters)
    if best is not None:
        return Plan("ship with adapter", f"adapter {best['name']} maps {new}'s queries onto the {old} gallery and beats "
                    f"{old} alone ({interval(best['compatibility'], level)}); apply it to each query until the gallery "
                    "is re-embedded.", adapter=best["name"], numbers=numbers, **base)
    roll = _best_rollout(rollouts)
    if roll is not None:
        p = float(roll["to_old_self"])
        via = f" with adapter {roll['adapter']}" if roll.get("adapter") else ""
        return Plan("backfill", f"no adapter is compatible; re-embedding {100 * p:.0f} % of the gallery in order "
                    f"{roll['ordering']}{via} brings {new}'s queries back to {old}'s self-test.", adapter=roll.get("adapter"),
                    ordering=roll["ordering"], fraction=p, items_to_reembed=math.ceil(p * n - 1e-9), numbers=numbers,
                    notes=("the backfill fraction is read off one curve over the evaluated queries, without an interval",),
                    **base)
    open_parts = [what for what, v in ((f"{new} vs {old} alone", b), ("compatibility", c))
                  if v["verdict"] == "too close to call"]
    needed = [f"{v['needed']:,} queries would decide {what}" for what, v in ((f"{new} vs {old} alone", b), ("compatibility", c))
              if v["verdict"] == "too close to call" and v.get("needed")]
    reason = (f"too close to call: {' and '.join(open_parts)}" if open_parts else
              "no adapter is compatible and no measured backfill reaches the old self-test")
    return Plan("do not ship yet", reason + ".", numbers=numbers, notes=tuple(needed), **base)
