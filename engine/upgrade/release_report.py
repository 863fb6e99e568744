"""A release report of one upgrade check, one self-contained file a release ticket can hold (HTML or Markdown).

The decision comes first (the migration plan's headline and reason, printed as the plan gives them: one decision,
many views), then the verdict sentence, the inputs (sources with passwords and secret options masked, row counts,
the command line, the tool's version, the date), the rule and the interval's settings, every number with its
interval, the cost of each option (items to re-embed and, when this run measured the new model's embedding
throughput, the time that takes), the adapters and the backfill curves as pictures, the threshold and the notes.

:func:`report_markdown` and :func:`report_html` take one JSON-ready dict (:func:`report_data`): the plan's JSON
(:meth:`engine.upgrade.migration.PlanInputs.to_json` with the report under ``report``) and ``context``
(:func:`report_context`). Plan fields they do not know (the plan grows) are listed as they are, never dropped and
never a crash. In HTML every string from the data is escaped and the file fetches nothing: a Content-Security-Policy
forbids it, the style is inline and the charts are inline SVG drawn by vl-convert (imported when a chart is drawn)
from inline data with no base URL allowed. Torch-free: the dashboard offers the same file for a stored check.
"""
from __future__ import annotations

import html
import json
import math
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from storage.secrets import mask_url
from engine.upgrade.plan import forecast_line, items_for, option_line, recovery_line
from engine.upgrade.words import NOT_JUDGED, pct, sentence

SUFFIXES = {".html": "html", ".htm": "html", ".md": "markdown"}
RANK_MERGE = "rank_merge:"  # engine.upgrade.migration's prefix of a rank-merge roll-out (that module needs numpy)
TOOL = "compatlab"
# the plan's fields this report renders in their own sections; any other field is listed under "More from the plan"
KNOWN = {"decision", "reason", "headline", "old_name", "new_name", "metric", "n_gallery", "adapter", "ordering",
         "fraction", "items_to_reembed", "numbers", "threshold", "notes", "adapters", "rollouts", "rescoring", "report",
         "markdown", "context", "error", "rule", "success", "guardrail", "backfill_metric", "margin_to_decide",
         "recovery", "options", "remedy", "vectors_to_transform", "transforms", "cascade"}
ADAPTER_KNOWN = {"name", "kind", "source", "pairs", "fit_seconds", "adapted_old", "old_old", "n_queries", "n_gallery",
                 "compatibility", "interval"}
DECISION_CLASS = {"ship as is": "go", "ship with adapter": "go", "transform the gallery": "go", "serve a cascade": "go",
                  "backfill": "wait", "re-embed the gallery": "wait", "do not ship yet": "wait", "do not ship": "stop"}
VERDICT_COLOURS = {"compatible": "#2e7d32", "not compatible": "#b71c1c", "too close to call": "#d98c00"}
# the dashboard's palettes (app/charts.py: SERIES_COLOURS, SERIES_DASHES): orderings look the same in both
SERIES_COLOURS = ("#009e73", "#cc79a7", "#0072b2", "#d55e00", "#56b4e9", "#e69f00", "#000000", "#999999")
SERIES_DASHES = ([1, 0], [6, 3], [2, 2], [8, 3, 2, 3], [12, 4], [3, 5])
STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
.decision{border-left:6px solid #777;background:#f4f4f4;padding:.8em 1.2em;margin:1em 0}
.decision.go{border-color:#2e7d32;background:#e8f5e9}.decision.stop{border-color:#b71c1c;background:#fdecea}
.decision.wait{border-color:#d98c00;background:#fff4e0}
.headline{font-size:1.5em;font-weight:600;margin:0 0 .3em}.muted{color:#555}
table{border-collapse:collapse;margin:.5em 0 1em}th,td{border:1px solid #ddd;padding:.3em .6em;text-align:left;
vertical-align:top}th{background:#fafafa}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.chosen td{background:#eef6ff;font-weight:600}code{background:#f4f4f4;padding:.1em .3em;overflow-wrap:anywhere}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}
"""


# ----------------------------------------------------------------------------------------------- the data
def tool_version() -> str:
    """The installed version of the tool (``unknown`` when it is run from a checkout that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(TOOL)
    except PackageNotFoundError:
        return "unknown"


def report_context(*, inputs: Mapping[str, Any], command: Sequence[str] | None = None,
                   embedding: Sequence[Mapping[str, Any]] | None = None, notes: Sequence[str] = (),
                   throughput_note: str = "this check read embeddings that were already computed",
                   now: datetime | None = None) -> dict[str, Any]:
    """The ``context`` of a report: ``inputs`` (label -> a path, a source text, a number or a list of them; masked),
    ``command`` (the arguments after ``python -m engine``; masked), the tool's version, the date (UTC, ISO 8601),
    the new model's embedding throughput when ``embedding`` (:func:`engine.checkpoints.compare.embedding_time` rows,
    old then new) measured one, else ``throughput_note`` says why it is unknown, and ``notes``."""
    rows: dict[str, str] = {}
    for key, value in inputs.items():
        if value is None or value == [] or value == {}:
            continue
        if isinstance(value, Mapping):
            rows.update({f"{key}: {k}": mask_url(v) for k, v in value.items() if v is not None})
        elif isinstance(value, (list, tuple)):
            rows[str(key)] = ", ".join(mask_url(v) for v in value)
        else:
            rows[str(key)] = mask_url(value)
    throughput, why = None, throughput_note
    if embedding:
        new = embedding[-1]
        if new.get("items", 0) > 0 and new.get("seconds", 0) > 0:
            throughput = {k: new[k] for k in ("model", "unit", "items", "seconds", "device", "cached") if k in new}
        else:
            why = (f"{new.get('model', 'the new model')}'s {new.get('unit', 'items')} were read from the embedding cache "
                   "in this run, so no embedding was timed")
    return {"command": None if command is None else "python -m engine " + " ".join(shlex.quote(mask_url(a)) for a in command),
            "version": tool_version(), "created": (now or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
            "inputs": rows, "throughput": throughput, "throughput_note": None if throughput else why,
            "notes": [mask_url(n) for n in notes]}


def report_data(plan: Mapping[str, Any] | None, report: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """The dict the renderers take: the plan's JSON (None: a check stored before plans existed) with ``report`` and
    ``context``."""
    base = dict(plan) if plan is not None else {"error": "this check was stored before migration plans existed"}
    return {**base, "report": dict(report), "context": dict(context)}


# ----------------------------------------------------------------------------------------------- shared pieces
def _points(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f} pts"


def _interval(c: Mapping[str, Any]) -> str:
    return "–" if c.get("lo") is None or c.get("hi") is None else f"{100 * c['lo']:+.1f} to {100 * c['hi']:+.1f}"


def duration(seconds: float) -> str:
    """A duration a person reads: ``12 ms``, ``4.2 s``, ``42 s``, ``3 min 20 s``, ``2 h 05 min``."""
    if seconds < 0.1:
        return f"{1000 * seconds:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def _scalar(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _is_scalar(x: Any) -> bool:
    return x is None or isinstance(x, (str, int, float, bool))


def _report(data: Mapping[str, Any]) -> Mapping[str, Any]:
    report = data.get("report")
    if not isinstance(report, Mapping):
        raise ValueError("the report data holds no upgrade report (the plan's JSON with 'report')")
    return report


def decision_lines(data: Mapping[str, Any]) -> tuple[str, str]:
    """The plan's headline and reason as given (``No migration plan`` and why, when there is none)."""
    if data.get("headline"):
        return f"Decision: {data['headline']}.", str(data.get("reason") or "")
    return "No migration plan.", str(data.get("error") or "the check has no migration plan")


def verdict_sentence(report: Mapping[str, Any]) -> str:
    """The report's own sentence (as stored), else the words module's."""
    return str(report.get("sentence") or sentence(report))


def number_rows(data: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every paired number with its interval: the cross-test, the new model alone, each adapter."""
    r = _report(data)
    old, new = r["old_name"], r["new_name"]
    c, b = r["compatibility"], r["better"]
    rows = [{"what": f"{new} queries on the {old} gallery vs {old} alone (compatibility)",
             "scores": f"{pct(r.get('new_old'))} vs {pct(r.get('old_old'))}", "difference": _points(c.get("diff")),
             "interval": _interval(c), "verdict": str(c.get("verdict")), "queries": f"{c.get('n', r.get('n_queries')):,}"}]
    judged = b.get("verdict") != NOT_JUDGED
    rows.append({"what": f"{new} alone vs {old} alone", "scores": f"{pct(r.get('new_new'))} vs {pct(r.get('old_old'))}"
                 if judged else "not measured", "difference": _points(b.get("diff")) if judged else "–",
                 "interval": _interval(b) if judged else "–", "verdict": str(b.get("verdict")),
                 "queries": f"{b.get('n', 0):,}" if judged else "–"})
    for a in data.get("adapters") or ():
        ac = a.get("compatibility") or {}
        rows.append({"what": f"adapter {a.get('name')}: {new} queries mapped onto the {old} gallery vs {old} alone",
                     "scores": f"{pct(a.get('adapted_old'))} vs {pct(a.get('old_old'))}",
                     "difference": _points(ac.get("diff")), "interval": _interval(ac), "verdict": str(ac.get("verdict")),
                     "queries": "–" if a.get("n_queries") is None else f"{a['n_queries']:,}"})
    return rows


def option_costs(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each option the check measured with its cost now: ``option``, ``items`` to re-embed (None: no fraction of
    the gallery does it), ``seconds`` at the measured throughput (None: unknown), what it rests on, and whether it
    is the plan's choice (read off the plan's decision, adapter and ordering, never decided here)."""
    r = _report(data)
    old, new, n = r["old_name"], r["new_name"], int(r["n_gallery"])
    level = f"{100 * r.get('level', 0.95):g}%"
    rate = _rate(data.get("context") or {})
    decision = data.get("decision")

    def row(option: str, items: int | None, basis: str, chosen: bool) -> dict[str, Any]:
        seconds = None if items is None or rate is None else items / rate
        return {"option": option, "items": items, "seconds": 0.0 if items == 0 else seconds, "basis": basis,
                "chosen": chosen}

    c = r["compatibility"]
    out = [row(f"ship {new} as is", 0, f"compatibility {c.get('verdict')} ({_points(c.get('diff'))}, {level} interval "
               f"{_interval(c)}); the gallery may be re-embedded later", decision == "ship as is")]
    for a in data.get("adapters") or ():
        ac = a.get("compatibility") or {}
        fit = f"; fitted in {duration(a['fit_seconds'])}" if isinstance(a.get("fit_seconds"), (int, float)) else ""
        out.append(row(f"ship with adapter {a.get('name')}", 0, f"the adapter on every query: {ac.get('verdict')} "
                       f"({_points(ac.get('diff'))}, {level} interval {_interval(ac)}){fit}",
                       decision == "ship with adapter" and data.get("adapter") == a.get("name")))
    for ro in data.get("rollouts") or ():
        via = f" with adapter {ro['adapter']}" if ro.get("adapter") else ""
        reach = ro.get("to_old_self")
        chosen = (decision == "backfill" and data.get("ordering") == ro.get("ordering")
                  and data.get("adapter") == ro.get("adapter"))
        if reach is None:
            out.append(row(_rollout_name(str(ro.get("ordering")), None, via), None,
                           f"never reaches {old}'s self-test on the measured curve", chosen))
            continue
        items = int(data["items_to_reembed"]) if chosen else items_for(float(reach), n)
        out.append(row(_rollout_name(str(ro.get("ordering")), reach, via), items,
                       f"reaches {old}'s self-test at {100 * reach:.0f}% of the gallery (one curve, no interval)", chosen))
    for t in data.get("transforms") or ():
        tc = t.get("compatibility") or {}
        out.append(row(f"transform the {old} gallery with {t.get('name')} (old -> new, no model)", 0,
                       f"{new}'s queries on the transformed gallery: {tc.get('verdict')} ({_points(tc.get('diff'))}, "
                       f"{level} interval {_interval(tc)}); one pass over {t.get('vectors', n):,} stored vectors",
                       decision == "transform the gallery" and data.get("remedy") == t.get("name")))
    if (cs := data.get("cascade")) is not None:
        cc = cs.get("compatibility") or {}
        out.append(row(f"serve a cascade: {old}'s top {int(cs['n']):,} re-scored by {new}", 0,
                       f"{cc.get('verdict')} ({_points(cc.get('diff'))}, {level} interval {_interval(cc)}); "
                       f"{int(cs['n']):,} candidates re-scored per query", decision == "serve a cascade"))
    b = r["better"]
    alone = (f"then {new} alone serves: {pct(r.get('new_new'))} vs {pct(r.get('old_old'))} for {old} ({b.get('verdict')})"
             if b.get("verdict") != NOT_JUDGED else f"then {new} alone serves (not measured here)")
    out.append(row(f"re-embed the whole gallery with {new}", n, alone, decision == "re-embed the gallery"))
    return out


def remedy_lines(data: Mapping[str, Any]) -> list[str]:
    """The plan's remedies side by side in words (:func:`engine.upgrade.plan.option_line`), as it stored them."""
    return [option_line(o, picked=bool(o.get("recommended"))) for o in data.get("options") or ()]


def _rollout_name(ordering: str, fraction: float | None, via: str) -> str:
    """``backfill 25% in order random``; a rank merge (``rank_merge:ORDER``) says that both models serve meanwhile."""
    share = "" if fraction is None else f"{100 * fraction:.0f}% "
    if ordering.startswith(RANK_MERGE):
        return f"rank merge (both models serve): re-embed {share}in order {ordering[len(RANK_MERGE):]}{via}"
    return f"backfill {share}in order {ordering}{via}"


def _rate(context: Mapping[str, Any]) -> float | None:
    t = context.get("throughput")
    return t["items"] / t["seconds"] if t and t.get("items") and t.get("seconds") else None


def throughput_line(data: Mapping[str, Any]) -> str:
    """The measured throughput the costs use, or why it is unknown."""
    context = data.get("context") or {}
    t = context.get("throughput")
    if t and _rate(context):
        cached = f"; {t['cached']:,} more read from the cache" if t.get("cached") else ""
        return (f"Measured embedding throughput of {t.get('model')}: {_rate(context):,.1f} {t.get('unit', 'items')}/s "
                f"({t['items']:,} {t.get('unit', 'items')} in {duration(t['seconds'])} on {t.get('device', '?')} in this "
                f"run, reading and preprocessing included{cached}); the times below are items / throughput.")
    return f"Throughput unknown: {context.get('throughput_note') or 'no embedding was timed in this run'}."


def input_rows(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The inputs table: the context's inputs, then the rows counted, the date, the tool and the command line."""
    r, context = _report(data), data.get("context") or {}
    rows = [(str(k), mask_url(v)) for k, v in (context.get("inputs") or {}).items()]
    missing = r.get("n_no_positive") or 0
    what = "positive" if r.get("relevance", "labels") == "labels" else "relevant item"
    rows += [("queries", f"{r.get('n_queries', 0):,}" + (f" ({missing:,} without a {what})" if missing else "")),
             ("gallery items", f"{r.get('n_gallery', 0):,}"),
             ("model names", f"old {r['old_name']}, new {r['new_name']}"),
             ("metric", str(r.get("metric")) + (f" ({r['convention']})" if r.get("convention") else ""))]
    rows += [("date (UTC)", str(context.get("created") or "–")), ("tool", f"{TOOL} {context.get('version') or 'unknown'}")]
    if context.get("command"):
        rows.append(("command line", mask_url(context["command"])))
    return rows


def rule_rows(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The verdict's rule and the interval's settings (and the plan's own rule or decision metric when it states one)."""
    r = _report(data)
    boot = r.get("bootstrap") or {}
    rows = [("rule", str(r.get("rule") or "strict ECC (cross-test > self-test, the papers' rule)"))]
    for key, label in (("rule", "the plan's rule"), ("decision_metric", "the plan decides on")):
        if isinstance(data.get(key), str) and data[key] != rows[0][1]:
            rows.append((label, data[key]))
    old, new = r.get("old_name"), r.get("new_name")
    for key, label in (("success", f"success ({new} alone vs {old} alone)"),
                       ("guardrail", f"guardrail ({new}'s queries on {old}'s gallery vs {old} alone)"),
                       ("backfill_metric", "backfill fractions read on")):
        if data.get(key):
            rows.append((label, str(data[key])))
    if data.get("margin_to_decide"):
        rows.append(("margin that would decide", f"{data['margin_to_decide']:g} points (see the notes)"))
    rows.append(("interval", f"paired {boot.get('method', 'percentile')} bootstrap over "
                 f"{boot.get('paired_over', r.get('interval', 'queries'))}, {r.get('resamples', 0):,} resamples, level "
                 f"{r.get('level', 0.95):g}, seed {r.get('seed')}"))
    if r.get("same_set"):
        rows.append(("protocol", "closed-set: the queries are the gallery, each query's own item excluded"))
    return rows


def threshold_text(data: Mapping[str, Any]) -> str | None:
    """The similarity threshold re-mapped to the same precision, in words (None: the plan has none)."""
    t = data.get("threshold")
    if not isinstance(t, Mapping) or t.get("t_old") is None:
        return None
    old, new = data.get("old_name"), data.get("new_name")
    after = ("no threshold under the new model reaches that precision" if t.get("t_new") is None else
             f"{t['t_new']:.4g} under {new} (precision {pct(t.get('precision_new'))}, recall {pct(t.get('recall_new'))})")
    return (f"{t['t_old']:.4g} under {old} (precision {pct(t.get('precision'))}, recall {pct(t.get('recall_old'))}) "
            f"-> {after}")


def curve_rows(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The roll-out curves the plan chose from (else the report's backfill and rank-merge curves), with their points."""
    r = _report(data)
    rows = data.get("rollouts")
    if rows is None:
        rows = [*(r.get("backfill") or ()), *(x for x in r.get("rollout") or () if x.get("ordering") != "rescoring")]
    return [x for x in rows if x.get("fractions") and x.get("values")]


def extra_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's fields this report has no section for (rendered as they are)."""
    return {k: v for k, v in data.items() if k not in KNOWN and not (k in ("rule", "decision_metric") and isinstance(v, str))}


def recovery_lines(data: Mapping[str, Any]) -> list[str]:
    """The recovery forecast read before fitting, then each adapter's recovery against its ceiling, in the plan's own
    words (:func:`engine.upgrade.plan.forecast_line`, :func:`engine.upgrade.plan.recovery_line`)."""
    r = _report(data)
    ahead = [f"forecast: {forecast_line(data['forecast'], r['old_name'], r['new_name'])}"] if data.get("forecast") else []
    return ahead + [recovery_line(row, r["old_name"], r["new_name"]) for row in data.get("recovery") or ()]


def notes(data: Mapping[str, Any]) -> list[str]:
    """The plan's notes, then the report's, then the context's (each once)."""
    r, context = _report(data), data.get("context") or {}
    out = [*(data.get("notes") or ()), *(r.get("notes") or ()), *(context.get("notes") or ())]
    return [mask_url(n) for n in dict.fromkeys(map(str, out))]


# ----------------------------------------------------------------------------------------------- Markdown
def _md(text: Any) -> str:
    """Text safe in Markdown (a table cell too): markup characters escaped, one line."""
    return re.sub(r"([\\`*\[\]<|])", r"\\\1", " ".join(_scalar(text).split()))


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return ["| " + " | ".join(map(_md, header)) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(_md(c) for c in row) + " |" for row in rows), ""]


def _md_generic(value: Any, indent: int = 0) -> list[str]:
    pad = "  " * indent
    if _is_scalar(value):
        return [f"{pad}- {_md(value)}"]
    if isinstance(value, Mapping):
        out = []
        for k, v in value.items():
            out += [f"{pad}- {_md(k)}: {_md(v)}"] if _is_scalar(v) else [f"{pad}- {_md(k)}:", *_md_generic(v, indent + 1)]
        return out
    if isinstance(value, (list, tuple)) and indent < 4:
        return [line for v in value for line in _md_generic(v, indent)] or [f"{pad}- (none)"]
    return [f"{pad}- {_md(json.dumps(value, default=str))}"]


def report_markdown(data: Mapping[str, Any]) -> str:
    """The report as Markdown: the decision first, tables for the numbers and costs, curves as tables of points."""
    r = _report(data)
    head, reason = decision_lines(data)
    lines = [f"# Upgrade report: {_md(r['old_name'])} -> {_md(r['new_name'])}", "", f"**{_md(head)}** {_md(reason)}", "",
             _md(verdict_sentence(r)), ""]
    lines += ["## Cost of each option", "", _md(throughput_line(data)), ""]
    lines += _md_table(("option", "items to re-embed", "embedding time", "rests on"),
                       [(("→ " if o["chosen"] else "") + o["option"] + (" (the plan's choice)" if o["chosen"] else ""),
                         "never" if o["items"] is None else f"{o['items']:,}", _cost_time(o), o["basis"])
                        for o in option_costs(data)])
    lines += ["## Inputs", ""]
    lines += _md_table(("input", "value"), input_rows(data))
    lines += ["## Rule", "", *_md_table(("setting", "value"), rule_rows(data))]
    lines += ["## Numbers", "", *_md_table(("comparison", "scores", "difference", f"{100 * r.get('level', 0.95):g}% interval",
                                            "verdict", "queries"),
                                           [tuple(x.values()) for x in number_rows(data)])]
    if data.get("numbers"):
        lines += ["The plan's numbers:", "", *(f"- {_md(k)}: {_md(v)}" for k, v in data["numbers"].items()), ""]
    if data.get("adapters"):
        lines += ["## Adapters", "", *_md_table(*_adapter_table(data))]
    if rem := remedy_lines(data):
        lines += ["## Remedies side by side", "", *(f"- {_md(x)}" for x in rem), ""]
    if rec := recovery_lines(data):
        lines += ["## Recovery against its ceiling", "", *(f"- {_md(x)}" for x in rec), ""]
    curves = curve_rows(data)
    if curves:
        lines += ["## Backfill curves", "", f"{_md(r.get('metric'))} of {_md(r['new_name'])}'s queries while the gallery "
                  "is re-embedded (the HTML report draws them):", ""]
        lines += _md_table(*_curve_table(data, curves))
    if (t := threshold_text(data)) is not None:
        lines += ["## Similarity threshold", "", f"- {_md(t)}", ""]
    if extra := extra_fields(data):
        lines += ["## More from the plan", "", *_md_generic(extra), ""]
    if found := notes(data):
        lines += ["## Notes", "", *(f"- {_md(n)}" for n in found), ""]
    return "\n".join(lines).rstrip() + "\n"


def _cost_time(o: Mapping[str, Any]) -> str:
    if o["items"] is None:
        return "–"
    if o["items"] == 0:
        return "none"
    return "throughput unknown" if o["seconds"] is None else f"about {duration(o['seconds'])}"


def _adapter_table(data: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The adapters' rows: the known columns, then any other scalar field of the rows (the plan grows)."""
    adapters = data.get("adapters") or ()
    old = data.get("old_name") or _report(data)["old_name"]
    extra = list(dict.fromkeys(k for a in adapters for k, v in a.items() if k not in ADAPTER_KNOWN and _is_scalar(v)))
    header = ["adapter", "fitted on", "pairs", f"adapted -> {old}", f"{old} alone", "gain", "interval", "verdict", *extra]
    rows = [[a.get("name"), a.get("source", "–"), "–" if a.get("pairs") is None else f"{a['pairs']:,}",
             pct(a.get("adapted_old")), pct(a.get("old_old")), _points((a.get("compatibility") or {}).get("diff")),
             _interval(a.get("compatibility") or {}), (a.get("compatibility") or {}).get("verdict"),
             *(_scalar(a.get(k)) for k in extra)] for a in adapters]
    return header, rows


def _curve_table(data: Mapping[str, Any], curves: Sequence[Mapping[str, Any]], *,
                 points: bool = True) -> tuple[list[str], list[list[str]]]:
    """Each curve's area and reach (and, for Markdown, its points: the HTML draws them)."""
    r = _report(data)
    old, new = r["old_name"], r["new_name"]
    header = ["order", "area", f"reaches {old}'s self-test", f"reaches {new}'s self-test"]
    rows = [[c.get("ordering"), pct(c.get("area")), _share(c.get("to_old_self")), _share(c.get("to_new_self"))]
            for c in curves]
    if points:
        header.append("points (fraction: value)")
        for row, c in zip(rows, curves):
            row.append(", ".join(f"{100 * f:.0f}%: {pct(v)}" for f, v in _thin(c["fractions"], c["values"])))
    return header, rows


def _share(x: float | None) -> str:
    return "never" if x is None else f"at {100 * x:.0f}%"


def _thin(fractions: Sequence[float], values: Sequence[float | None], most: int = 11) -> list[tuple[float, float | None]]:
    """At most ``most`` points of a curve, evenly spaced by index, the first and last kept."""
    pairs = list(zip(fractions, values))
    if len(pairs) <= most:
        return pairs
    keep = sorted({round(i * (len(pairs) - 1) / (most - 1)) for i in range(most)})
    return [pairs[i] for i in keep]


# ----------------------------------------------------------------------------------------------- charts
def _percent_format(values: Sequence[float]) -> str:
    """Enough decimals that five ticks over the values' range read apart (app/charts.py's percent_format)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    step = 100 * (max(finite) - min(finite)) / 5 if finite else 1.0
    return ".0%" if step >= 1 or step == 0 else f".{min(3, math.ceil(-math.log10(step)))}%"


def backfill_spec(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """A Vega-Lite spec of the roll-out curves with the two self-tests as dashed rules (None: no curve)."""
    curves = curve_rows(data)
    if not curves:
        return None
    r = _report(data)
    names = list(dict.fromkeys(str(c["ordering"]) for c in curves))
    points = [{"order": str(c["ordering"]), "fraction": f, "value": v} for c in curves
              for f, v in zip(c["fractions"], c["values"]) if v is not None]
    refs = [{"label": f"{r['old_name']} alone (self-test)", "value": r.get("old_old")}]
    if r.get("new_new") is not None and r["better"].get("verdict") != NOT_JUDGED:
        refs.append({"label": f"{r['new_name']} alone", "value": r["new_new"]})
    refs = [x for x in refs if x["value"] is not None]
    y_format = _percent_format([p["value"] for p in points] + [x["value"] for x in refs])
    x = {"field": "fraction", "type": "quantitative", "title": "fraction of the gallery re-embedded",
         "axis": {"format": ".0%"}, "scale": {"domain": [0, 1]}}
    return {"width": 620, "height": 300, "background": "white",
            "title": {"text": f"{r.get('metric')} of {r['new_name']}'s queries while the gallery is re-embedded",
                      "anchor": "start", "subtitle": "dashed: each model alone; a curve reaches the old self-test where "
                                                     "it crosses the lower line"},
            "layer": [
                {"data": {"values": points}, "mark": {"type": "line", "point": {"size": 30, "filled": True}},
                 "encoding": {"x": x, "y": {"field": "value", "type": "quantitative", "title": str(r.get("metric")),
                                            "axis": {"format": y_format}, "scale": {"zero": False}},
                              "color": {"field": "order", "type": "nominal", "title": "order", "scale": {
                                  "domain": names, "range": [SERIES_COLOURS[i % len(SERIES_COLOURS)] for i in range(len(names))]}},
                              "strokeDash": {"field": "order", "type": "nominal", "title": "order", "scale": {
                                  "domain": names, "range": [SERIES_DASHES[i % len(SERIES_DASHES)] for i in range(len(names))]}}}},
                {"data": {"values": refs}, "mark": {"type": "rule", "strokeDash": [6, 4], "color": "black"},
                 "encoding": {"y": {"field": "value", "type": "quantitative"}}},
                {"data": {"values": refs}, "mark": {"type": "text", "align": "left", "baseline": "bottom", "dx": 3, "dy": -3,
                                                    "fontSize": 11},
                 "encoding": {"x": {"datum": 0, "type": "quantitative", "scale": {"domain": [0, 1]}},
                              "y": {"field": "value", "type": "quantitative"}, "text": {"field": "label"}}}]}


def gain_spec(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """A Vega-Lite spec of each way to serve the new queries on the old gallery (as is, each adapter): the gain over the
    old self-test in points with its interval, coloured by verdict, and the rule's threshold (None: nothing to draw)."""
    r = _report(data)
    level = f"{100 * r.get('level', 0.95):g}%"
    rows = [(f"{r['new_name']} as is", r["compatibility"])]
    rows += [(f"adapter {a.get('name')}", a.get("compatibility") or {}) for a in data.get("adapters") or ()]
    values = [{"option": name, "gain": 100 * c["diff"], "lo": 100 * c["lo"], "hi": 100 * c["hi"],
               "verdict": str(c.get("verdict"))} for name, c in rows
              if all(isinstance(c.get(k), (int, float)) for k in ("diff", "lo", "hi"))]
    if not values:
        return None
    threshold = -float(r.get("margin") or 0.0)
    verdicts = list(dict.fromkeys(v["verdict"] for v in values))
    y = {"field": "option", "type": "nominal", "title": None, "sort": None, "axis": {"labelLimit": 320}}
    colour = {"field": "verdict", "type": "nominal", "title": "verdict", "scale": {
        "domain": verdicts, "range": [VERDICT_COLOURS.get(v, "#555555") for v in verdicts]}}
    return {"width": 560, "height": {"step": 34}, "background": "white",
            "title": {"text": f"Gain over {r['old_name']} alone on the {r['old_name']} gallery (points, {level} interval)",
                      "anchor": "start", "subtitle": "compatible when the whole interval lies right of the dashed line"},
            "layer": [
                {"data": {"values": values}, "mark": {"type": "rule", "strokeWidth": 3},
                 "encoding": {"y": y, "x": {"field": "lo", "type": "quantitative", "title": "gain (points)"},
                              "x2": {"field": "hi"}, "color": colour}},
                {"data": {"values": values}, "mark": {"type": "point", "filled": True, "size": 90},
                 "encoding": {"y": y, "x": {"field": "gain", "type": "quantitative"}, "color": colour}},
                {"data": {"values": [{"t": threshold}]}, "mark": {"type": "rule", "strokeDash": [6, 4], "color": "black"},
                 "encoding": {"x": {"field": "t", "type": "quantitative"}}}]}


def svg(spec: Mapping[str, Any]) -> str | None:
    """The spec drawn as an SVG string by vl-convert, fetching nothing (None: vl-convert is not installed)."""
    try:
        import vl_convert
    except ImportError:
        return None
    out = vl_convert.vegalite_to_svg(dict(spec), allowed_base_urls=[])
    return re.sub(r"^<\?xml[^>]*>\s*", "", out)


# ----------------------------------------------------------------------------------------------- HTML
def _h(text: Any) -> str:
    return html.escape(_scalar(text), quote=True)


def _h_table(header: Sequence[str], rows: Sequence[Sequence[Any]], *, numeric: Sequence[int] = (),
             chosen: Sequence[bool] = ()) -> str:
    head = "".join(f"<th>{_h(x)}</th>" for x in header)
    marked, num = ' class="chosen"', ' class="num"'
    body = "".join(
        f"<tr{marked if i < len(chosen) and chosen[i] else ''}>"
        + "".join(f"<td{num if j in numeric else ''}>{_h(c)}</td>" for j, c in enumerate(row)) + "</tr>"
        for i, row in enumerate(rows))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _h_generic(value: Any, depth: int = 0) -> str:
    if _is_scalar(value):
        return _h(value)
    if isinstance(value, Mapping) and depth < 5:
        return "<ul>" + "".join(f"<li><b>{_h(k)}</b>: {_h_generic(v, depth + 1)}</li>" for k, v in value.items()) + "</ul>"
    if isinstance(value, (list, tuple)) and depth < 5:
        return "<ul>" + "".join(f"<li>{_h_generic(v, depth + 1)}</li>" for v in value) + "</ul>" if value else "(none)"
    return f"<code>{_h(json.dumps(value, default=str))}</code>"


def _figure(spec: dict[str, Any] | None, caption: str, draw: Callable[[Mapping[str, Any]], str | None]) -> str:
    if spec is None:
        return ""
    drawn = draw(spec)
    if drawn is None:
        return f"<p class=\"muted\">(no chart: vl-convert-python is not installed) {_h(caption)}</p>"
    return f"<figure>{drawn}<figcaption class=\"muted\">{_h(caption)}</figcaption></figure>"


def report_html(data: Mapping[str, Any], *, draw: Callable[[Mapping[str, Any]], str | None] = svg) -> str:
    """The report as one self-contained HTML page (see the module docstring); ``draw`` turns a Vega-Lite spec into
    inline SVG (vl-convert by default)."""
    r = _report(data)
    old, new = r["old_name"], r["new_name"]
    head, reason = decision_lines(data)
    level = f"{100 * r.get('level', 0.95):g}%"
    parts = [f"<h1>Upgrade report: {_h(old)} → {_h(new)}</h1>",
             f"<section class=\"decision {DECISION_CLASS.get(str(data.get('decision')), '')}\">"
             f"<p class=\"headline\">{_h(head)}</p><p>{_h(reason)}</p></section>",
             f"<p>{_h(verdict_sentence(r))}</p>",
             "<!-- costs -->",
             "<h2>Inputs</h2>", _h_table(("input", "value"), input_rows(data)),
             "<h2>Rule</h2>", _h_table(("setting", "value"), rule_rows(data)),
             "<h2>Numbers</h2>",
             _h_table(("comparison", "scores", "difference", f"{level} interval", "verdict", "queries"),
                      [tuple(x.values()) for x in number_rows(data)], numeric=(2, 3, 5))]
    if data.get("numbers"):
        parts += ["<p>The plan's numbers:</p><ul>", *(f"<li>{_h(k)}: {_h(v)}</li>" for k, v in data["numbers"].items()),
                  "</ul>"]
    parts.append(_figure(gain_spec(data), f"each way to serve {new}'s queries on the {old} gallery now", draw))
    costs = option_costs(data)
    at = parts.index("<!-- costs -->")  # the costs right after the decision: what a release ticket weighs first
    parts[at: at + 1] = ["<h2>Cost of each option</h2>", f"<p>{_h(throughput_line(data))}</p>",
                         _h_table(("option", "items to re-embed", "embedding time", "rests on"),
                                  [(o["option"] + (" (the plan's choice)" if o["chosen"] else ""),
                                    "never" if o["items"] is None else f"{o['items']:,}", _cost_time(o), o["basis"])
                                   for o in costs], numeric=(1, 2), chosen=[o["chosen"] for o in costs])]
    if data.get("adapters"):
        header, rows = _adapter_table(data)
        parts += ["<h2>Adapters</h2>",
                  "<p>Post-hoc maps from the new embedding space to the old one, applied to each new query: an exported "
                  "adapter's weights act on row vectors, x @ W (+ b), with W stored (new_dim, old_dim) "
                  "(adapter.json says so under files.weights_orientation).</p>",
                  _h_table(header, rows, numeric=(2, 3, 4, 5, 6))]
    if rem := remedy_lines(data):
        parts += ["<h2>Remedies side by side</h2><ul>", *(f"<li>{_h(x)}</li>" for x in rem), "</ul>"]
    if rec := recovery_lines(data):
        parts += ["<h2>Recovery against its ceiling</h2><ul>", *(f"<li>{_h(x)}</li>" for x in rec), "</ul>"]
    curves = curve_rows(data)
    if curves:
        parts += ["<h2>Backfill curves</h2>",
                  _figure(backfill_spec(data), "each point is a share of the gallery re-embedded with the new model in "
                          "that order; read off one curve over the evaluated queries, without an interval", draw),
                  _h_table(*_curve_table(data, curves, points=False), numeric=(1,))]
    if (t := threshold_text(data)) is not None:
        parts += ["<h2>Similarity threshold</h2>", f"<p>{_h(t)}</p>"]
    if extra := extra_fields(data):
        parts += ["<h2>More from the plan</h2>", _h_generic(extra)]
    if found := notes(data):
        parts += ["<h2>Notes</h2><ul>", *(f"<li>{_h(n)}</li>" for n in found), "</ul>"]
    csp = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">"
            f"<title>{_h(f'Upgrade report: {old} -> {new}: {head}')}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(p for p in parts if p) + "\n</body></html>\n")


def render(data: Mapping[str, Any], suffix: str) -> str:
    """The report in the format a file suffix names (:data:`SUFFIXES`)."""
    kind = SUFFIXES.get(suffix.lower())
    if kind is None:
        raise ValueError(f"a report is {', '.join(SUFFIXES)}; got {suffix or 'no suffix'!r}")
    return report_html(data) if kind == "html" else report_markdown(data)


__all__ = ["SUFFIXES", "backfill_spec", "gain_spec", "option_costs", "render", "report_context", "report_data",
           "report_html", "report_markdown", "svg"]
