"""The summary of a text-embedding upgrade (the ``text_upgrade`` analysis of a text comparison), as the Checkpoints
page shows it: a verdict per pair of models, the T x T matrix of a chosen metric with each cross-test marked by its
pair's paired verdict, every metric per pair (qrels, supersense-level and label-free), the adapters fitted per pair
(paper 004's and the post-hoc ones) and the engine's notes.

The worker computes and stores the summary (``engine.core.contract``'s ``text_upgrade`` kind); this module only reads
the stored payload. The formatting helpers are pure (``tests/test_app_text_upgrade.py`` checks them by hand).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from app import charts
from app import queries as q
from app.checkpoint_form import PREFIX
from app.widgets import MISSING, analysis_result, experiment_label, follow_jobs, plain
from engine.core.conventions import metric_name
from engine.core.kinds import adapter_label, metric_parts
from engine.read.requests import parse_dataset, parse_options, text_corpus
from engine.read.verdicts import interval_text, pct

KIND = "text_upgrade"
PARAMS: dict[str, Any] = {}  # the contract's defaults: k 10, 1,000 resamples, 95%, seed 0, adapters fitted
HEADLINE_METRIC = "recall@1"
VERDICT_MARK = {"compatible": "✓", "not compatible": "✗", "too close to call": "?"}
PAIRED_WORD = {"compatible": "pass", "not compatible": "fail", "too close to call": "unresolved"}  # charts.matrix_frame
PSP_LSP_LINE = ("PSP and LSP do not apply: a sentence encoder has no classifier head (no class probabilities or "
                "logits to project onto shared classes), so its models are compared on the encoder view only.")


# ---------------------------------------------------------------------------------------------- pure helpers


def text_task(config: Mapping[str, Any]) -> str | None:
    """The task of a text comparison's corpus (``qrels`` or ``class``), or None when the experiment is not one."""
    dataset = text_corpus(config.get("spec") or {}) if config.get("source") == "checkpoints" else None
    return None if dataset is None else parse_options(parse_dataset(dataset)[1]).task


def verdict_label(verdict: str | None) -> str:
    """'✗ not compatible' (the verdict with its mark); '–' when there is none."""
    return MISSING if not verdict else f"{VERDICT_MARK.get(verdict, '')} {verdict}".strip()


def meaning(metric: str, task: str = "qrels") -> str:
    """What a metric of the summary measures, in one phrase (``task``: the corpus's, qrels or class)."""
    parts = metric_parts(metric)
    if parts is None or parts[1] is None:
        return metric
    kind, k = parts
    own = "its own definition" if task == "qrels" else "a definition of its supersense"
    top = "the top hit" if k == 1 else f"among the top {k}"
    if kind == "recall":
        return f"{metric_name(metric)}: share of sentences with {own} {'as ' + top if k == 1 else top}"
    if kind == "map":
        return (f"{metric_name(metric)}: mean average precision in the top {k}"
                + (" (one relevant definition: the mean of 1 / its rank)" if task == "qrels" else ""))
    if kind == "ndcg":
        return f"{metric_name(metric)}: discounted gain of {own} by its rank in the top {k}"
    if kind == "supersense_recall":
        return (f"{metric_name(metric)}: {top} is a definition of the sentence's supersense (one of WordNet's 45 "
                "classes): the class-level task")
    return (f"{metric_name(metric)}: label-free, the share of the new model's own top {k} (new/new, the reference, "
            "so not shown) that a search returns")


def meanings_line(metrics: Sequence[str], task: str = "qrels") -> str:
    """Every metric's meaning, in one line."""
    return " · ".join(meaning(m, task) for m in metrics)


def pair_name(models: Sequence[str], pair: Mapping[str, Any]) -> str:
    """'minilm_l3 → minilm_l6' (old → new)."""
    return f"{models[pair['old']]} → {models[pair['new']]}"


def pair_row(pair: Mapping[str, Any], metric: str) -> Mapping[str, Any] | None:
    """A pair's row for ``metric``, or None."""
    return next((r for r in pair["rows"] if r["metric"] == metric), None)


def headline(payload: Mapping[str, Any], pair: Mapping[str, Any], metric: str = HEADLINE_METRIC) -> str | None:
    """A pair's verdict in one sentence: 'minilm_l6 queries on the minilm_l3 index: not compatible, Recall@1 6.3% vs
    20.0% for minilm_l3 alone (-13.7 points, 95% CI ... over 500 queries); minilm_l6 alone 23.0%.'"""
    row = pair_row(pair, metric) or (pair["rows"][0] if pair["rows"] else None)
    if row is None:
        return None
    old, new = payload["models"][pair["old"]], payload["models"][pair["new"]]
    m = metric_name(row["metric"])
    c = payload["corpus"]
    over = (f"{c['queries']:,} queries and {c['gallery']:,} gallery items" if row.get("interval") == "two-way"
            else f"{c['queries']:,} queries")  # what the interval resampled (Recall@k: both, as check-upgrade)
    change = ("" if row.get("diff") is None or row.get("lo") is None else
              f" ({interval_text(row['diff'], row['lo'], row['hi'], payload['level'])} over {over})")
    alone = "" if row.get("new_new") is None else f"; {new} alone {pct(row['new_new'])}"
    return (f"{new} queries on the {old} index: {row['verdict']}, {m} {pct(row['new_old'])} vs "
            f"{pct(row['old_old'])} for {old} alone{change}{alone}.")


def matrix_arrays(payload: Mapping[str, Any], metric: str) -> tuple[np.ndarray, np.ndarray, dict[str, list]]:
    """``(C, ecc, paired)`` of one metric for ``app.charts.matrix_frame``: C with NaN where not defined, a cross-test
    failing where its pair's verdict is *not compatible*, and the pairs' verdicts and intervals at their cells
    (row = the new model's queries, column = the old model's index)."""
    C = np.array([[np.nan if v is None else float(v) for v in row] for row in payload["matrices"][metric]], float)
    T = C.shape[0]
    ecc = np.ones((T, T), int)
    paired: dict[str, list] = {name: [[None] * T for _ in range(T)] for name in ("verdict", "lo", "hi")}
    for pair in payload["pairs"]:
        row = pair_row(pair, metric)
        if row is None:
            continue
        t, k = pair["new"], pair["old"]
        paired["verdict"][t][k] = PAIRED_WORD.get(row["verdict"])
        paired["lo"][t][k], paired["hi"][t][k] = row.get("lo"), row.get("hi")
        ecc[t, k] = 0 if row["verdict"] == "not compatible" else 1
    return C, ecc, paired


def _percent(x: float | None) -> float | None:
    return None if x is None else 100 * float(x)


def _ci(row: Mapping[str, Any]) -> str | None:
    return None if row.get("lo") is None else f"{100 * row['lo']:+.1f} to {100 * row['hi']:+.1f}"


def pairs_frame(payload: Mapping[str, Any]) -> pd.DataFrame:
    """Every pair and metric: old/old, new/old, new/new in %, the difference (new/old - old/old) in points, its
    interval and the verdict with its mark."""
    level = f"{100 * payload['level']:g}% CI (points)"
    rows = [{"pair": pair_name(payload["models"], pair), "metric": metric_name(r["metric"]),
             "old/old %": _percent(r.get("old_old")), "new/old %": _percent(r.get("new_old")),
             "new/new %": _percent(r.get("new_new")), "difference (points)": _percent(r.get("diff")),
             level: _ci(r), "verdict": verdict_label(r.get("verdict"))}
            for pair in payload["pairs"] for r in pair["rows"]]
    return pd.DataFrame(rows, columns=["pair", "metric", "old/old %", "new/old %", "new/new %", "difference (points)",
                                       level, "verdict"])


def _kind_name(row: Mapping[str, Any]) -> Any:
    """An adapter's kind as the pages name it: paper 004's by their formula (``B⊥ + F``), post-hoc ones as they are."""
    return adapter_label(row.get("kind"))


def adapters_frame(rows: Sequence[Mapping[str, Any]], level: float) -> pd.DataFrame:
    """A pair's adapters: family, kind, Recall@1 of adapted queries on the old index (%), its share of new/new, the
    difference to the old model alone (points), its interval, the verdict, Recall@10 and what they were fitted on."""
    ci = f"{100 * level:g}% CI (points)"
    out = [{"family": r.get("family"), "kind": _kind_name(r),
            "Recall@1 %": _percent(r.get("recall@1")),
            "share of new/new %": _percent(r.get("share_of_new_new")), "difference (points)": _percent(r.get("diff")),
            ci: _ci(r), "verdict": verdict_label(r.get("verdict")), "Recall@10 %": _percent(r.get("recall@10")),
            "fitted on": r.get("fitted_on"), "pairs": r.get("pairs")} for r in rows]
    return pd.DataFrame(out, columns=["family", "kind", "Recall@1 %", "share of new/new %", "difference (points)", ci,
                                      "verdict", "Recall@10 %", "fitted on", "pairs"])


def table_height(rows: int) -> int:
    """Pixels that show a dataframe's ``rows`` rows and its header without a scroll bar."""
    return 35 * (rows + 1) + 3


def corpus_line(payload: Mapping[str, Any]) -> str:
    """The corpus, the paired test (what it resamples, its seed) and the rule, in one line."""
    c = payload["corpus"]
    train = f" · {c['train_texts']:,} training texts for the adapters" if c.get("train_texts") else ""
    return (f"WordNet {c['task']}: {c['queries']:,} example sentences (queries) against {c['gallery']:,} definitions "
            f"(gallery), sample seed {c['seed']}{train} · encoder view · paired percentile bootstrap over the queries "
            f"(for Recall@k also over the gallery items, as the Upgrade check), {payload['resamples']:,} resamples, "
            f"seed {payload['seed']}, {100 * payload['level']:g}% intervals · strict ECC: new/old must score above "
            "old/old (a tie is not compatible)")


# ---------------------------------------------------------------------------------------------- rendering

VERDICT_BOX = {"compatible": st.success, "not compatible": st.error, "too close to call": st.warning}
_PERCENT = st.column_config.NumberColumn(format="%.1f")


def show_matrix(payload: Mapping[str, Any], metrics: Sequence[str], *, key: str) -> None:
    """The T x T matrix of a chosen metric, each cross cell marked by its pair's verdict, beside how to read it."""
    models, task = payload["models"], payload["corpus"].get("task", "qrels")
    chart_column, text_column = st.columns([3, 2])
    metric = text_column.selectbox("Metric", metrics, format_func=metric_name, key=f"{key}_metric")
    text_column.caption(plain(f"{meaning(metric, task)}."))
    text_column.caption(plain("Row = query model (new), column = the model that embedded the index (old). Each cross "
                              "cell is marked by its pair's paired verdict: ✓ compatible, ✗ not compatible (red), ? too "
                              "close to call (dashed): new queries on the old index against the old model alone. The "
                              "label-free metric has no matrix: its reference is new/new."))
    C, ecc, paired = matrix_arrays(payload, metric)
    frame = charts.matrix_frame(C, ecc, models, paired=paired)
    chart_column.altair_chart(charts.matrix_heatmap(frame, models, title=f"{metric_name(metric)} (%)",
                                                    metric=metric_name(metric)), width="content")


def show_summary(payload: Mapping[str, Any], *, key: str = "tu") -> None:
    """The stored summary: a verdict per pair, then tabs with the matrix, every metric, the adapters and the notes."""
    models, task = payload["models"], payload["corpus"].get("task", "qrels")
    for pair in payload["pairs"]:
        if (line := headline(payload, pair)) is not None:
            row = pair_row(pair, HEADLINE_METRIC) or pair["rows"][0]
            VERDICT_BOX.get(row["verdict"], st.info)(plain(line))
        if d := pair.get("decision"):  # the pair's one decision (engine.upgrade.plan), stored with the summary
            st.info(plain(f"Decision for {pair_name(models, pair)}: {d['headline']}. {d['reason']}"),
                    icon=":material/route:")
    st.caption(plain(corpus_line(payload)))
    notes = payload.get("notes", [])
    matrix_tab, metrics_tab, adapters_tab, notes_tab = st.tabs(
        ["Matrix", "Every metric per pair", "Adapters", f"Notes ({len(notes)})"])
    with matrix_tab:
        shown = [m for m in payload["metrics"] if m in payload.get("matrices", {})]
        if shown:
            show_matrix(payload, shown, key=key)
        else:
            st.caption("No matrix in this summary: its metrics are label-free (new/new is their reference).")
    with metrics_tab:
        frame = pairs_frame(payload)
        st.dataframe(frame, hide_index=True, width="stretch", height=table_height(len(frame)), placeholder=MISSING,
                     column_config={"old/old %": _PERCENT,
                                    "new/old %": st.column_config.NumberColumn(
                                        format="%.1f", help="new queries on the old index: the cross-test"),
                                    "new/new %": st.column_config.NumberColumn(
                                        format="%.1f", help="– for the label-free metric: new/new is its reference"),
                                    "difference (points)": st.column_config.NumberColumn(
                                        format="%+.1f", help="new/old − old/old")})
        st.caption(plain(meanings_line(payload["metrics"], task)))
    with adapters_tab:
        adapters = [a for a in payload.get("adapters", []) if a.get("rows")]
        if not adapters:
            st.caption("No adapters in this summary (computed without them, or none could be fitted: see the notes).")
        for a in adapters:
            st.markdown(f"**{plain(pair_name(models, a))}**: {plain(models[a['new']])} queries mapped into "
                        f"{plain(models[a['old']])}'s space, searched on the {plain(models[a['old']])} index")
            st.dataframe(adapters_frame(a["rows"], payload["level"]), hide_index=True, width="stretch",
                         height=table_height(len(a["rows"])), placeholder=MISSING, column_config={
                             "Recall@1 %": _PERCENT, "Recall@10 %": _PERCENT,
                             "share of new/new %": st.column_config.NumberColumn(
                                 format="%.0f", help="adapted Recall@1 as a share of the new model's own (new/new)"),
                             "difference (points)": st.column_config.NumberColumn(
                                 format="%+.1f", help="adapted Recall@1 − the old model alone (old/old)")})
        if adapters:
            st.caption("paper 004: the mapping adapters the Upgrade check page fits; post-hoc: the maps of "
                       "`adapter fit` (Procrustes, affine, ...). Share of new/new: adapted Recall@1 over the new model's "
                       "own. The verdict judges adapted queries on the old index against the old model alone, as the "
                       "cross-test.")
    with notes_tab:
        for note in notes:
            st.markdown(f"- {plain(note)}")
        if not notes:
            st.caption("The engine left no notes on this summary.")
    st.caption(PSP_LSP_LINE)


def text_experiments(url: str) -> list[dict[str, Any]]:
    """The stored text comparisons, newest first."""
    return [e for e in q.experiments(url) if text_task(e["config"]) is not None]


def launched_text_job(url: str) -> dict[str, Any] | None:
    """The text comparison this session queued on the Checkpoints page (its job), or None."""
    result = st.session_state.get(PREFIX + "result") or {}
    spec = result.get("spec") or {}
    if "job_id" not in result or text_task({"source": "checkpoints", "spec": spec}) is None:
        return None
    return next((j for j in q.jobs(url) if j["id"] == result["job_id"]), None)


def text_results_exist(url: str) -> bool:
    """Whether the Checkpoints page has text-upgrade results to show: a stored text comparison, or this session's
    text comparison queued or running."""
    job = launched_text_job(url)
    return bool(text_experiments(url)) or (job is not None and job["status"] in q.ACTIVE)


def text_upgrade_section(url: str) -> None:
    """The Checkpoints page's "Text-embedding upgrade results": pick a text comparison (newest first) and show its
    stored summary, or its job, or a button to compute it (a text comparison's job queues its summary itself:
    ``engine.jobs.job_handlers.checkpoints_job``)."""
    job = launched_text_job(url)
    experiments = text_experiments(url)
    st.caption("Every pair of models judged on the same queries (new queries on the old index against the old model "
               "alone): the matrices, every metric, and the adapters that map new queries into the old space.")
    if job is not None and job["status"] in q.ACTIVE:
        follow_jobs(url, "checkpoints")  # redraws the page when the comparison is stored
        st.caption("Its summary is queued as soon as the comparison is stored (the worker does it), and shown here.")
    if not experiments:
        return
    labels = {e["id"]: experiment_label(e) for e in experiments}
    picked = st.selectbox("Text comparison", list(labels), format_func=labels.get, key=PREFIX + "text_experiment")
    experiment = next(e for e in experiments if e["id"] == picked)
    result = analysis_result(url, experiment, KIND, PARAMS, what="the text-upgrade summary",
                             button_key=PREFIX + "text_summary_compute")
    if result is not None:
        show_summary(result["payload"], key=PREFIX + "tu")
