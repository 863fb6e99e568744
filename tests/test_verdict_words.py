"""One verdict vocabulary: the Overview says a stored pair's paired verdict in the Upgrade check's words (AppTest on a
hand-made matrix whose point estimates pass the criterion while the interval straddles 0), and backfilling needs are
quoted per metric, the one that does not flatter first."""
from __future__ import annotations

import numpy as np
import pytest

from engine.core.config import RunConfig
from engine.metrics import summarize
from engine.results.verdict_words import RECALL1_ARTEFACT, artefact_note, matrix_verdict, metric_order, needs_lines, verdict_word
from engine.upgrade.words import HEADS
from storage import create_experiment, get_engine, save_matrix, session_scope, set_experiment_status
from support.app_overview import overview


def test_the_words_are_the_upgrade_checks():
    assert {verdict_word(v) for v in ("pass", "fail", "unresolved")} == set(HEADS)
    assert verdict_word(None) is None


def test_matrix_verdict_in_words():
    assert matrix_verdict([[None, None], ["unresolved", None]]) == "too close to call"
    three = [[None] * 3, ["pass", None, None], ["unresolved", "pass", None]]
    assert matrix_verdict(three) == "2 compatible, 1 too close to call"
    assert matrix_verdict([[None]]) is None


def test_backfill_needs_lead_with_the_metric_that_does_not_flatter():
    assert metric_order(["recall@1", "recall@10", "map", "recall@5"]) == ["map", "recall@10", "recall@5", "recall@1"]
    lines = needs_lines({"recall@1": 0.05, "map": None, "recall@10": 0.5}, "v2")
    assert lines == ["mAP: never reaches v2's self-test", "Recall@10: reaches v2's self-test after 50% of the gallery",
                     "Recall@1: reaches v2's self-test after 5% of the gallery"]
    assert artefact_note(["map", "recall@1"]) == RECALL1_ARTEFACT and artefact_note(["map", "recall@5"]) is None


def test_overview_gives_the_paired_verdict_next_to_a_point_estimate_ac(app_db):
    C = np.array([[0.759, np.nan], [0.760, 0.80]])  # 76.0 > 75.9: AC 100 % by strict ECC on point estimates
    summary = {**summarize(C), "ties": "fail", "comparable": [[True, False], [True, True]],
               "paired": {"diff": [[None, None], [0.001, None]], "lo": [[None, None], [-0.023, None]],
                          "hi": [[None, None], [0.024, None]], "n": [[None, None], [2000, None]],
                          "verdict": [[None, None], ["unresolved", None]], "items": "queries", "resamples": 1000,
                          "seed": 0, "confidence": 0.95}}
    with session_scope(get_engine(app_db)) as s:
        exp = create_experiment(s, name="coin flip", method="independent",
                                config=RunConfig(name="coin flip", methods=("independent",)).to_dict(), config_hash="c")
        counts = np.array([[2000, -1], [2000, 2000]])
        save_matrix(s, exp.id, metric="recall@1", gallery_kind="instance", view="encoder", values=C, valid_queries=counts,
                    no_positive=np.zeros_like(counts), summary=summary)
        set_experiment_status(s, exp.id, "done")
    at = overview()
    (rows,) = [d.value for d in at.dataframe if "verdict" in d.value.columns]
    row = rows.set_index("experiment").loc["coin flip"]
    assert row["AC %"] == pytest.approx(100.0) and row["verdict"] == "too close to call"


def test_matrix_verdict_says_when_ties_decide():
    from engine.results.verdict_words import tie_lines

    ties = {"tolerance": 1e-6, "readings": ["pessimistic", "expected", "optimistic"], "tied": [[0, None], [12, 3]],
            "share": [[0.0, None], [1.0, 0.25]], "pessimistic": [[0.5, None], [0.0, 0.5]],
            "expected": [[0.5, None], [0.5, 0.6]], "optimistic": [[0.5, None], [1.0, 0.75]],
            "verdicts": [[None, None], [{"pessimistic": "fail", "optimistic": "pass"}, None]],
            "decide": [[None, None], [True, None]]}
    assert matrix_verdict([[None, None], ["fail", None]], ties) == "not compatible (ties decide it)"
    assert matrix_verdict([[None, None], ["fail", None]]) == "not compatible"
    lines = tie_lines(ties, ["v1", "v2"], "recall@1")
    assert lines[1:] == ["v2 → v1: 12 queries tied (100.0 %); 0.00 / 50.00 / 100.00 %; ties decide it (not compatible "
                         "when tied negatives rank first, compatible when they rank after)",
                         "v2 → v2: 3 queries tied (25.0 %); 50.00 / 60.00 / 75.00 %"]
    assert tie_lines({**ties, "tied": [[0, None], [0, 0]]}, ["v1", "v2"]) == [] and tie_lines(None, ["v1"]) == []
