"""``check-upgrade --model OLD --model NEW --dataset ...``: two tiny checkpoints on a generated image folder."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from sqlalchemy import func, select
from support.checkpoints_factory import save_state_dict_pt, write_image_folder

from engine.checkpoints.compare import compare_checkpoints
from engine.cli import main
from storage import Experiment, ModelVersion, get_engine, init_db, session_scope

REPORT_LINES = 3  # sentence, the three cells, the two paired intervals (then backfill rows and notes)


@pytest.fixture
def pair(tmp_path):
    """old.pt and new.pt: two small CNNs (4 classes, 16-d features, different seeds) and a 4 x 5 image folder."""
    save_state_dict_pt(tmp_path / "old.pt", num_classes=4, width=16, seed=0)
    save_state_dict_pt(tmp_path / "new.pt", num_classes=4, width=16, seed=1)
    images = write_image_folder(tmp_path / "imgs", classes=4, per_class=5)
    return [f"{tmp_path / 'old.pt'}:small_cnn", f"{tmp_path / 'new.pt'}:small_cnn"], f"imagefolder:{images}"


def _argv(models, dataset, *extra):
    return ["check-upgrade", *[a for m in models for a in ("--model", m)], "--dataset", dataset, "--input-size", "16",
            "--resamples", "200", *extra]


def _report_part(data: dict) -> dict:
    """The report itself, without what each form says about its source."""
    return {k: v for k, v in data.items()
            if k not in ("features", "models", "dataset", "query_dataset", "gallery_dataset", "view", "experiment_id",
                         "old_step", "new_step", "notes", "embedding")}


def _count(url, table):
    with session_scope(get_engine(url)) as s:
        return s.scalar(select(func.count()).select_from(table))


def test_report_equals_the_features_form_on_the_same_embedded_features(tmp_path, pair, capsys):
    models, dataset = pair
    out_models, out_features = tmp_path / "models.json", tmp_path / "features.json"
    code = main(_argv(models, dataset, "--name", "v1", "--name", "v2", "--json", str(out_models)))
    printed_models = capsys.readouterr().out.splitlines()

    # the same two models' outputs, embedded independently, written in the folder format of 'evaluate'
    cmp = compare_checkpoints({"models": [{"path": m.split(":")[0], "arch": "small_cnn",
                                           "preprocessing": {"input_size": 16}} for m in models],
                               "dataset": dataset, "views": ["encoder"], "metrics": ["recall@1"]})
    folder = tmp_path / "features"
    folder.mkdir()
    for step, raw in enumerate(cmp.outputs, start=1):
        np.savez(folder / f"step_{step}.npz", query_features=raw["query"]["encoder"], query_labels=cmp.split_labels["query"],
                 gallery_features=raw["gallery"]["encoder"], gallery_labels=cmp.split_labels["gallery"])
    assert main(["check-upgrade", "--features", str(folder), "--same-set", "--name", "v1", "--name", "v2",
                 "--resamples", "200", "--json", str(out_features)]) == code
    printed_features = capsys.readouterr().out.splitlines()

    from_models, from_features = json.loads(out_models.read_text()), json.loads(out_features.read_text())
    assert _report_part(from_models) == _report_part(from_features)
    assert from_models["old_name"] == "v1" and from_models["n_queries"] == 20 and from_models["same_set"] is True
    assert [(e["model"], e["unit"], e["items"], e["cached"]) for e in from_models["embedding"]] == [
        ("v1", "images", 20, 0), ("v2", "images", 20, 0)]  # closed-set: each model embeds the 20 images once, timed
    assert code == {"compatible": 0, "not compatible": 1, "too close to call": 3}[from_models["verdict"]]
    assert printed_models[:REPORT_LINES] == printed_features[:REPORT_LINES]
    assert from_models["experiment_id"] is None  # no --db: nothing stored


def test_the_same_model_twice_is_a_tie_with_equal_cells(tmp_path, pair, capsys):
    """Identical outcomes for every query: the paired interval is the point [0, 0]; strict ECC names it a tie (too
    close to call, exit 3), a margin or ties passing accept it (exit 0)."""
    models, dataset = pair
    shutil.copy(tmp_path / "old.pt", tmp_path / "copy.pt")
    out = tmp_path / "r.json"
    same = [models[0], f"{tmp_path / 'copy.pt'}:small_cnn"]
    assert main(_argv(same, dataset, "--margin", "0.5")) == 0
    assert main(_argv(same, dataset, "--ties", "pass")) == 0
    capsys.readouterr()
    assert main(_argv(same, dataset, "--json", str(out))) == 3
    report = json.loads(out.read_text())
    assert report["compatibility"]["tie"] is True
    assert report["old_old"] == report["new_old"] == report["new_new"]
    assert report["compatibility"]["diff"] == report["compatibility"]["lo"] == report["compatibility"]["hi"] == 0
    assert (report["old_name"], report["new_name"]) == ("old", "copy")  # default names: the file names
    assert capsys.readouterr().out.splitlines()[0] == report["sentence"]


def test_open_set_query_and_gallery_folders(tmp_path, pair):
    models, _ = pair
    query = write_image_folder(tmp_path / "q", classes=4, per_class=3, seed=1)
    gallery = write_image_folder(tmp_path / "g", classes=3, per_class=4, seed=2)  # no class_3: 3 queries lack a positive
    out = tmp_path / "r.json"
    argv = ["check-upgrade", *[a for m in models for a in ("--model", m)], "--query-dataset", f"imagefolder:{query}",
            "--gallery-dataset", f"imagefolder:{gallery}", "--input-size", "16", "--resamples", "200", "--json", str(out)]
    assert main(argv) in (0, 1, 3)
    report = json.loads(out.read_text())
    assert (report["same_set"], report["n_queries"], report["n_no_positive"], report["n_gallery"]) == (False, 12, 3, 12)
    assert report["compatibility"]["n"] == 9


@pytest.mark.parametrize("view", ["encoder", "psp"])
def test_db_stores_the_comparison_and_the_experiment_form_gives_the_same_report(tmp_path, pair, db_url, capsys, view):
    models, dataset = pair
    out, again = tmp_path / "models.json", tmp_path / "stored.json"
    code = main(_argv(models, dataset, "--name", "v1", "--name", "v2", "--view", view, "--db", db_url, "--json", str(out)))
    data = json.loads(out.read_text())
    eid = data["experiment_id"]
    assert isinstance(eid, int) and f"stored as experiment {eid}" in capsys.readouterr().out
    with session_scope(get_engine(db_url)) as s:
        versions = sorted(s.get(Experiment, eid).model_versions, key=lambda v: v.step)
        assert [(v.step, v.name) for v in versions] == [(1, "v1"), (2, "v2")]
    assert main(["check-upgrade", "--experiment", str(eid), "--old-step", "1", "--new-step", "2", "--db", db_url,
                 "--view", view, "--resamples", "200", "--json", str(again)]) == code
    assert _report_part(json.loads(again.read_text())) == _report_part(data)


@pytest.mark.parametrize("which, extra, message", [
    ("one", [], "compares two models: --model OLD --model NEW; got 1 --model"),
    ("three", [], "got 3 --model"),
    ("bad file", [], "not.pt"),
    ("two", ["--name", "v1"], "two model names"),
    ("two", ["--metric", "verification"], "unknown metric"),
    ("two", ["--old-step", "1"], "go with --experiment"),
    ("two", ["--same-set"], "--same-set goes with --features"),
    ("two", ["--view", "pca"], "unknown view"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_stored(tmp_path, pair, db_url, capsys, which, extra, message):
    models, dataset = pair
    (tmp_path / "not.pt").write_bytes(b"this is not a checkpoint")
    chosen = {"one": models[:1], "three": models + models[:1], "bad file": [models[0], f"{tmp_path / 'not.pt'}:small_cnn"],
              "two": models}[which]
    init_db(get_engine(db_url))
    out = tmp_path / "r.json"
    assert main(_argv(chosen, dataset, "--db", db_url, "--json", str(out), *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err, err
    assert not out.exists() and _count(db_url, Experiment) == 0 and _count(db_url, ModelVersion) == 0


def test_model_options_belong_to_the_model_form(tmp_path, capsys):
    assert main(["check-upgrade", "--features", str(tmp_path), "--dataset", "imagefolder:x"]) == 2
    assert "--dataset go(es) with --model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["check-upgrade", "--features", str(tmp_path), "--model", "a.pt"])
    assert exit_.value.code == 2  # argparse: --model is a third form, not allowed with --features
