"""Kinds named once (STYLE.md 14, issue 40): each kind of thing is a record in ``engine.core.kinds`` (or a vocabulary
of ``engine.core``), and its rule is written there once.

The scan reads every module outside ``engine/core`` (the engine, the app, storage, run_app.py) as Python's AST and fails
on a copy of a vocabulary: a literal tuple, list, set or name -> text dict that spells every name of a family (a new
kind would have to be added there too; see :func:`whole`), or a string that repeats a record's label or help (the pages' and the CLI's
wording comes from the record). A literal that names a few kinds is a choice, not a copy (``("recall", "map")``: the
metrics one pass computes). Registries that hold implementations (a dict whose values are code) name their kinds by
design; each is checked against its family below.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.core import kinds
from engine.core.contract import ANALYSIS_KINDS
from engine.core.kinds import STRICT, TIE_RULES, TIES, beats, check_ties
from engine.core.vocab import VIEWS

ROOT = Path(__file__).resolve().parents[1]
FAMILIES: dict[str, tuple[str, ...]] = {
    "tie rule": kinds.TIE_RULES, "rank tie rule": kinds.RANK_TIE_RULES, "metric": tuple(kinds.METRICS), "paper 004 adapter": kinds.PAPER_ADAPTERS,
    "post-hoc adapter": kinds.POSTHOC_ADAPTERS, "source": tuple(kinds.SOURCES), "qrels": tuple(kinds.QRELS),
    "job": tuple(kinds.JOBS),
    "view": VIEWS, "raw view": kinds.RAW_VIEWS, "compared view": kinds.COMPARED_VIEWS, "analysis": ANALYSIS_KINDS}
RECORDS = {"tie rule": kinds.TIES, "rank tie rule": kinds.RANK_TIES, "metric": kinds.METRICS, "adapter": kinds.ADAPTERS, "source": kinds.SOURCES,
           "qrels": kinds.QRELS, "job": kinds.JOBS, "view": kinds.VIEW_KINDS}
# (file, family): a literal that is legitimately a different thing, each with its reason; keep this short
ALLOWED: dict[tuple[str, str], str] = {
    ("engine/metrics/retrieval.py", "rank tie rule"): "RankTies, the type of a rank_ties parameter: a Literal spells its "
                                                      "names (test_rank_tie_rules_have_one_record checks them equal)"}


def texts() -> dict[str, str]:
    """Every record's label and help (the distinctive ones: not the name itself, five characters or more)."""
    out = {kinds.TIES_HELP: "TIES_HELP", kinds.SOURCE_HELP: "SOURCE_HELP", kinds.QRELS_HELP: "QRELS_HELP"}
    for family, records in RECORDS.items():
        for r in records.values():
            out.update({t: f"the {family} {r.name!r}" for t in (r.label, r.help) if t != r.name and len(t) >= 5})
    return out


def sources() -> list[Path]:
    files = [p for room in ("engine", "app", "storage") for p in sorted((ROOT / room).rglob("*.py"))]
    return [p for p in files + [ROOT / "run_app.py"] if (ROOT / "engine" / "core") not in p.parents]


def docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, nodes) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def spelled(node: ast.AST) -> list[str] | None:
    """The strings a literal collection spells (a tuple, list or set of strings; a dict's keys when its values are
    constants too: a name -> text table), None for anything else."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict) and all(isinstance(v, ast.Constant) for v in node.values):
        items = node.keys
    else:
        return None
    names = [e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return names if len(names) == len(items) else None


def whole(vocabulary: tuple[str, ...], names: list[str]) -> bool:
    """Whether ``names`` spells the whole vocabulary: exactly, or with more beside it when the vocabulary has three
    names or more (two names are often another thing's too: a verdict is pass, fail or unresolved)."""
    return set(names) == set(vocabulary) or (len(vocabulary) >= 3 and set(vocabulary) <= set(names))


def copies(path: Path, known: dict[str, str], allowed: dict[tuple[str, str], str] = ALLOWED) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where, docs = path.relative_to(ROOT).as_posix(), docstrings(tree)
    for node in ast.walk(tree):
        names = spelled(node)
        for family, vocabulary in FAMILIES.items() if names else ():
            if whole(vocabulary, names) and (where, family) not in allowed:
                yield f"{where}:{node.lineno} spells every {family} name {sorted(set(names))}: import the vocabulary"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known \
                and id(node) not in docs:
            yield f"{where}:{node.lineno} repeats the label or help of {known[node.value]}: read it from the record"


def test_no_kind_is_spelled_outside_the_core():
    known = texts()
    found = [line for path in sources() for line in copies(path, known)]
    assert not found, "\n".join(found)


def test_the_scan_finds_a_copy(tmp_path, monkeypatch):
    """The scan itself: a whole vocabulary, a name -> label table and a label are found; a choice of two kinds is not."""
    bad = tmp_path / "bad.py"
    bad.write_text('TIES = ("fail", "pass")\nNAMES = {"perp": "x", "lambda": "y", "fct": "z"}\nLABEL = "B⊥ + F"\n'
                   'TWO = ("recall", "map")\n', encoding="utf-8")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    found = list(copies(bad, texts()))
    assert [line.split(" ", 2)[:2] for line in found] == [["bad.py:1", "spells"], ["bad.py:2", "spells"],
                                                          ["bad.py:3", "repeats"]]


def test_every_allowed_literal_is_still_there():
    """An allow-list entry whose literal has gone is removed (the list stays short)."""
    known = texts()
    for (where, family), reason in ALLOWED.items():
        assert reason and any(f"every {family} name" in line for line in copies(ROOT / where, known, {})), where


def test_beats_is_the_ecc_comparison_under_each_tie_rule():
    cross = np.array([0.5, 0.6, 0.4, np.nan])
    old = np.array([0.5, 0.5, 0.5, 0.5])
    assert beats(cross, old, "fail").tolist() == [False, True, False, False]  # strict: an exact tie fails
    assert beats(cross, old, "pass").tolist() == [True, True, False, False]  # ties pass; NaN never beats
    assert beats(0.5, 0.5) is False and STRICT == "fail"  # the default is the papers' strict rule
    assert TIE_RULES == ("fail", "pass") and [TIES[t].label for t in TIE_RULES] == [">", ">="]


def test_rank_tie_rules_have_one_record():
    """Recall@k's rule for a negative tying the best positive: its own family, apart from the ECC tie rules."""
    from typing import get_args

    from engine.core.kinds import LIST_RANK_TIES, RANK_TIE_RULES, RANK_TIES, check_rank_ties
    from engine.core.vocab import RANK_TIE_READINGS
    from engine.metrics.retrieval import RankTies
    from engine.metrics.ties import JUDGED

    # trec (trec_eval's order by item id) is a rule of top-k lists only; the near-tie readings judge the other two
    assert get_args(RankTies) == RANK_TIE_RULES == ("pessimistic", "optimistic", "trec")
    assert JUDGED == ("pessimistic", "optimistic") and set(LIST_RANK_TIES) == {"pessimistic", "trec"}
    assert set(JUDGED) < set(RANK_TIE_READINGS) and not set(RANK_TIE_RULES) & set(TIE_RULES)
    assert all(r.help for r in RANK_TIES.values()) and check_rank_ties("optimistic") == "optimistic"
    with pytest.raises(ValueError, match="unknown rank-tie rule 'fail'"):
        check_rank_ties("fail")  # an ECC rule is not a rank-tie rule
    with pytest.raises(ValueError, match="unknown rank-tie rule 'optimistic'; use one of pessimistic, trec"):
        check_rank_ties("optimistic", LIST_RANK_TIES)


@pytest.mark.parametrize("bad", ["FAIL", "ge", None, 1])
def test_an_unknown_tie_rule_is_one_line(bad):
    with pytest.raises(ValueError, match="unknown tie rule") as e:
        beats(1.0, 0.0, bad)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown tie rule"):
        check_ties(bad)


def test_one_metric_grammar_and_one_bound_on_k():
    from engine.core.kinds import MAX_K, metric_label, metric_parts
    from engine.core.vocab import parse_metric
    from engine.upgrade.from_sources import parse_source_metric

    assert metric_parts(" Recall@10 ") == ("recall", 10) and metric_parts("map") == ("map", None)
    assert metric_parts(f"ndcg@{MAX_K}") == ("ndcg", MAX_K) and metric_parts("supersense_recall@1") == ("supersense_recall", 1)
    for bad in ("recall@0", f"recall@{MAX_K + 1}", "auc@5", "recall@", "recall@-1", "map@1.5"):
        assert metric_parts(bad) is None, bad
    # the three readers share the grammar and the bound; each keeps its own choice of kinds
    for read in (lambda m: parse_metric(m), lambda m: parse_source_metric(m, "labels")):
        assert read("recall@5") == ("recall", 5)
        with pytest.raises(ValueError):
            read(f"recall@{MAX_K + 1}")
    assert parse_source_metric("neighbour_recall@3", "none") == ("neighbour_recall", 3)
    with pytest.raises(ValueError, match="does not go with"):
        parse_source_metric("map", "labels")  # top-k lists: no full-ranking mAP
    with pytest.raises(ValueError, match="unknown metric"):
        parse_metric("ndcg@10")
    assert [metric_label(m) for m in ("recall@1", "map", "map@10", "ndcg@10", "neighbour_recall@10",
                                      "supersense_recall@1", "ndcg", "verification")] == [
        "Recall@1", "mAP", "mAP@10", "nDCG@10", "neighbour recall@10", "supersense Recall@1", "ndcg", "verification"]


def test_adapter_kinds_have_one_record_and_each_registry_covers_its_family():
    from engine.adapters.pair import KINDS
    from engine.adapters.onnx_graph import BUILDERS
    from engine.adapters.posthoc import POSTHOC
    from engine.core.contract import ADAPTER_KINDS
    from engine.core.kinds import ADAPTERS, PAPER_ADAPTERS, POSTHOC_ADAPTERS, adapter_label
    from engine.upgrade.text_upgrade import PAPER_KINDS, POSTHOC_KINDS

    assert KINDS == ADAPTER_KINDS == PAPER_ADAPTERS == ("perp", "lambda", "fct")  # what an adapters job fits
    assert tuple(POSTHOC) == POSTHOC_ADAPTERS == POSTHOC_KINDS  # the post-hoc registry is the family, in its order
    assert set(BUILDERS) == set(POSTHOC_ADAPTERS)  # every post-hoc map exports as an ONNX graph
    assert all(POSTHOC[k].formula for k in POSTHOC_ADAPTERS)  # and states its formula in the exported metadata
    assert PAPER_KINDS == ("perp", "lambda")  # the ones with a backward adapter B
    assert [adapter_label(k) for k in ("perp", "lambda", "fct", "mlp", "unknown")] == [
        "B⊥ + F", "B_λ + F", "FCT (F only)", "mlp", "unknown"]
    assert all(a.help and a.label for a in ADAPTERS.values())


def test_job_kinds_have_one_record_with_lane_and_priority():
    from engine.core.contract import JOB_KINDS, JOB_LANES, JOB_PRIORITY, SHORT_JOB_KINDS
    from engine.core.kinds import JOBS
    from engine.jobs.job_handlers import JOB_HANDLERS

    assert set(JOB_HANDLERS) == set(JOBS) and JOB_KINDS == tuple(JOBS)
    assert JOB_LANES == {"short": ("analysis", "adapters", "checkpoints", "sources_check"), "main": ("run",)}
    assert SHORT_JOB_KINDS == JOB_LANES["short"]
    assert JOB_PRIORITY == {"analysis": 0, "adapters": 0, "checkpoints": 1, "sources_check": 1, "run": 2}
    assert all(j.label and j.help for j in JOBS.values())


def test_a_job_is_labelled_from_its_payload_in_core():
    from engine.core.contract import job_label

    assert job_label("run", {"preset": "quick-demo"}) == "preset quick-demo"
    assert job_label("analysis", {"kind": "backfill", "experiment_id": 3, "params": {"step_a": 1, "step_b": 2}}) == \
        "backfill of experiment 3 (steps 1→2, encoder)"
    assert "secret" not in job_label("sources_check", {"sources": {"old_gallery": "https://u:secret@h/x.npy"},
                                                       "relevance": "labels"})
    assert job_label("search", {"label": "matrix", "cells": [{}, {}]}) == "matrix: 2 cells"
    assert job_label("cell", {"kind": "extract", "images": "cifar10", "model_version_id": 4, "split": "query"}) == \
        "extract: cifar10 by model version #4 (query)"
    assert job_label("adapters", {}) == "adapters" and job_label("reduce", {}) == "reduce"


def test_source_kinds_have_one_record_and_every_kind_a_reader():
    from engine.core.kinds import SOURCE_HELP, SOURCES
    from engine.sources import READERS
    from engine.sources.text import KINDS

    assert KINDS == tuple(SOURCES) == tuple(READERS)
    assert all(s.help in SOURCE_HELP for s in SOURCES.values())


def test_views_have_one_record():
    from app.checkpoint_form import VIEW_HELP
    from engine.checkpoints.request import VIEWS as COMPARED
    from engine.core import cell, contract
    from engine.core.kinds import COMPARED_VIEWS, DERIVED_VIEWS, RAW_VIEWS, VIEW_KINDS

    assert VIEWS == cell.VIEWS == tuple(VIEW_KINDS) == ("encoder", "logits", "softmax", "psp", "lsp")
    assert RAW_VIEWS == cell.RAW_VIEWS == contract.RAW_VIEWS == ("encoder", "logits", "softmax")
    assert DERIVED_VIEWS == contract.DERIVED_VIEWS == {"psp": "softmax", "lsp": "logits"}
    assert COMPARED == COMPARED_VIEWS == tuple(VIEW_HELP) == ("encoder", "psp", "lsp")
    assert VIEW_HELP["lsp"] == "lsp: logit vectors, centred and normalised"


def test_analysis_kinds_have_one_record_and_each_a_computation():
    from engine.core.contract import ANALYSIS_DEFAULTS
    from engine.core.kinds import ANALYSES
    from engine.jobs.analysis import ANALYSIS_RUNS

    assert ANALYSIS_KINDS == tuple(ANALYSES) == tuple(ANALYSIS_RUNS) and set(ANALYSIS_DEFAULTS) == set(ANALYSES)
    assert all(a.label and a.help for a in ANALYSES.values())
