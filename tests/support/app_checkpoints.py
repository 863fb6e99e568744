"""Shared by several test modules; moved from tests/test_app_checkpoints.py."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from storage import get_engine, list_jobs, session_scope
from support.checkpoints_factory import save_state_dict_pt, save_step_checkpoint, write_image_folder

PAGE = Path(__file__).resolve().parents[2] / "app" / "app_pages" / "checkpoints.py"


TIMEOUT = 120  # the first run imports torch


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    save_state_dict_pt(tmp_path / "old.pt", num_classes=4, width=8)
    save_step_checkpoint(tmp_path / "new.safetensors", num_classes=4, width=8, seed=1)
    return {"old": tmp_path / "old.pt", "new": tmp_path / "new.safetensors",
            "images": write_image_folder(tmp_path / "imgs", classes=4, per_class=3, size=16)}


def open_page() -> AppTest:
    at = AppTest.from_file(str(PAGE), default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    return at


def jobs(url: str) -> list[dict]:
    with session_scope(get_engine(url)) as s:
        return [{"kind": j.kind, "payload": dict(j.payload)} for j in list_jobs(s)]


def fill(at: AppTest, files: dict[str, Path]) -> AppTest:
    """Model 1: the state_dict (small_cnn, 4 classes, a class list); model 2: the step checkpoint; the folder."""
    at.text_input(key="ck_0_path").input(str(files["old"]))
    at.selectbox(key="ck_0_arch").select("small_cnn")
    at.number_input(key="ck_0_num_classes").set_value(4)
    at.text_area(key="ck_0_classes").input("class_0\nclass_1\nclass_2\nclass_3")
    at.text_input(key="ck_1_path").input(str(files["new"]))
    at.text_input(key="ck_root").input(str(files["images"]))
    return at.run()


def press(at: AppTest, which: str) -> AppTest:
    at.button(key=f"ck_{which}").click().run()
    assert not at.exception, at.exception
    return at

