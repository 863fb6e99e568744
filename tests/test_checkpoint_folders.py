"""Checkpoints live beside the database they belong to (``storage.checkpoint_folders``): two databases with the same
experiment ids never overwrite each other's files, each reader finds its own, and paths stored before still read."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from sqlalchemy import update

from engine.analysis.views import head_weights, load_experiment
from engine.core.config import config_from_dict
from engine.models import load_checkpoint
from engine.results.record import resume_experiment
from engine.run.pipeline import RunContext, run_experiment
from storage import get_engine, list_model_versions, session_scope, set_experiment_status
from storage.checkpoint_folders import checkpoint_root, experiment_checkpoints, stored_checkpoint
from storage.models import ModelVersion

TINY = {
    "methods": ["independent"],  # a trained linear head: head_weights reads it from the checkpoint file
    "dataset": {"name": "digits", "train_per_class": 15, "test_per_class": 5},
    "scenario": {"initial_classes": 6, "increment": 4, "num_steps": 2},
    "model": {"backbone": "small_cnn", "width": 8},
    "training": {"epochs": 1, "batch_size": 64},
}


def test_each_database_gets_its_own_folder(tmp_path):
    a, b = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    assert checkpoint_root(a) == tmp_path.resolve() / "checkpoints" / "a.db"
    assert checkpoint_root(b) == tmp_path.resolve() / "checkpoints" / "b.db"  # same folder, different file: apart
    assert experiment_checkpoints(a, 3) == tmp_path.resolve() / "checkpoints" / "a.db" / "experiment_3"
    assert checkpoint_root(get_engine(a).url) == checkpoint_root(a)  # an engine's URL object names the same folder
    pg = checkpoint_root("postgresql://u:pw@host/lab")
    assert pg.parent == Path("data") / "checkpoints" and "pw" not in str(pg)
    assert pg == checkpoint_root("postgresql://u:changed@host/lab")  # the masked URL is hashed
    assert pg != checkpoint_root("postgresql://u:pw@host/other") != checkpoint_root("postgresql://u:pw@other/lab")
    assert checkpoint_root(a, tmp_path / "mine") == tmp_path / "mine"  # --checkpoints DIR: the operator's choice


def test_stored_paths_name_existing_files_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.safetensors").write_bytes(b"x")
    assert stored_checkpoint("data/x.safetensors") == Path("data/x.safetensors")  # from before: relative to the cwd
    assert stored_checkpoint(str(tmp_path / "data" / "x.safetensors")) == tmp_path / "data" / "x.safetensors"
    assert stored_checkpoint(None) is None and stored_checkpoint("") is None
    assert stored_checkpoint("data/gone.safetensors") is None and stored_checkpoint("data") is None  # a folder is no file


def _head(path: str | Path) -> np.ndarray:
    net = load_checkpoint(path, device="cpu")
    rows = net.head.class_to_output(torch.arange(net.head.num_outputs))
    return net.head.weight.detach()[rows].double().numpy()


def test_two_databases_with_the_same_experiment_id_keep_their_own_checkpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may land in a shared ./data/checkpoints
    files, heads = {}, {}
    for name, seed in (("a", 0), ("b", 1)):  # different seeds: different models under the same experiment id
        db = get_engine(f"sqlite:///{tmp_path / name}/lab.db")
        exp_id = run_experiment(config_from_dict({**TINY, "seed": seed}), RunContext(db))
        assert exp_id == 1
        with session_scope(db) as s:
            files[name] = {v.step: v.checkpoint_path for v in list_model_versions(s, exp_id)}
        folder = (tmp_path / name).resolve() / "checkpoints" / "lab.db" / "experiment_1"
        assert files[name] == {t: str(folder / f"step_{t}.safetensors") for t in (1, 2)}
        heads[name] = {t: _head(f) for t, f in files[name].items()}  # as this run left them, before the next one
    assert not (tmp_path / "data").exists()
    for name in ("a", "b"):  # each reader (the geometry / probe pages' head_weights) reads its own database's files
        _, versions = load_experiment(get_engine(f"sqlite:///{tmp_path / name}/lab.db"), 1)
        for v in versions:
            weights, fixed = head_weights(v)
            assert not fixed and np.array_equal(weights, heads[name][v.step])
    # the two runs differ (seeds), so a file overwritten by the other run, or read from it, would show
    assert not np.array_equal(heads["a"][2], heads["b"][2])


def test_an_experiment_stored_with_the_old_relative_layout_still_reads_and_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = get_engine(f"sqlite:///{tmp_path}/lab.db")
    cfg = config_from_dict(TINY)
    exp_id = run_experiment(cfg, RunContext(db))
    old = Path("data") / "checkpoints" / f"experiment_{exp_id}"  # where every run wrote before, relative to the cwd
    old.mkdir(parents=True)
    with session_scope(db) as s:
        for v in list_model_versions(s, exp_id):
            shutil.move(v.checkpoint_path, old / f"step_{v.step}.safetensors")
            s.execute(update(ModelVersion).where(ModelVersion.id == v.id)
                      .values(checkpoint_path=str(old / f"step_{v.step}.safetensors")))
    _, versions = load_experiment(db, exp_id)
    assert [v.checkpoint_path for v in versions] == [str(old / "step_1.safetensors"), str(old / "step_2.safetensors")]
    for v in versions:
        weights, fixed = head_weights(v)
        assert not fixed and np.array_equal(weights, _head(old / f"step_{v.step}.safetensors"))
    # an unfinished experiment from before resumes from the steps whose old files exist
    (old / "step_2.safetensors").unlink()
    with session_scope(db) as s:
        set_experiment_status(s, exp_id, "running")
    resumed = resume_experiment(db, name="x", method="independent", config=cfg.to_dict(), study_id=None)
    assert (resumed.experiment_id, resumed.done_steps, resumed.finished) == (exp_id, frozenset({1}), False)


def test_run_without_checkpoints_writes_beside_its_database(tmp_path, monkeypatch):
    from engine.cli import main

    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path}/elsewhere/lab.db"
    config = tmp_path / "tiny.toml"
    config.write_text('methods = ["independent"]\n[dataset]\nname = "digits"\ntrain_per_class = 10\n'
                      'test_per_class = 5\n[scenario]\ninitial_classes = 5\nincrement = 5\n[model]\nwidth = 8\n'
                      '[training]\nepochs = 1\n')
    assert main(["run", str(config), "--quiet", "--db", url]) == 0
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.safetensors"))
    assert written == [Path("elsewhere/checkpoints/lab.db/experiment_1") / f"step_{t}.safetensors" for t in (1, 2)]


def test_an_unusable_derived_folder_is_refused_before_any_row(tmp_path, monkeypatch, capsys):
    from engine.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").write_text("not a folder")  # where lab.db's checkpoints would go
    assert main(["run", "--preset", "digits-tiny", "--quiet", "--db", f"sqlite:///{tmp_path}/lab.db"]) == 2
    err = capsys.readouterr().err
    assert "is not a folder" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "lab.db").exists()
