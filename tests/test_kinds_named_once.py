"""Kinds named once (STYLE.md 14): each kind is a record in ``engine.core.kinds``; its rule is written there once."""
from __future__ import annotations

import numpy as np
import pytest

from engine.core.kinds import STRICT, TIE_RULES, TIES, beats, check_ties


def test_beats_is_the_ecc_comparison_under_each_tie_rule():
    cross = np.array([0.5, 0.6, 0.4, np.nan])
    old = np.array([0.5, 0.5, 0.5, 0.5])
    assert beats(cross, old, "fail").tolist() == [False, True, False, False]  # strict: an exact tie fails
    assert beats(cross, old, "pass").tolist() == [True, True, False, False]  # ties pass; NaN never beats
    assert beats(0.5, 0.5) is False and STRICT == "fail"  # the default is the papers' strict rule
    assert TIE_RULES == ("fail", "pass") and [TIES[t].label for t in TIE_RULES] == [">", ">="]


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
    from engine.adapters.posthoc import POSTHOC
    from engine.core.contract import ADAPTER_KINDS
    from engine.core.kinds import ADAPTERS, PAPER_ADAPTERS, POSTHOC_ADAPTERS, adapter_label
    from engine.upgrade.text_upgrade import PAPER_KINDS, POSTHOC_KINDS

    assert KINDS == ADAPTER_KINDS == PAPER_ADAPTERS == ("perp", "lambda", "fct")  # what an adapters job fits
    assert tuple(POSTHOC) == POSTHOC_ADAPTERS == POSTHOC_KINDS  # the post-hoc registry is the family, in its order
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
