"""The Upgrade check page's "How often is this verdict wrong?" (app/evidence_view.py): the stored summary is formatted,
never recomputed, and the committed summary holds what the page reads."""
from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest
from support.app_pages import open_page

from app.evidence_view import FIGURE, SUMMARY, decision_rows, gap_rows, load_summary, markdown_table, rate_words

RATE = {"k": 2, "n": 480, "rate": 2 / 480, "upper": 0.0131}
EMPTY = {"k": 0, "n": 0, "rate": None, "upper": None}


def hand_summary() -> dict:
    rates = {"draws": 480, "agree": {"k": 470, "n": 480, "rate": 470 / 480, "upper": 0.99}, "false_ship": RATE,
             "false_block": EMPTY, "too_close": RATE, "other": RATE}
    bin_ = {"bin": "< 0.5", "draws": 3, "error": {"k": 1, "n": 3, "rate": 1 / 3, "upper": 0.86},
            "too_close": {"k": 2, "n": 3, "rate": 2 / 3, "upper": 0.98}}
    return {"meta": {"command": "python bench/bench_evidence.py", "machine": "x86_64, 2 cores", "seconds": 600,
                     "load_average_start": [3.1, 3, 3]},
            "runs": 54, "draws": 480, "corpora": ["a", "b"], "per_fraction": {"0.01": rates}, "overall": rates,
            "bins": {"guardrail": {"0.01": [bin_, {**bin_, "bin": ">= 2", "draws": 0}]}}, "disagreements": [{}, {}]}


def test_rates_and_rows_read_as_stored():
    assert rate_words(RATE) == "0.4 % (2/480; at most 1.3 %)"
    assert rate_words(EMPTY) == rate_words(None) == "–"
    rows = decision_rows(hand_summary())
    assert [r["sample"] for r in rows] == ["1 % of the queries", "all"]
    assert rows[0]["agrees with the whole corpus"] == "97.9 % (470/480)"  # stored before lower bounds: none shown
    assert rate_words({**RATE, "lower": 0.0012}, lower=True) == "0.4 % (2/480; at least 0.1 %)"
    assert rows[0]["false block"] == "–"
    assert rows[0]["a costlier remedy"] == "–"  # a summary written before the column: shown as none
    (gaps,) = gap_rows(hand_summary())
    assert gaps == {"sample": "1 %", "< 0.5 pts off 0": "wrong 33.3 % (1/3; at most 86.0 %); too close 67 %",
                    ">= 2 pts off 0": "–"}
    assert markdown_table([gaps]).split("\n") == ["| sample | < 0.5 pts off 0 | >= 2 pts off 0 |", "|---|---|---|",
                                                  "| 1 % | wrong 33.3 % (1/3; at most 86.0 %); too close 67 % | – |"]


def test_a_missing_or_broken_summary_shows_nothing(tmp_path):
    assert load_summary(tmp_path / "absent.json") is None
    (tmp_path / "bad.json").write_text("[1, 2", encoding="utf-8")
    assert load_summary(tmp_path / "bad.json") is None
    (tmp_path / "list.json").write_text("[1, 2]", encoding="utf-8")
    assert load_summary(tmp_path / "list.json") is None


def _expander_app(path: str) -> None:
    from pathlib import Path

    from app.evidence_view import evidence_expander

    evidence_expander(Path(path))


def test_the_expander_shows_the_tables(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(hand_summary()), encoding="utf-8")
    at = AppTest.from_function(_expander_app, args=(str(path),)).run()
    assert not at.exception, at.exception
    assert [e.label for e in at.expander] == ["How often is this verdict wrong?"]
    assert not at.dataframe  # static tables: the page's own dataframes keep their places
    table = at.markdown[1].value.split("\n")
    assert table[0].startswith("| sample | draws | agrees with the whole corpus |")
    assert table[2].count("0.4 % (2/480; at most 1.3 %)") == 3  # false ship, too close, other
    assert "54 real upgrades" in at.markdown[0].value
    assert "2 disagreements outside too close to call" in at.caption[-1].value


def test_the_committed_summary_is_what_the_page_reads():
    summary = load_summary(SUMMARY)
    assert summary is not None and FIGURE.is_file()
    assert summary["runs"] >= 48 and set(summary["per_fraction"]) == {"0.01", "0.05", "0.1"}
    assert len(decision_rows(summary)) == 4 and len(gap_rows(summary)) == 3
    for r in summary["per_fraction"].values():  # every rate carries its bound
        assert all(r[k]["upper"] is not None for k in ("agree", "false_ship", "too_close") if r[k]["n"])


def test_the_upgrade_page_opens_with_the_expander():
    at = open_page("upgrade")
    assert "How often is this verdict wrong?" in [e.label for e in at.expander]


def test_the_readmes_evidence_row_is_the_committed_summarys():
    """The README's "how often that decision is wrong" row reads the committed summary's overall rates and bounds."""
    from pathlib import Path

    o = json.loads(SUMMARY.read_text(encoding="utf-8"))["overall"]

    def pct(x: float) -> str:
        return f"{100 * x:.1f} %"

    want = (f"| {pct(o['false_ship']['rate'])} ({o['false_ship']['k']}/{o['false_ship']['n']}; at most "
            f"{pct(o['false_ship']['upper'])}) | {pct(o['false_block']['rate'])} ({o['false_block']['k']}/"
            f"{o['false_block']['n']}; at most {pct(o['false_block']['upper'])}) | "
            f"{pct(o['agree_or_costlier_when_both_decide']['rate'])} ({o['agree_or_costlier_when_both_decide']['k']}/"
            f"{o['agree_or_costlier_when_both_decide']['n']}; at least {pct(o['agree_or_costlier_when_both_decide']['lower'])})"
            f" | {pct(o['agree_when_both_decide']['rate'])} (at least {pct(o['agree_when_both_decide']['lower'])}) | "
            f"{pct(o['too_close']['rate'])} of draws |")
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert want in readme, want
