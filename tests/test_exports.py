"""Exports read as numbers and work offline: tidy CSV, chart HTML with its scripts inline, PNG/SVG, the study zip."""
from __future__ import annotations

import io
import json
import re
import tomllib
import zipfile

import altair as alt
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from app.exports import chart_bytes, chart_data
from engine.core.config import config_from_dict
from engine.results.bundle import BUNDLE_FILES, study_bundle
from engine.results.report import CSV_COLUMNS, render_matrix, render_summary_table
from storage import get_engine, list_experiments, load_matrices, session_scope
from support.app_synthetic import fill_study

# hand-made: M2->M1 0.62 > 0.60 passes, M3->M1 0.55 fails, M3->M2 0.70 = M2's self-test 0.70 fails (strict >)
C = np.array([[0.60, np.nan, np.nan], [0.62, 0.70, np.nan], [0.55, 0.70, 0.80]])


def read_csv(text: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(text), comment="#")


def test_matrix_csv_is_one_numeric_row_per_cell():
    text = render_matrix(C, fmt="csv", names=["v1", "v2", "v3"], metric="recall@1", view="psp", gallery_kind="instance",
                         eval_classes="all", replaced=(3,))
    assert text.splitlines()[-1].startswith("# †")  # the replaced-step note stays a comment
    frame = read_csv(text)
    assert list(frame.columns) == list(CSV_COLUMNS)
    assert len(frame) == 6  # the lower triangle of a 3 x 3 matrix
    assert frame["value"].dtype == np.float64
    for row in frame.itertuples():
        t, k = row.query_step - 1, row.gallery_step - 1
        assert row.value == C[t, k]  # full precision, a fraction, no mark inside the cell
        assert (row.query_model, row.gallery_model) == (f"v{t + 1}", f"v{k + 1}")
        assert (row.metric, row.view, row.gallery_kind, row.eval_classes, row.ecc_ties) == ("recall@1", "psp", "instance",
                                                                                       "all", "fail")
    cross = frame[frame["cell"] == "cross"].set_index(["query_step", "gallery_step"])["ecc_pass"]
    assert cross.to_dict() == {(2, 1): True, (3, 1): False, (3, 2): False}
    assert frame.loc[frame["cell"] == "self", "ecc_pass"].isna().all()


def test_ties_pass_and_not_comparable_cells():
    comparable = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 1]], bool)
    D = C.copy()
    D[1, 0] = np.nan
    frame = read_csv(render_matrix(D, fmt="csv", ties="pass", comparable=comparable))
    cells = frame.set_index(["query_step", "gallery_step"])
    assert cells.loc[(2, 1), "cell"] == "n/c" and np.isnan(cells.loc[(2, 1), "value"])
    assert bool(cells.loc[(3, 2), "ecc_pass"]) is True  # 0.70 >= 0.70 under ties = pass
    assert list(cells["ecc_ties"].unique()) == ["pass"]


def test_summary_csv_is_numeric():
    s = {"AC": 1 / 3, "AA": 0.6, "ACA": 0.62, "update_gain": [[None, None], [0.5, None]],
         "matrix": [[0.5, None], [0.55, 0.6]],  # Γ = (0.55 - 0.5) / (0.6 - 0.5), ECC holds
         "paired": {"verdict": [[None, None], ["unresolved", None]]},
         "spread": {"AC": {"mean": 0.5, "std": 0.1, "n": 3}, "AA": {"mean": 0.6, "std": 0.02, "n": 3}}}
    frame = read_csv(render_summary_table([("psp", s)], fmt="csv"))
    row = frame.iloc[0]
    assert row["AC"] == 0.5 and row["AC_std"] == 0.1 and row["AA"] == 0.6 and row["AA_std"] == 0.02
    assert row["ACA"] == 0.62 and np.isnan(row["ACA_std"]) and row["seeds"] == 3
    assert row["mean_update_gain"] == pytest.approx(0.5) and row["familywise"] == "none"
    assert (row["paired_pass"], row["paired_fail"], row["paired_unresolved"]) == (0, 0, 1)


@pytest.fixture(scope="module")
def chart() -> alt.Chart:
    data = pd.DataFrame({"step": [1, 2, 3], "AC_t": [1.0, 0.5, 1 / 3]})
    return alt.Chart(data).mark_line(point=True).encode(x="step:O", y="AC_t:Q").properties(
        width=240, height=160, title="AC_t")


def test_chart_html_embeds_its_scripts(chart):
    html = chart_bytes(chart, "html").decode()
    assert not re.findall(r"<script[^>]*\bsrc\s*=\s*['\"]?(?:https?:)?//", html, flags=re.I)
    assert "https://cdn" not in html
    assert "vegaEmbed" in html and len(html) > 300_000  # vega, vega-lite and vega-embed inline
    assert '"AC_t"' in html


def test_png_and_svg_have_the_chart_size(chart):
    svg = chart_bytes(chart, "svg").decode()
    width, height = (int(float(v)) for v in re.search(r'<svg[^>]*width="([\d.]+)"[^>]*height="([\d.]+)"', svg).groups())
    assert width > 240 and height > 160  # the plot plus axes and title
    png = chart_bytes(chart, "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    image = Image.open(io.BytesIO(png))
    image.load()
    assert image.size == (width, height)


def test_chart_data_stacks_distinct_layers():
    curves = pd.DataFrame({"fraction": [0.0, 1.0], "value": [0.4, 0.8]})
    refs = pd.DataFrame({"value": [0.8, 0.4], "kind": ["self", "cross"]})
    chart = alt.layer(alt.Chart(curves).mark_line().encode(x="fraction:Q", y="value:Q"),
                      alt.Chart(refs).mark_rule().encode(y="value:Q"),
                      alt.Chart(refs[refs["kind"] == "self"]).mark_text().encode(y="value:Q"))
    data = chart_data(chart)
    assert list(data["layer"]) == [1, 1, 2, 2]  # the filtered copy of refs is not repeated
    assert list(data["value"]) == [0.4, 0.8, 0.8, 0.4]


def test_study_bundle_files_parse_and_match_stored_rows(db_url):
    out = fill_study(db_url, analyses=False, versions_for=())
    with session_scope(get_engine(db_url)) as s:
        exps = [{"id": e.id, "name": e.name, "method": e.method, "config": dict(e.config)}
                for e in sorted(list_experiments(s, study_id=out["study_id"]), key=lambda e: e.id)]
        stored = {e["id"]: [{"metric": m.metric, "gallery_kind": m.gallery_kind, "view": m.view, "eval_classes": m.eval_classes,
                             "values": np.asarray(m.values), "valid_queries": np.asarray(m.valid_queries),
                             "no_positive": np.asarray(m.no_positive), "summary": dict(m.summary)}
                            for m in load_matrices(s, e["id"])] for e in exps}
    z = zipfile.ZipFile(io.BytesIO(study_bundle(exps, stored, title="synthetic")))
    assert sorted(z.namelist()) == sorted(BUNDLE_FILES)

    config = tomllib.loads(z.read("study.toml").decode())
    assert config["methods"] == ["independent", "bct"] and config["name"] == "synthetic"
    assert config_from_dict(config).for_method("bct").to_dict() == exps[1]["config"]  # reruns the same experiments

    frame = read_csv(z.read("matrices.csv").decode())
    by_id = {e["method"]: e["id"] for e in exps}
    for method, hand in out["matrices"].items():
        for metric, values in (("recall@1", hand), ("map", hand - 0.1)):
            rows = frame[(frame["method"] == method) & (frame["metric"] == metric)]
            assert set(rows["experiment_id"]) == {by_id[method]} and len(rows) == 6
            for row in rows.itertuples():
                t, k = row.query_step - 1, row.gallery_step - 1
                assert row.value == pytest.approx(values[t, k], abs=1e-12)
                if t != k:
                    assert bool(row.ecc_pass) == bool(values[t, k] > values[k, k])
    assert set(frame.loc[frame["method"] == "bct", "ecc_pass"].dropna()) == {True}
    assert set(frame.loc[frame["method"] == "independent", "ecc_pass"].dropna()) == {False}

    matrices = json.loads(z.read("matrices.json"))
    assert len(matrices) == 4
    first = next(m for m in matrices if m["method"] == "bct" and m["metric"] == "recall@1")
    expected = [[None if np.isnan(v) else v for v in row] for row in out["matrices"]["bct"]]
    assert first["values"] == expected and first["summary"]["AC"] == 1.0 and first["models"] == ["M1", "M2", "M3"]

    summary = z.read("summary.md").decode()
    assert "Convention:" in summary and "| independent (#" in summary and "AC=1.00" in summary and "AC=0.00" in summary


def test_bundle_without_a_run_config_says_why():
    exps = [{"id": 7, "name": "upload", "method": "checkpoints", "config": {"source": "checkpoints", "spec": {}}}]
    matrices = {7: [{"metric": "recall@1", "gallery_kind": "instance", "view": "encoder", "eval_classes": "all",
                     "values": C, "valid_queries": np.ones((3, 3), int), "no_positive": np.zeros((3, 3), int),
                     "summary": {"AC": 1 / 3}}]}
    z = zipfile.ZipFile(io.BytesIO(study_bundle(exps, matrices, title="upload")))
    assert "study.toml" not in z.namelist()
    assert "No study.toml" in z.read("README.txt").decode()
    assert json.loads(z.read("experiments.json"))[0]["config"]["source"] == "checkpoints"
    with pytest.raises(ValueError, match="at least one experiment"):
        study_bundle([], {}, title="x")


def test_the_pages_offer_chart_downloads(app_db):
    from support.app_pages import open_page

    fill_study(app_db, steps=3)
    at = open_page("compatibility")
    keys = {b.key for b in at.get("download_button")}
    for chart_key in ("dl_AC_t", "dl_AA_t"):
        assert {f"{chart_key}_{fmt}" for fmt in ("png", "svg", "html", "csv")} <= keys
    assert "cm_bundle" in keys
    at = open_page("geometry")
    at.selectbox(key="geo_experiment").set_value(1).run()  # the experiment with stored analyses
    at.radio(key="geo_method").set_value("pca").run()
    assert {"dl_map_png", "dl_map_svg", "dl_drift_png", "dl_angles_png"} <= {b.key for b in at.get("download_button")}
