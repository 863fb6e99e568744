"""Replacement steps (IAM-CL2R) are retrained from scratch here, and every place that shows steps says so."""
from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

from engine.core.conventions import model_names, replaced_note, replaced_steps, step_label
from engine.results.report import render_matrix
from engine.results.study_summary import print_study
from storage import get_engine, session_scope
from storage.models import Experiment, ModelVersion

RETRAINED_3 = "step 3 (replacement, retrained from scratch)"
C = np.array([[0.5, np.nan, np.nan], [0.6, 0.7, np.nan], [0.4, 0.5, 0.8]])


def test_the_one_label():
    assert step_label(2) == "step 2"
    assert step_label(3, True) == RETRAINED_3
    assert replaced_steps({"scenario": {"replacement_steps": [5, 3]}}) == (3, 5)
    assert replaced_steps({"scenario": {}}) == () == replaced_steps({})
    assert model_names(4, [3]) == ["M1", "M2", "M3†", "M4"]
    assert model_names(2) == ["M1", "M2"]
    assert replaced_note([5, 3]) == f"† {RETRAINED_3}; step 5 (replacement, retrained from scratch)"
    assert replaced_note(()) == ""


@pytest.mark.parametrize("fmt, note", [("text", f"† {RETRAINED_3}"), ("markdown", f"† {RETRAINED_3}"),
                                       ("csv", f"# † {RETRAINED_3}"), ("latex", f"% † {RETRAINED_3}")])
def test_every_matrix_format_marks_and_explains_the_replaced_model(fmt, note):
    text = render_matrix(C, fmt=fmt, replaced=(3,))
    assert note in text.splitlines()
    assert "M3†" in text and "M2†" not in text
    assert "†" not in render_matrix(C, fmt=fmt)  # nothing replaced: nothing said


def test_the_cli_study_matrices_say_it(capsys):
    entry = {"matrix": C.tolist(), "AC": 1 / 3, "AA": 0.5833, "ACA": 0.2, "update_gain": None, "paired": None,
             "gallery_kind": "instance", "eval_classes": "all"}
    summary = {"seeds": [0], "replaced_steps": [3], "methods": {
        "dsimplex_hoc": {"main_view": "encoder", "init_seed": "per_step", "seeds": [0],
                         "views": {"encoder": {"recall@1": entry}}}}}
    print_study(summary)
    lines = capsys.readouterr().out.splitlines()
    assert f"† {RETRAINED_3}" in lines
    assert any(line.startswith("M3†") for line in lines)


def _replace_step_2(url: str) -> None:
    with session_scope(get_engine(url)) as s:
        for exp in s.scalars(select(Experiment)):
            exp.config = {**exp.config, "scenario": {**exp.config.get("scenario", {}), "replacement_steps": [2]}}
        for v in s.scalars(select(ModelVersion).where(ModelVersion.step == 2)):
            v.replaced = True


def test_the_dashboard_says_it(app_db):
    from support.app_pages import open_page, texts
    from support.app_synthetic import fill_study

    fill_study(app_db, steps=3)
    _replace_step_2(app_db)
    at = open_page("compatibility")
    assert "† step 2 (replacement, retrained from scratch)" in texts(at)
    at = open_page("backfilling")
    old = at.selectbox(key="bf_steps_a")
    assert list(old.options) == ["step 1", "step 2 (replacement, retrained from scratch)"]  # as the page shows them
