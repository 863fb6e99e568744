"""``evaluate`` and check-upgrade print one interval and one verdict word for the same pair; queries that are the
gallery, given without ``--same-set``, are evaluated as ``--same-set`` with one line saying so (engine.metrics.same_set).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from support.upgrade import close_pair, compatible_pair, incompatible_pair
from support.upgrade_cli import write_folder

from engine.cli import main
from engine.metrics.compatibility import CellFeatures
from engine.metrics.same_set import queries_are_gallery, resolve_same_set
from engine.upgrade.verdict import check_upgrade


def _both(tmp_path, capsys, pair) -> tuple[dict, str]:
    """check-upgrade's JSON report and what ``evaluate`` prints, for the same two-model folder."""
    folder = write_folder(tmp_path / "f", *pair())
    out = tmp_path / "r.json"
    main(["check-upgrade", "--features", str(folder), "--metric", "recall@1", "--json", str(out)])
    report = json.loads(out.read_text())
    capsys.readouterr()
    assert main(["evaluate", "--features", str(folder), "--no-store", "--metric", "recall@1"]) == 0
    return report, capsys.readouterr().out


@pytest.mark.parametrize("pair", [compatible_pair, incompatible_pair, close_pair])
def test_evaluate_prints_check_upgrades_interval_and_words(tmp_path, capsys, pair):
    report, printed = _both(tmp_path, capsys, pair)
    line = next(x for x in printed.splitlines() if x.startswith("M2 → M1: "))
    c = report["compatibility"]
    interval = (f"{100 * c['diff']:+.1f} points, 95% CI {100 * c['lo']:+.1f} to {100 * c['hi']:+.1f} over {c['n']:,} "
                + ("queries and gallery items" if report["interval"] == "two-way" else "queries"))
    assert line.startswith(f"M2 → M1: {report['verdict']} ({interval})"), (line, report["sentence"])
    assert interval.split(" over")[0] in report["sentence"]
    assert "family-wise: each cross-test alone" in printed


def test_queries_that_are_the_gallery_are_evaluated_as_same_set(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x, labels = rng.normal(size=(40, 6)), np.repeat(np.arange(4), 10)
    one = CellFeatures(x, labels, x, labels)
    y = x + 0.3 * rng.normal(size=x.shape)
    two = CellFeatures(y, labels, y, labels)
    assert queries_are_gallery(one.query, one.query_labels, one.gallery, one.gallery_labels)
    assert not queries_are_gallery(one.query, one.query_labels, two.gallery, two.gallery_labels)
    folder = write_folder(tmp_path / "f", one, two)
    assert main(["evaluate", "--features", str(folder), "--no-store", "--metric", "recall@1", "--json", str(tmp_path / "e.json")]) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if "queries are the gallery" in line]
    assert len(notes) == 1 and "evaluated as --same-set" in notes[0]
    evaluated = json.loads((tmp_path / "e.json").read_text())
    self_test = evaluated["metrics"]["recall@1"]["matrix"][0][0]
    by_hand = _leave_one_out_recall(x, labels)
    assert evaluated["same_set"] is True and self_test == pytest.approx(by_hand) and self_test < 1.0
    report = check_upgrade(one, two)
    assert report.same_set and any("queries are the gallery" in n for n in report.notes)
    assert report.old_old == pytest.approx(by_hand)


def _leave_one_out_recall(x: np.ndarray, labels: np.ndarray) -> float:
    """Recall@1 with each query's own row left out, by hand (cosine)."""
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = u @ u.T
    np.fill_diagonal(s, -np.inf)
    return float(np.mean(labels[np.argmax(s, axis=1)] == labels))


def test_a_folder_where_only_some_steps_are_their_gallery_is_left_as_given_with_a_warning():
    rng = np.random.default_rng(1)
    x, labels = rng.normal(size=(12, 3)), np.repeat(np.arange(3), 4)
    same = CellFeatures(x, labels, x, labels)
    other = CellFeatures(x, labels, x + 1.0, labels)
    used, line = resolve_same_set([same, other], False)
    assert used is False and line.startswith("warning: in step(s) 1 the queries are the gallery")
    assert resolve_same_set([same, same], True) == (True, None) and resolve_same_set([other], False) == (False, None)


@pytest.mark.parametrize("pair", [compatible_pair, close_pair])
def test_evaluate_prints_check_upgrades_on_its_own_line_and_the_ac_range(tmp_path, capsys, pair):
    report, printed = _both(tmp_path, capsys, pair)
    printed = printed.splitlines()
    line = next(x for x in printed if x.startswith("M2 → M1: "))
    b = report["better"]
    word = {"better": "better than", "not better": "not better than", "too close to call": "too close to call against"}
    assert line.endswith(f"; on its own M2 is {word[b['verdict']]} M1 ({100 * b['diff']:+.1f} points, 95% CI "
                         f"{100 * b['lo']:+.1f} to {100 * b['hi']:+.1f})"), (line, report["sentence"])
    # one cross-test: AC is 1 when it surely passes, 0 when it surely fails, else left open between 0 and 1
    ac = next(x for x in printed if x.startswith("AC ") and "interval" in x)
    expected = {"compatible": "AC 1.00: every cross-test's 95% interval decides it",
                "not compatible": "AC 0.00: every cross-test's 95% interval decides it"}.get(
        report["verdict"], "AC between 0.00 and 1.00 as the cross-tests' 95% intervals leave it (0 sure pass(es), "
                           "1 too close to call, of 1)")
    assert ac == expected


def test_ac_line_counts_sure_passes_to_every_cross_test_not_surely_failing():
    from engine.results.verdict_words import ac_line

    paired = {"confidence": 0.95, "verdict": [[None, None, None], ["pass", None, None], ["fail", "unresolved", None]]}
    assert ac_line(paired) == ("AC between 0.33 and 0.67 as the cross-tests' 95% intervals leave it "
                               "(1 sure pass(es), 1 too close to call, of 3)")
    assert ac_line({"confidence": 0.9, "verdict": [[None, None], [None, None]]}) is None
