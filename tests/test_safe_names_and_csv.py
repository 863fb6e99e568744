"""Names and CSV cells that cannot turn into something else (issue 24, item 4; issue 23, item 7): formula-like CSV
cells neutralised, names with control / format characters or over the limit refused where they are read, the
bundle's study.toml valid for any accepted name, model names as the user gave them in every export."""
from __future__ import annotations

import csv
import io
import tomllib
import zipfile

import altair as alt
import numpy as np
import pandas as pd
import pytest

from app.exports import chart_data, csv_bytes
from engine.checkpoints.request import comparison_spec, source_name
from engine.core.config import MAX_RUN_NAME, config_from_dict
from engine.results.bundle import study_bundle
from engine.results.report import csv_text, render_matrix, safe_cell
from engine.upgrade.words import reach
from storage import model_name_problem, name_problem
from storage.models import MAX_MODEL_NAME

FORMULAS = ("=cmd|' /C calc'!A0", "+1+2", "-2+3", "@SUM(A1)", "\tx", "\rx")
BAD_NAMES = ("a\u202eb", "zero\u200bwidth", "line\nbreak", "nul\x00", "bell\x07", "x" * 100_000)


@pytest.mark.parametrize("text", FORMULAS)
def test_a_formula_like_cell_gets_a_quote_and_numbers_stay_numbers(text):
    assert safe_cell(text) == "'" + text
    assert safe_cell(-1.5) == -1.5 and safe_cell(0) == 0 and safe_cell("M1") == "M1" and safe_cell("") == ""
    if "\r" in text:
        return  # a carriage return in a name is refused where names are read (see below)
    rows = list(csv.reader(io.StringIO(csv_text([{"name": text, "value": -0.25}], ("name", "value")), newline="")))
    assert rows[1] == ["'" + text, "-0.25"]  # a negative number is not text: left as it is


def test_chart_csv_download_is_neutralised():
    chart = alt.Chart(pd.DataFrame({"model": ["=HYPERLINK(\"http://x\")", "v2"], "value": [-0.1, 0.2]})).mark_point()
    frame = pd.read_csv(io.BytesIO(csv_bytes(chart_data(chart))))
    assert list(frame["model"]) == ["'=HYPERLINK(\"http://x\")", "v2"] and list(frame["value"]) == [-0.1, 0.2]


def test_matrix_exports_name_the_models_as_given():
    C = np.array([[0.6, np.nan], [0.7, 0.8]])
    csv = pd.read_csv(io.StringIO(render_matrix(C, fmt="csv", names=["=v1", "v2"], metric="recall@1")), comment="#")
    assert list(csv["query_model"]) == ["'=v1", "v2", "v2"] and list(csv["gallery_model"]) == ["'=v1", "'=v1", "v2"]


def test_the_bundle_names_models_as_given_neutralises_them_and_its_toml_parses():
    name = 'a "quoted" \\ name, = + - @'
    cfg = config_from_dict({"name": name, "methods": ["bct"], "dataset": {"name": "digits"},
                            "scenario": {"initial_classes": 4, "increment": 3, "num_steps": 3}})
    e = {"id": 3, "name": f"{name}/bct/seed 0", "method": "bct", "config": cfg.for_method("bct").to_dict()}
    C = np.array([[0.6, np.nan], [0.7, 0.8]])
    m = {"metric": "recall@1", "gallery_kind": "instance", "view": "encoder", "eval_classes": "all", "values": C,
         "valid_queries": np.full((2, 2), 10), "no_positive": np.zeros((2, 2), int), "summary": {}}
    z = zipfile.ZipFile(io.BytesIO(study_bundle([e], {3: [m]}, title=name, names={3: {1: "=cmd|' /C calc'!A0", 2: "v2"}})))
    assert tomllib.loads(z.read("study.toml").decode())["name"] == name
    cells = pd.read_csv(io.BytesIO(z.read("matrices.csv")))
    assert list(cells["query_model"]) == ["'=cmd|' /C calc'!A0", "v2", "v2"]
    assert "=cmd|' /C calc'!A0" in z.read("summary.md").decode() and "| M1 |" not in z.read("summary.md").decode()


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_names_with_control_or_format_characters_or_too_long_are_refused_where_read(bad):
    with pytest.raises(ValueError, match="printable characters"):
        config_from_dict({"name": bad})
    spec = {"models": [{"path": "pretrained:resnet18"}], "dataset": "digits", "name": bad}
    with pytest.raises(ValueError, match="comparison name must be 1..160 printable characters"):
        comparison_spec(spec)
    if len(bad) <= MAX_MODEL_NAME:  # a model's label or a rename on the Upgrade check page: the same rule
        assert model_name_problem(bad).startswith("model name must be 1..40 printable characters")
    problem = name_problem(bad, what="experiment name")
    assert problem is not None and len(problem) < 300 and "\n" not in problem.replace("\\n", "")


def test_storage_refuses_a_bad_experiment_or_study_name(db_url):
    from storage import create_experiment, create_study, get_engine, init_db, session_scope

    db = get_engine(db_url)
    init_db(db)
    with session_scope(db) as s:
        with pytest.raises(ValueError, match="study name"):
            create_study(s, name="bidi\u202e", kind="compare")
        with pytest.raises(ValueError, match="experiment name"):
            create_experiment(s, name="y" * 201, method="bct", config={}, config_hash="h")
    assert config_from_dict({"name": "n" * MAX_RUN_NAME}).name == "n" * MAX_RUN_NAME


def test_reach_and_source_names_read_as_sentences():
    assert reach(None, "v1") == "never reaches v1's self-test (no fraction of the gallery does)"
    assert reach(0.3, "v2") == "reaches v2's self-test after 30% of the gallery"
    assert source_name(None, "data/uploads/0123456789abcdef_resnet18.pt") == "resnet18"
    assert source_name("v1", "data/uploads/0123456789abcdef_resnet18.pt") == "v1"
    assert source_name(None, "models/old_model.pt") == "old_model"
