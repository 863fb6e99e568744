"""The upgrade decision: one rule, one function, and every surface (CLI, plan files, pages, report) prints its output.

The rule, stated once (:func:`migration_plan`; torch-free, the dashboard renders a stored plan):

* **success**: is v2 worth paying for? v2 alone (new/new) against v1 alone (old/old), the strict paired verdict
  (``better`` / ``not better`` / ``too close to call``; ``not judged`` without a new gallery or label-free). With a
  margin ``m`` > 0 an interval inside ``+-m`` reads **unchanged within +-m points** (two one-sided tests,
  :func:`engine.metrics.decision.equivalent`): the verdict of a like-for-like re-export (fp32 -> int8).
* **guardrail**: can v2's queries, raw or through an adapter, search v1's gallery today? new/old (adapted/old)
  against old/old under the report's :class:`~engine.metrics.decision.Rule`: strict ECC, ties passing, or
  non-inferiority within ``m`` points ("at parity within m", never "beats").

Decisions, the first that applies:

1. **ship as is** when both readings are unchanged within ``+-m`` (an equivalent model: nothing to migrate);
2. **do not ship** when v2 is not better on its own: no remedy is worth paying for;
3. **do not ship yet** when v2's own gain is too close to call (or not judged and nothing passes as is): a backfill
   or an adapter would be spent on a gain nobody has shown; it names the queries, and the margin, that would decide;
4. **ship as is** when the guardrail passes for v2's own queries;
5. **ship with adapter X** when an adapter's queries pass the guardrail (highest lower interval end, then first).
   Picking the best of several makes the winner's interval optimistic, so the adapter-judging code
   (:func:`engine.upgrade.migration.adapter_rows`, :func:`engine.upgrade.source_remedies.plan_from_sources`) judges
   every candidate with **simultaneous intervals** (max-T over the candidates' bootstrap percentile ranks, Mandel &
   Betensky 2008: :mod:`engine.metrics.selection`), each at the level at which all of them cover together at the
   report's level (a row's ``level``); whichever this rule picks, its interval keeps the report's level;
6. **backfill p % in order Y** when v2 is better and a roll-out curve reaches v1's self-test: the smallest fraction
   (then the larger area), ceil(p x gallery) items; read on the curve of :func:`backfill_metric` (mAP where Recall@k
   flatters backfilling: one re-embedded item of the class can make a Recall@1 hit);
7. otherwise **do not ship yet**, naming what is open, the queries and the margin that would decide it.

Steps 5 and 6 are one choice among the **remedies side by side** (:func:`remedy_options`, issue 42): query-side
adapter, corpus transform (the stored old vectors mapped old -> new once), cascade at N (the old index's top N
re-scored by v2), backfill p % (the roll-out step 6 picks) and full re-embedding, each with its verdict and interval
(a backfill's fraction is read off one curve, without one), its one-time and its per-query cost. A remedy passes when
its verdict under the rule is ``compatible`` (a backfill when its curve reaches v1's self-test, a full re-embedding
when v2 is better alone and its queries are not compatible with v1's gallery: a guardrail too close to call leaves
step 7's "do not ship yet", since more queries may show that shipping as is, free, passes; both only when v2's own
gain is judged). The plan recommends **the cheapest passing remedy**
(:func:`cheapest_passing`, :func:`cost_key`) over a horizon of Q queries served (:func:`horizon`: ``--expected-queries``,
by default as many as the gallery holds items): model inference first (items a model embeds once + Q x items it embeds
per query), then stored vectors rewritten once (the index rebuilt), then Q x vector maps per query, then the higher
lower interval end. So an adapter comes before a corpus transform, and both before any model inference. A cascade's per-query inference grows with traffic, so at the default horizon it costs more than a
re-embedding (N x n > n) and wins only for a declared low traffic; the plan says after how many queries it stops being
the cheaper (:func:`break_even`). With no remedy passing, step 7.

Recovery is read against its ceiling: a query-side adapter teaches v2's queries to imitate v1 on v1's gallery, so its
share of a full re-embedding is capped near old/old / new/new (:func:`recovery_rows`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.core.contract import ORDERING_HELP
from engine.core.conventions import metric_name
from engine.metrics.decision import equivalent, margin_to_decide
from engine.upgrade.words import NOT_JUDGED, interval, pct

DECISIONS = ("ship as is", "ship with adapter", "transform the gallery", "serve a cascade", "backfill",
             "re-embed the gallery", "do not ship", "do not ship yet")
# the remedies a plan compares (remedy_options), in the order of their cost rule (cost_key)
REMEDIES = ("query-side adapter", "corpus transform", "cascade", "backfill", "full re-embedding")
REMEDY_DECISION = {"query-side adapter": "ship with adapter", "corpus transform": "transform the gallery",
                   "cascade": "serve a cascade", "backfill": "backfill", "full re-embedding": "re-embed the gallery"}
# what a plan is decided from by default (engine.upgrade.migration; here, torch-free, for the command line's help)
DEFAULT_ADAPTERS = ("procrustes", "affine")  # post-hoc kinds fitted on a share of the gallery's pairs
DEFAULT_FIT_SHARE = 0.5
DEFAULT_PRECISION = 0.9  # the default old threshold: the lowest old score with this precision
THRESHOLD_K = 10  # candidates per query the threshold is measured on
UNCHANGED = "unchanged"  # the success reading of an equivalent model (TOST within the margin)
NEAR_CEILING = 0.05  # an adapter within 5 % of old/old (either side) is at its ceiling: old/old / new/new


def backfill_metric(metric: str, relevance: str = "labels") -> str:
    """The metric a backfill fraction is read on: Recall@k flatters backfilling with class labels (one re-embedded item
    of the query's class can make the hit), so labels read mAP; other metrics (mAP, nDCG@k, neighbour recall@k) are
    read as given."""
    return "map" if relevance == "labels" and metric.lower().startswith("recall@") else metric


def _m(report: Mapping[str, Any]) -> float:
    return float(report.get("margin") or 0.0)


def success_verdict(report: Mapping[str, Any]) -> str:
    """v2 alone vs v1 alone: the report's strict verdict, or ``unchanged`` when its interval lies within the margin."""
    b = report["better"]
    if b["verdict"] != NOT_JUDGED and equivalent(b["lo"], b["hi"], _m(report)):
        return UNCHANGED
    return b["verdict"]


def recovery_rows(report: Mapping[str, Any], adapters: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each adapter's recovery read against its ceiling: share of the re-embedding (adapted/old / new/new) and of today's
    system (adapted/old / old/old), the ceiling old/old / new/new (known before any fit), and the label-free reading
    (agreement with v2's own neighbours, what adapter papers quote) beside it when the row has one."""
    oo, nn = report.get("old_old"), report.get("new_new")
    ceiling = oo / nn if oo is not None and nn and not math.isnan(nn) else None
    rows = []
    for a in adapters:
        got = a.get("adapted_old")
        of_new = None if got is None or not nn or ceiling is None else got / nn
        of_old = None if got is None or not oo else got / oo
        rows.append({"name": a["name"], "adapted_old": got, "share_of_new_new": of_new, "share_of_old_old": of_old,
                     "ceiling": ceiling, "at_ceiling": bool(of_old is not None and ceiling is not None
                                                            and abs(of_old - 1) <= NEAR_CEILING),
                     "label_free": a.get("label_free")})
    return rows


def recovery_line(row: Mapping[str, Any], old: str, new: str) -> str:
    """One adapter's recovery in words, with the reading when the ceiling binds."""
    if row["share_of_new_new"] is None:
        return f"adapter {row['name']}: {pct(row['adapted_old'])} ({new} alone not measured: no share of a re-embedding)"
    out = (f"adapter {row['name']}: {pct(row['share_of_new_new'])} of a full re-embedding ({new}/{new}), "
           f"{pct(row['share_of_old_old'])} of today's system ({old}/{old}); ceiling {pct(row['ceiling'])} "
           f"({old}/{old} / {new}/{new})")
    if row["at_ceiling"]:
        out += (f": at its ceiling: the adapter makes {new}'s queries imitate {old} on {old}'s gallery, so it cannot "
                f"recover much more than {old} itself scores; only re-embedding the gallery buys the rest")
    if row.get("label_free") is not None:
        out += (f"; against {new}'s own neighbours (label-free, the reading adapter papers quote as 95-99 %): "
                f"{pct(row['label_free'])}")
    return out


def forecast_line(f: Mapping[str, Any], old: str, new: str) -> str:
    """The recovery forecast (:class:`engine.upgrade.forecast.Forecast` as a dict) in words, read before any adapter
    is fitted."""
    return (f"a Procrustes adapter should recover {100 * f['share_of_new']:.0f} % of a full re-embedding ({new}/{new}; "
            f"{100 * f['level']:g} % prediction interval {100 * f['new_lo']:.0f}-{100 * f['new_hi']:.0f} %) and "
            f"{100 * f['share_of_old']:.0f} % of today's system ({old}/{old}; {100 * f['old_lo']:.0f}-"
            f"{100 * f['old_hi']:.0f} %), read on {f['n_queries']:,} queries before fitting (ceiling "
            f"{100 * f['ceiling']:.0f} %, Procrustes residual {f['residual']:.3f})")


def _cost(once: int = 0, once_vectors: int = 0, per_query: int = 0, per_query_vectors: int = 0) -> dict[str, Any]:
    return {"one_time": {"embeddings": int(once), "vectors": int(once_vectors)},
            "per_query": {"embeddings": int(per_query), "vectors": int(per_query_vectors)}}


def _option(remedy: str, name: str, verdict: str, passes: bool, c: Mapping[str, Any] | None, level: float | None,
            cost: dict[str, Any], cost_words: str, **extra: Any) -> dict[str, Any]:
    return {"remedy": remedy, "name": name, "verdict": verdict, "passes": bool(passes),
            "diff": None if c is None else c["diff"], "lo": None if c is None else c["lo"],
            "hi": None if c is None else c["hi"], "level": level, **cost, "cost": cost_words, **extra}


def remedy_options(report: Mapping[str, Any], *, adapters: Sequence[Mapping[str, Any]] = (),
                   transforms: Sequence[Mapping[str, Any]] = (), cascade: Mapping[str, Any] | None = None,
                   rollouts: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The remedies side by side (module docstring): one option per adapter and corpus transform row, the cascade row
    (its smallest passing N, else its largest), the roll-out :func:`pick_rollout` takes (else a row saying none
    reaches) and the full re-embedding, each with ``verdict``, ``passes``, its interval (``diff``, ``lo``, ``hi`` at
    ``level``; None for a backfill, read off one curve), ``one_time`` and ``per_query`` costs and their words."""
    n, level = int(report["n_gallery"]), report["level"]
    judged = success_verdict(report) == "better"
    out = []
    for a in adapters:
        c = a["compatibility"]
        out.append(_option("query-side adapter", str(a["name"]), c["verdict"], c["verdict"] == "compatible", c,
                           a.get("level", level), _cost(per_query_vectors=1),
                           "nothing once; one map per query (the query's vector through the adapter)"))
    for t in transforms:
        c = t["compatibility"]
        out.append(_option("corpus transform", str(t["name"]), c["verdict"], c["verdict"] == "compatible", c,
                           t.get("level", level), _cost(once_vectors=n),
                           f"one pass over the {n:,} stored vectors (no model), written to a new file; nothing per "
                           "query", vs_new_new=t.get("vs_new_new")))
    if cascade is not None:
        c, k = cascade["compatibility"], int(cascade["n"])
        adapted = cascade.get("first_stage") != "new queries"
        out.append(_option("cascade", str(cascade["name"]), c["verdict"], c["verdict"] == "compatible", c,
                           cascade.get("level", level), _cost(per_query=k, per_query_vectors=int(adapted)),
                           f"nothing once; per query the old index's top {k:,} re-scored by the new model ({k:,} "
                           "candidates embedded by it, or read from its stored vectors)"
                           + ("; the query through the adapter first" if adapted else ""),
                           smallest_passing=cascade.get("smallest_passing")))
    roll = pick_rollout(rollouts)
    if roll is not None:
        p = float(roll["to_old_self"])
        merge = str(roll["ordering"]).startswith("rank_merge:")
        name = f"{100 * p:.0f} % in order {roll['ordering']}" + (f" with adapter {roll['adapter']}"
                                                                  if roll.get("adapter") else "")
        out.append(_option("backfill", name, f"reaches the old self-test at {100 * p:.0f} %", judged, None, None,
                           _cost(once=items_for(p, n), per_query=int(merge), per_query_vectors=int(bool(roll.get("adapter")))),
                           f"{items_for(p, n):,} gallery items embedded by the new model once"
                           + ("; both models embed each query until it is done (rank merge)" if merge else ""),
                           transitional=True))
    elif rollouts:
        out.append(_option("backfill", "no measured order", "never reaches the old self-test", False, None, None,
                           _cost(once=n), "every item re-embedded before it reaches the old self-test"))
    b = report["better"]
    settled = report["compatibility"]["verdict"] == "not compatible"  # too close: more queries may ship it as is
    out.append(_option("full re-embedding", "the whole gallery", b["verdict"], judged and settled,
                       None if b["verdict"] == NOT_JUDGED
                       else b, level, _cost(once=n), f"{n:,} gallery items embedded by the new model once; nothing "
                       "per query"))
    return out


def horizon(queries: int | None, n_gallery: int) -> int:
    """The queries a plan weighs per-query costs over: ``queries`` when given (a whole number >= 1), else as many as
    the gallery holds items (a documented default: a service that answers about one query per stored item before the
    next upgrade; ``check-upgrade --expected-queries`` sets it)."""
    if queries is None:
        return int(n_gallery)
    if isinstance(queries, bool) or int(queries) != queries or queries < 1:
        raise ValueError(f"the expected queries must be a whole number >= 1, got {queries!r}")
    return int(queries)


def cost_key(option: Mapping[str, Any], queries: int) -> tuple[float, ...]:
    """The cost rule, stated once, over a horizon of ``queries`` served: model inference first (items a model embeds
    once, plus items it embeds per query times ``queries``), then stored vectors rewritten once (the index rebuilt),
    then vector maps per query times ``queries``; then the higher lower interval end (a backfill's counts as 0). A
    backfill's per-query work (both models embed each query while a rank merge serves) lasts only until it is done, so
    it is not weighed over the horizon."""
    once, per = option["one_time"], option["per_query"]
    q = 0 if option.get("transitional") else queries  # a backfill's per-query work (a rank merge) ends with it
    return (once["embeddings"] + q * per["embeddings"], once["vectors"], q * per["vectors"], -(option.get("lo") or 0.0))


def cheapest_passing(options: Sequence[Mapping[str, Any]], queries: int) -> Mapping[str, Any] | None:
    """The option a plan recommends: the passing one of least :func:`cost_key` over ``queries`` (the first listed
    among equals)."""
    return min((o for o in options if o["passes"]), key=lambda o: cost_key(o, queries), default=None)


def break_even(pick: Mapping[str, Any], options: Sequence[Mapping[str, Any]]) -> str:
    """For a remedy that embeds per query (a cascade): after how many queries its model inference exceeds the cheapest
    passing remedy that embeds once (a backfill, a re-embedding), so a team can read the cost rule against its traffic;
    empty when there is no such remedy."""
    per = pick["per_query"]["embeddings"]
    once = [o for o in options if o["passes"] and o["one_time"]["embeddings"] and not o["per_query"]["embeddings"]]
    if not per or not once:
        return ""
    o = min(once, key=lambda x: x["one_time"]["embeddings"])
    q = math.ceil(o["one_time"]["embeddings"] / per)
    return (f" Its {per:,} embeddings per query exceed the {o['one_time']['embeddings']:,} of {o['remedy']} "
            f"{o['name']} (embedded once) after {q:,} queries: past that traffic, {o['remedy']} is cheaper.")


def option_line(o: Mapping[str, Any], *, picked: bool) -> str:
    """One remedy in words: its verdict with the interval (at its own level), its costs, and whether the plan
    recommends it."""
    judged = f"{o['verdict']} ({interval(o, o['level'])})" if o["lo"] is not None else o["verdict"]
    if o.get("vs_new_new"):  # a corpus transform: what it keeps of the full re-embedding, paired on the same queries
        judged += f"; against the full re-embedding {interval(o['vs_new_new'], o['vs_new_new']['level'])}"
    return (f"{o['remedy']} {o['name']}: {judged}; cost: {o['cost']}"
            + (" <- recommended: the cheapest that passes" if picked else ""))


@dataclass(frozen=True)
class Plan:
    """The decision, its reason, the rule it was taken under, the numbers behind it and the cost in items to re-embed."""

    decision: str
    reason: str
    old_name: str
    new_name: str
    metric: str
    n_gallery: int
    rule: str = ""
    success: str = ""  # v2 alone vs v1 alone: better / not better / unchanged / too close to call / not judged
    guardrail: str = ""  # v2's queries on v1's gallery vs v1 alone under the rule
    adapter: str | None = None
    ordering: str | None = None
    fraction: float | None = None
    backfill_metric: str | None = None  # the curve the fraction was read on
    items_to_reembed: int = 0
    margin_to_decide: float | None = None  # points: the margin under which a too-close call would pass
    numbers: dict[str, Any] = field(default_factory=dict)
    recovery: tuple[dict[str, Any], ...] = ()
    forecast: dict[str, Any] | None = None  # the recovery predicted before fitting (engine.upgrade.forecast)
    threshold: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    options: tuple[dict[str, Any], ...] = ()  # the remedies side by side (remedy_options)
    remedy: str | None = None  # the option the decision took (its name), when it took one
    vectors_to_transform: int = 0  # a corpus transform: the stored vectors mapped once
    queries: int = 0  # the queries served the per-query costs are weighed over (horizon)

    def to_json(self) -> dict[str, Any]:
        """The fields, each option marked ``recommended`` when it is the one the decision took."""
        out = asdict(self)
        out["options"] = [{**o, "recommended": self.took(o)} for o in out["options"]]
        return out

    def took(self, option: Mapping[str, Any]) -> bool:
        """Whether the decision is this option (its remedy's decision, its name)."""
        return REMEDY_DECISION[option["remedy"]] == self.decision and option["name"] == self.remedy

    def headline(self) -> str:
        """The decision in a few words: ``ship with adapter X``, ``backfill p % in order Y``, ``ship as is``, ..."""
        if self.decision == "ship with adapter":
            return f"ship with adapter {self.adapter}"
        if self.decision in ("transform the gallery", "serve a cascade"):
            return f"{self.decision}: {self.remedy}"
        if self.decision == "backfill":
            order = str(self.ordering)
            merge = order.startswith("rank_merge:")  # both models serve queries until the backfill is done
            return (f"backfill {100 * (self.fraction or 0):.0f} % in order {order.split(':', 1)[1] if merge else order}"
                    + (" serving a rank merge of both indexes" if merge else "")
                    + (f" with adapter {self.adapter}" if self.adapter else ""))
        return self.decision

    def to_markdown(self) -> str:
        """The plan as a short Markdown document: the decision, the rule, the numbers, recovery and notes as lists."""
        lines = [f"# Migration plan: {self.old_name} -> {self.new_name}", "", f"**Decision: {self.headline()}.** {self.reason}",
                 "", f"- rule: {self.rule}", f"- metric: {metric_name(self.metric)}; gallery: {self.n_gallery:,} items; "
                 f"items to re-embed: {self.items_to_reembed:,}"]
        lines += [f"- {k}: {v}" for k, v in self.numbers.items()]
        if self.forecast:
            lines.append(f"- forecast: {forecast_line(self.forecast, self.old_name, self.new_name)}")
        lines += [f"- recovery: {recovery_line(r, self.old_name, self.new_name)}" for r in self.recovery]
        if self.threshold:
            t = self.threshold
            new = "no new threshold reaches that precision" if t.get("t_new") is None else (
                f"{t['t_new']:.4g} for {self.new_name} (precision {pct(t['precision_new'])}, recall {pct(t['recall_new'])})")
            lines.append(f"- similarity threshold: {t['t_old']:.4g} under {self.old_name} (precision {pct(t['precision'])}, "
                         f"recall {pct(t['recall_old'])}) -> {new}")
        lines += [f"- note: {n}" for n in self.notes]
        if self.options:
            lines += ["", "## Remedies side by side", ""]
            lines += [f"- {option_line(o, picked=self.took(o))}" for o in self.options]
        return "\n".join(lines) + "\n"


def items_for(fraction: float, n: int) -> int:
    """Items to re-embed for a fraction of an ``n``-item gallery: rounded up, a hair of float noise off."""
    return math.ceil(fraction * n - 1e-9)


def pick_rollout(rollouts: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The roll-out a plan chooses: the smallest fraction that reaches v1's self-test, then the larger area."""
    reaching = [r for r in rollouts if r.get("to_old_self") is not None]
    return min(reaching, key=lambda r: (r["to_old_self"], -(r.get("area") or 0.0)), default=None)


def order_words(ordering: str) -> str:
    """``distance_mse (farthest (Euclidean) from its class mean in the old gallery first)``; rank merges likewise."""
    base = ordering.split(":", 1)[1] if ordering.startswith("rank_merge:") else ordering
    merge = "a rank merge of both indexes, " if ordering.startswith("rank_merge:") else ""
    help_ = ORDERING_HELP.get(base)
    return f"{base} ({merge}{help_})" if help_ else ordering


def _passes(c: Mapping[str, Any], margin: float) -> str:
    """How a passing guardrail is said: above the self-test (strict ECC) or at parity within the margin."""
    return "score at parity with" if margin > 0 else "already score above"


def migration_plan(report: Mapping[str, Any], *, adapters: Sequence[Mapping[str, Any]] = (),
                   rollouts: Sequence[Mapping[str, Any]] | None = None,
                   threshold: Mapping[str, Any] | None = None, forecast: Mapping[str, Any] | None = None,
                   transforms: Sequence[Mapping[str, Any]] = (), cascade: Mapping[str, Any] | None = None,
                   queries: int | None = None) -> Plan:
    """The decision for ``report`` (an ``UpgradeReport.to_json()``), given the adapters' rows (``name``,
    ``compatibility`` = a paired verdict of adapted->old vs old/old under the report's rule, optional ``adapted_old``,
    ``label_free``) and the roll-out rows (``ordering``, optional ``adapter``, ``metric``, ``to_old_self``,
    ``to_new_self``, ``area``; default the report's own backfill curves), the corpus transforms' rows and the cascade's
    (:mod:`engine.upgrade.remedies`), and the horizon of ``queries`` the per-query costs are weighed over (default:
    as many as the gallery holds items, :func:`horizon`). See the module docstring for the rule."""
    old, new, level, margin = report["old_name"], report["new_name"], report["level"], _m(report)
    c, b, n = report["compatibility"], report["better"], int(report["n_gallery"])
    success = success_verdict(report)
    guard_unchanged = margin > 0 and equivalent(c["lo"], c["hi"], margin)
    rule = report.get("rule") or ""
    rollouts = list(report.get("backfill") or ()) if rollouts is None else list(rollouts)
    base = dict(old_name=old, new_name=new, metric=report["metric"], n_gallery=n, rule=rule, success=success,
                guardrail=c["verdict"], threshold=dict(threshold) if threshold else None,
                forecast=dict(forecast) if forecast else None,
                recovery=tuple(recovery_rows(report, adapters)))
    base["queries"] = horizon(queries, n)
    options = [{**o, "embeddings_at_horizon": int(cost_key(o, base["queries"])[0])}  # what the rule ranks first
               for o in remedy_options(report, adapters=adapters, transforms=transforms, cascade=cascade,
                                       rollouts=rollouts)]
    base["options"] = tuple(options)
    alone = (f"{pct(report['new_new'])} vs {pct(report['old_old'])} ({interval(b, level)}: {success})"
             if b["verdict"] != NOT_JUDGED
             else "not judged (no new gallery, or label-free: the new model's own top-k is the reference)")
    numbers = {f"{new} queries on the {old} gallery vs {old} alone": f"{pct(report['new_old'])} vs {pct(report['old_old'])} "
                                                                      f"({interval(c, level)}: {c['verdict']})",
               f"{new} alone vs {old} alone": alone}
    for a in adapters:
        numbers[f"adapter {a['name']} -> {old} gallery vs {old} alone"] = (
            f"{pct(a.get('adapted_old'))} ({interval(a['compatibility'], level)}: {a['compatibility']['verdict']})")
    for t in transforms:
        numbers[f"{new} queries on the {old} gallery transformed by {t['name']} vs {old} alone"] = (
            f"{pct(t.get('transformed'))} ({interval(t['compatibility'], t.get('level', level))}: "
            f"{t['compatibility']['verdict']})")
    if cascade is not None:
        numbers[f"cascade {cascade['name']} ({cascade['first_stage']} first) vs {old} alone"] = (
            f"{pct(cascade.get('value'))} ({interval(cascade['compatibility'], cascade.get('level', level))}: "
            f"{cascade['compatibility']['verdict']})")
    for r in rollouts:
        via = f" with adapter {r['adapter']}" if r.get("adapter") else ""
        on = f" ({metric_name(r['metric'])})" if r.get("metric") and r["metric"] != report["metric"] else ""
        numbers[f"backfill in order {r['ordering']}{via}{on}"] = (
            f"never reaches the {old} self-test" if r.get("to_old_self") is None
            else f"reaches the {old} self-test at {100 * r['to_old_self']:.0f} %")
    base["numbers"] = numbers

    if success == UNCHANGED and guard_unchanged:
        return Plan("ship as is", f"{new} is unchanged within +-{margin:g} points: alone {interval(b, level)} and its "
                    f"queries on the {old} gallery {interval(c, level)} against {old} alone both lie inside the margin "
                    "(two one-sided tests); swap it in without touching the gallery.", **base)
    if success == "not better":
        return Plan("do not ship", f"{new} is not better than {old} on its own ({interval(b, level)}): the upgrade gains "
                    "nothing an adapter or a backfill could pay for.", **base)
    if success == UNCHANGED:
        return Plan("do not ship", f"{new} is unchanged within +-{margin:g} points on its own ({interval(b, level)}), "
                    f"so it gains nothing, and its queries on the {old} gallery are {c['verdict']} "
                    f"({interval(c, level)}).", **base)
    if success == "too close to call":
        m = margin_to_decide(b["lo"], b["hi"], equivalence=True)
        notes = (f"{b['needed']:,} queries would decide whether {new} is better on its own" if b.get("needed") else
                 f"no number of queries would decide whether {new} is better on its own (the paired difference is 0)",
                 f"with --margin {m:g} (+-{m:g} points) two one-sided tests would call {new} unchanged on its own, if "
                 "that difference is one you would accept as no change")
        return Plan("do not ship yet", f"Too close to call whether {new} is better than {old} on its own "
                    f"({interval(b, level)}): no adapter or backfill is recommended for a gain nobody has shown.",
                    margin_to_decide=m, notes=notes, **base)
    judged = success == "better"
    unjudged = () if judged else (f"{new}'s own gain is not measured here (no new gallery, or label-free): the plan "
                                  "says only whether its queries can serve today, never a backfill",)
    if c["verdict"] == "compatible":
        return Plan("ship as is", f"{new} queries on the {old} gallery {_passes(c, margin)} {old} alone "
                    f"({interval(c, level)}); re-embed the gallery later, at leisure, for the rest of {new}'s gain.",
                    notes=unjudged, **base)
    pick = cheapest_passing(options, base["queries"])
    kind = pick["remedy"] if pick is not None else None
    why = "" if pick is None else (f" It is the cheapest remedy that passes over {base['queries']:,} queries served "
                                   f"({pick['cost']}).")
    if kind == "query-side adapter":
        best = next(a for a in adapters if str(a["name"]) == pick["name"])
        return Plan("ship with adapter", f"Adapter {best['name']} maps {new}'s queries onto the {old} gallery, where they "
                    f"{_passes(best['compatibility'], margin)} {old} alone ({interval(best['compatibility'], level)}); "
                    "apply it to each query until the gallery is re-embedded." + why, adapter=best["name"],
                    remedy=pick["name"], notes=unjudged, **base)
    if kind == "corpus transform":
        t = next(t for t in transforms if str(t["name"]) == pick["name"])
        return Plan("transform the gallery", f"The {t['kind']} map {old} -> {new} turns the stored {old} vectors into "
                    f"{new}'s space, where {new}'s own queries {_passes(t['compatibility'], margin)} {old} alone "
                    f"({interval(t['compatibility'], t.get('level', level))}); transform the gallery once into a new file, then serve "
                    f"{new}." + why, remedy=pick["name"], vectors_to_transform=n, notes=unjudged, **base)
    if kind == "cascade":
        return Plan("serve a cascade", f"{new}'s queries ({cascade['first_stage']}) fetch the {old} index's top "
                    f"{int(cascade['n']):,}, which {new} re-scores; they {_passes(cascade['compatibility'], margin)} "
                    f"{old} alone ({interval(cascade['compatibility'], cascade.get('level', level))}), the smallest N of the curve that "
                    "passes." + why + break_even(pick, options), remedy=pick["name"], notes=unjudged, **base)
    if kind == "full re-embedding":
        return Plan("re-embed the gallery", f"{new} is better than {old} on its own ({interval(b, level)}) but no "
                    f"cheaper remedy passes: re-embed all {n:,} gallery items with {new}, then serve it." + why,
                    remedy=pick["name"], items_to_reembed=n, notes=unjudged, **base)
    roll = pick_rollout(rollouts) if kind == "backfill" else None
    if roll is not None:
        p = float(roll["to_old_self"])
        via = f" with adapter {roll['adapter']}" if roll.get("adapter") else ""
        on = roll.get("metric") or report["metric"]
        flatter = (f"; read on the {metric_name(on)} curve because {metric_name(report['metric'])} flatters backfilling"
                   if on != report["metric"] else "")
        return Plan("backfill", f"No adapter is compatible; re-embedding {100 * p:.0f} % of the gallery in order "
                    f"{order_words(str(roll['ordering']))}{via} brings {new}'s queries back to {old}'s self-test"
                    f"{flatter}." + why, adapter=roll.get("adapter"), ordering=roll["ordering"], fraction=p,
                    backfill_metric=on, items_to_reembed=items_for(p, n), remedy=pick["name"],
                    notes=("the backfill fraction is read off one curve over the evaluated queries, without an interval",),
                    **base)
    tried = "no adapter was tried" if not adapters else "no adapter is compatible"
    if c["verdict"] == "too close to call":
        m = margin_to_decide(c["lo"], c["hi"])
        needed = (f"{c['needed']:,} queries would decide compatibility" if c.get("needed") else
                  "no number of queries would decide compatibility (the paired difference sits on the threshold)")
        return Plan("do not ship yet", f"Too close to call: compatibility of {new}'s queries with the {old} gallery "
                    f"({interval(c, level)}), and {tried}.", margin_to_decide=m,
                    notes=unjudged + (needed, f"with --margin {m:g} (a non-inferiority margin: {new}'s queries may lose "
                                               f"up to {m:g} points against {old} alone) it would pass"), **base)
    what = ("no measured backfill reaches the old self-test" if judged and rollouts
            else "no backfill curve was measured" if judged else "a backfill is not recommended without a measured gain")
    return Plan("do not ship yet", f"{new} is not compatible with {old} ({interval(c, level)}), {tried} and {what}.",
                notes=unjudged, **base)
