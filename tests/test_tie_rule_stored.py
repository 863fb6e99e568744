"""One tie rule per number: ``evaluate --ties pass|fail`` on features whose cross-test equals the self-test exactly
stores the rule with the matrix, and the stored AC, the Compatibility page's mark and the CSV exports agree."""
from __future__ import annotations

import csv
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from engine.cli import main
from engine.metrics.compatibility import compatibility_matrices, stored_summary
from engine.metrics.paired import PairedOptions
from engine.results.bundle import study_bundle
from engine.core.conventions import stored_ties
from storage import get_engine, list_experiments, load_matrices, session_scope

MAIN = Path(__file__).resolve().parents[1] / "app" / "main.py"


def tied_folder(folder: Path) -> Path:
    """Two steps with the same features: the cross-test C[2, 1] is the self-test C[1, 1], bit for bit."""
    rng = np.random.default_rng(3)
    folder.mkdir()
    arrays = dict(query_features=rng.normal(size=(24, 4)).astype(np.float32), query_labels=rng.integers(0, 3, 24),
                  gallery_features=rng.normal(size=(24, 4)).astype(np.float32), gallery_labels=rng.integers(0, 3, 24))
    for t in (1, 2):
        np.savez(folder / f"step_{t}.npz", **arrays)
    return folder


def chart_rows(chart) -> pd.DataFrame:
    """The rows of a page's chart: inline in its spec, or in the Arrow datasets Streamlit sends beside it."""
    spec = json.loads(chart.proto.spec)
    frames = [pd.DataFrame(rows) for rows in spec.get("datasets", {}).values()]
    frames += [pa.ipc.open_stream(d.data.data).read_pandas() for d in chart.proto.datasets]
    return pd.concat([f for f in frames if "status" in f], ignore_index=True)


def stored(url: str) -> tuple[dict, dict]:
    with session_scope(get_engine(url)) as s:
        (e,) = list_experiments(s)
        (m,) = load_matrices(s, e.id)
        exp = {"id": e.id, "name": e.name, "method": e.method, "config": dict(e.config), "study_id": None}
        return exp, {"metric": m.metric, "gallery_kind": m.gallery_kind, "view": m.view, "eval_classes": m.eval_classes,
                     "values": np.asarray(m.values), "valid_queries": np.asarray(m.valid_queries),
                     "no_positive": np.asarray(m.no_positive), "summary": dict(m.summary)}


@pytest.mark.parametrize("rule, passes", [("pass", True), ("fail", False)])
def test_a_tie_is_judged_by_the_stored_rule_everywhere(tmp_path, app_db, capsys, rule, passes):
    folder = tied_folder(tmp_path / "tied")
    assert main(["evaluate", "--features", str(folder), "--metric", "recall@1", "--ties", rule, "--db", app_db,
                 "--export", "csv"]) == 0
    printed = capsys.readouterr().out
    e, m = stored(app_db)
    C = m["values"]
    assert C[1, 0] == C[0, 0]  # the exact tie
    # stored: the rule and the AC it gives (one cross-test: AC 1 when a tie passes, 0 when it fails)
    assert stored_ties(m["summary"]) == rule and m["summary"]["ties"] == rule
    assert m["summary"]["rank_ties"] == "pessimistic"  # Recall@k's own tie rule travels with it too
    assert m["summary"]["AC"] == (1.0 if passes else 0.0)
    assert m["summary"]["ACA"] == (pytest.approx(C[1, 0]) if passes else 0.0)
    # the CLI's CSV export
    rows = [r for r in csv.DictReader(line for line in printed.splitlines() if line.count(",") > 5)
            if r.get("cell") == "cross"]
    assert [r["ecc_pass"] for r in rows] == [str(passes)] and rows[0]["ecc_ties"] == rule
    # the bundle's CSV (the page's "Download this study") reads the rule from the stored matrix
    with zipfile.ZipFile(io.BytesIO(study_bundle([e], {e["id"]: [m]}, title="tied"))) as z:
        bundle = [r for r in csv.DictReader(io.StringIO(z.read("matrices.csv").decode())) if r["cell"] == "cross"]
        summary_md = z.read("summary.md").decode()
    assert [r["ecc_pass"] for r in bundle] == [str(passes)] and bundle[0]["ecc_ties"] == rule
    assert ("ECC >= (a tie passes)" if passes else "ECC strict > (a tie fails)") in summary_md
    # the Compatibility page: the heatmap's mark, the failing count and AC under the stored rule
    at = AppTest.from_file(str(MAIN), default_timeout=120).run()
    at.switch_page("app_pages/compatibility.py").run()
    assert not at.exception, at.exception
    (heatmap,) = [c for c in at.get("vega_lite_chart") if '"status"' in c.proto.spec]
    cells = chart_rows(heatmap)
    cross = cells[(cells["query"] == "M2") & (cells["gallery"] == "M1")]
    assert list(cross["status"]) == ["pass" if passes else "fail"]
    line = next(md.value for md in at.markdown if "failing cross-test" in md.value)
    assert f"{0 if passes else 1} failing cross-test(s)" in line
    assert f"**AC** {100.0 if passes else 0.0:.1f}%" in line
    assert any(("a tie passes" if passes else "a tie fails") in c.value for c in at.caption) or \
        ("a tie passes" if passes else "a tie fails") in heatmap.proto.spec


def test_a_matrix_stored_before_the_rule_reads_as_strict():
    assert stored_ties({"AC": 1.0}) == "fail" and stored_ties(None) == "fail" and stored_ties({"ties": "pass"}) == "pass"


@pytest.mark.parametrize("rule, passes", [("pass", True), ("fail", False)])
def test_the_stored_paired_verdict_of_a_tie_follows_the_rule(tmp_path, rule, passes):
    """Identical features (the paired interval is the point [0, 0]) pass under ``pass``; under strict ECC they are a
    tie, too close to call, as check-upgrade says of the same pair (one rule, engine.metrics.decision); AC counts the
    strict ECC on the point (0)."""
    arrays = dict(np.load(tied_folder(tmp_path / "tied") / "step_1.npz"))
    result = compatibility_matrices([arrays, arrays], metrics=("recall@1",), paired=PairedOptions())
    summary = stored_summary(result, "recall@1", ties=rule)
    paired = summary["paired"]
    assert (paired["lo"][1][0], paired["hi"][1][0]) == (0.0, 0.0)
    assert paired["verdict"][1][0] == ("pass" if passes else "unresolved")
    assert paired["counts"] == {"pass": int(passes), "fail": 0, "unresolved": int(not passes)}
    assert summary["AC"] == float(passes)
