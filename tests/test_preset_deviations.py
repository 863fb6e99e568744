"""Each paper preset is set to its paper's released code for the d-Simplex scaling and the checkpoint kept, and every
preset lists where it still differs (CLI, New experiment page, forms)."""
from __future__ import annotations

import pytest

from app import forms
from engine.cli import main
from engine.core.config import config_from_dict
from engine.core.presets import PRESET_DEVIATIONS, RUN_PRESETS, preset_config, preset_deviations

# family -> (d-Simplex scaling, checkpoint kept) of the released code: cores-compatibility src/cores/model.py divides
# by the Frobenius norm before centring and src/cores/main.py keeps the best validation epoch; iamcl2r and CL2R
# (models dsimplex, params.py save_best = False) use unit rows and the last epoch; paper 000 released no code
RELEASED = {"cores-": ("frobenius_uncentred", "best_val"), "cl2r-": ("row", "last"), "iamcl2r-": ("row", "last"),
            "psp-": ("row", "last")}


@pytest.mark.parametrize("name", list(RUN_PRESETS))
def test_every_preset_carries_its_options_and_lists_its_deviations(name):
    cfg = preset_config(name)
    family = next((f for f in RELEASED if name.startswith(f)), None)
    expected = RELEASED[family] if family else ("row", "last")  # own presets: the defaults, unchanged
    assert (cfg.model.dsimplex_normalization, cfg.training.select) == expected
    assert cfg.training.val_fraction is None  # best_val's default share, 0.1
    lines = preset_deviations(name)
    assert isinstance(lines, tuple) and lines, name
    assert all(isinstance(line, str) and line.strip() and "\n" not in line and len(line) <= 200 for line in lines)
    assert len(set(lines)) == len(lines)


def test_the_deviations_name_what_the_options_leave_open():
    assert set(PRESET_DEVIATIONS) == set(RUN_PRESETS)
    assert any("CIFAR-100's test images" in line for line in preset_deviations("cores-cifar100-9upgrades"))
    assert any("33 + 33 + 34" in line for line in preset_deviations("cores-cifar100-2upgrades"))
    assert not any("33 + 33 + 34" in line for line in preset_deviations("cores-cifar100-4upgrades"))
    assert any("frobenius_uncentred" in line for line in preset_deviations("quick-demo"))
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        preset_deviations("nope")


def test_the_cli_lists_each_presets_options_and_deviations(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    block = out.split("cores-cifar100-1upgrade")[1].split("\ncores-cifar100-2upgrades")[0]
    assert "keeps: best_val epoch  d-Simplex: frobenius_uncentred" in block
    assert [line.strip() for line in block.splitlines()[1:]] == [f"differs: {d}" for d in
                                                                preset_deviations("cores-cifar100-1upgrade")]


def test_the_form_falls_back_to_row_when_no_dsimplex_method_is_left():
    base = forms.preset_config("cores-cifar100-1upgrade")
    values = forms.config_to_form(base)
    kept = forms.form_to_config(values, base)
    assert kept["model"]["dsimplex_normalization"] == "frobenius_uncentred"
    values["methods"] = ["independent", "bct"]
    dropped = forms.form_to_config(values, base)
    assert dropped["model"]["dsimplex_normalization"] == "row"
    assert config_from_dict(dropped).training.select == "best_val"  # the selection applies to any method


def test_the_new_experiment_page_shows_the_chosen_presets_deviations(app_db):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app" / "main.py"), default_timeout=120).run()
    at.switch_page("app_pages/new_experiment.py").run()
    at.selectbox(key="ne_preset_choice").set_value("iamcl2r-cifar100r-7tasks").run()
    assert not at.exception, at.exception
    shown = "\n".join(m.value for m in at.markdown)
    assert all(f"- {line}" in shown for line in preset_deviations("iamcl2r-cifar100r-7tasks"))
