"""engine.results.record is the one write path: runs, checkpoint comparisons and evaluate-folder all record through it,
with the rows they always stored; a one-transaction writer that fails leaves nothing."""
from __future__ import annotations

import ast
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select
from support.checkpoints_factory import save_state_dict_pt, save_step_checkpoint, write_image_folder
from support.cli_evaluate import _hand_folder

import engine.results.record as record
from engine.cli import main
from engine.core.config import config_from_dict
from engine.run.pipeline import RunContext, run_study
from storage import (
    Analysis,
    CompatibilityMatrix,
    Experiment,
    FeatureSet,
    ModelVersion,
    Study,
    get_engine,
    get_experiment,
    init_db,
    list_model_versions,
    load_matrices,
    session_scope,
)

ROOT = Path(__file__).resolve().parents[1]
TABLES = (Study, Experiment, ModelVersion, FeatureSet, CompatibilityMatrix, Analysis)
WRITERS = {"create_study", "create_experiment", "add_model_version", "save_feature_sets",
           "copy_feature_sets", "save_matrix", "set_experiment_status", "set_experiment_study", "clear_experiment"}


def _counts(db) -> dict[str, int]:
    with session_scope(db) as s:
        return {t.__name__: s.scalar(select(func.count()).select_from(t)) for t in TABLES}


def _rows(db, exp_id: int) -> dict:
    """What an experiment stored: status, study kind, per step (method, classes, splits x views), matrix keys."""
    with session_scope(db) as s:
        exp = get_experiment(s, exp_id)
        versions = list_model_versions(s, exp_id)
        return {"status": exp.status, "study": exp.study and exp.study.kind,
                "steps": {v.step: (v.method, len(v.classes), sorted((fs.split, fs.view) for fs in v.feature_sets))
                          for v in versions},
                "matrices": sorted((m.view, m.metric) for m in load_matrices(s, exp_id))}


@pytest.fixture
def spy(monkeypatch):
    """Counts the storage writes engine.results.record makes: experiments started, versions and matrices recorded."""
    calls: Counter = Counter()
    for name in ("create_experiment", "add_model_version", "save_matrix"):
        real = getattr(record, name)

        def counted(*a, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(record, name, counted)
    return calls


def test_only_engine_record_calls_the_storage_writers():
    """No other engine or app module imports a function that writes an experiment, study, version or matrix
    (engine.analysis.adapted adds adapted views to stored versions with save_feature_set: not an experiment's write)."""
    offenders = []
    for path in [*ROOT.glob("engine/**/*.py"), *ROOT.glob("app/**/*.py")]:
        if path == ROOT / "engine" / "results" / "record.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("storage"):
                offenders += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names if a.name in WRITERS]
                if node.module == "storage.models":
                    offenders.append(f"{path.relative_to(ROOT)}: imports storage.models")
    assert offenders == []


def test_the_three_writers_record_through_one_module(tmp_path, spy):
    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    cfg = config_from_dict({"dataset": {"name": "digits"}, "scenario": {"initial_classes": 4, "increment": 3, "num_steps": 3},
                            "model": {"backbone": "small_cnn", "width": 8},
                            "training": {"epochs": 1, "batch_size": 64, "lr": 0.05},
                            "methods": ["independent", "psp"], "eval": {"views": ["encoder", "psp"]}})
    study_id, (trained, copied) = run_study(cfg, RunContext(db, tmp_path / "ckpt"))
    assert spy == {"create_experiment": 2, "add_model_version": 6, "save_matrix": 8}  # 2 x 3 steps, 2 x 2 views x 2 metrics
    raw = sorted((split, view) for split in ("gallery", "query", "train") for view in ("encoder", "logits", "softmax"))
    for exp_id, method in ((trained, "independent"), (copied, "psp")):  # psp copies independent's models and outputs
        assert _rows(db, exp_id) == {"status": "done", "study": "compare",
                                     "steps": {1: (method, 4, raw), 2: (method, 7, raw), 3: (method, 10, raw)},
                                     "matrices": [(v, m) for v in ("encoder", "psp") for m in ("map", "recall@1")]}
    assert run_study(cfg, RunContext(db, tmp_path / "ckpt")) == (study_id, [trained, copied])  # finished: reused
    assert spy["create_experiment"] == 2

    spy.clear()
    images = write_image_folder(tmp_path / "imgs", classes=4, per_class=5)
    save_state_dict_pt(tmp_path / "old.pt", num_classes=4, width=16)
    save_step_checkpoint(tmp_path / "new.safetensors", num_classes=4, width=16, seed=1)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert main(["compare-checkpoints", "--model", f"{tmp_path / 'old.pt'}:small_cnn:4", "--model", str(tmp_path / "new.safetensors"),
                 "--dataset", f"imagefolder:{images}", "--input-size", "16", "--db", url]) == 0
    assert spy == {"create_experiment": 1, "add_model_version": 2, "save_matrix": 6}  # 3 views x 2 metrics
    closed = sorted((split, view) for split in ("gallery", "query") for view in ("encoder", "logits", "softmax"))
    assert _rows(db, 3) == {"status": "done", "study": "checkpoints",
                            "steps": {1: ("checkpoints", 4, closed), 2: ("checkpoints", 4, closed)},
                            "matrices": [(v, m) for v in ("encoder", "lsp", "psp") for m in ("map", "recall@1")]}

    spy.clear()
    assert main(["evaluate", "--features", str(_hand_folder(tmp_path / "f")), "--metric", "recall@1", "--db", url]) == 0
    assert spy == {"create_experiment": 1, "add_model_version": 2, "save_matrix": 1}
    external = [("gallery", "external"), ("query", "external")]
    assert _rows(db, 4) == {"status": "done", "study": None, "steps": {1: ("features", 2, external), 2: ("features", 2, external)},
                            "matrices": [("external", "recall@1")]}
    assert _counts(db)["Experiment"] == 4


def _version(n: int) -> record.NewVersion:
    feats = np.eye(n, 3, dtype=np.float32) + 1
    return record.NewVersion(architecture="external", method="features", classes=[0, 1], num_outputs=0, feature_dim=3,
                          outputs={"query": {"external": feats}, "gallery": {"external": feats}},
                          labels={"query": np.arange(n) % 2, "gallery": np.arange(n) % 2})


def test_a_failing_one_transaction_write_leaves_nothing(tmp_path, monkeypatch):
    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    bad = replace(_version(4), labels={"query": np.arange(3), "gallery": np.arange(4)})
    with pytest.raises(ValueError, match="one label per feature row"):  # step 2's query labels do not fit its features
        record.record_experiment(db, name="x", method="features", config={}, versions=[_version(4), bad], results={},
                                 gallery_kind="instance", study_kind="checkpoints")
    assert set(_counts(db).values()) == {0}

    def broken(*a, **kw):  # fails after the experiment, its versions and feature sets were written in the session
        raise RuntimeError("disk full")

    monkeypatch.setattr(record, "save_matrix", broken)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with pytest.raises(RuntimeError, match="disk full"):
        main(["evaluate", "--features", str(_hand_folder(tmp_path / "f")), "--db", url])
    assert set(_counts(db).values()) == {0}


def test_resume_reuses_finished_resumes_unfinished_and_replaces_cancelled(tmp_path):
    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(db)
    study = record.open_study(db, name="s", kind="compare", config={"a": 1})
    assert record.open_study(db, name="other name", kind="compare", config={"a": 1}) == study  # same config: same study
    first = record.resume_experiment(db, name="e", method="bct", config={"a": 1}, study_id=None)
    assert first == record.Resumed(first.experiment_id, frozenset(), False)
    ckpt = tmp_path / "step_1.safetensors"
    ckpt.write_bytes(b"x")
    with session_scope(db) as s:
        record.record_version(s, first.experiment_id, 1, replace(_version(2), checkpoint_path=str(ckpt)))
        record.record_version(s, first.experiment_id, 2, replace(_version(2), checkpoint_path=str(tmp_path / "gone")))
    again = record.resume_experiment(db, name="e", method="bct", config={"a": 1}, study_id=study)
    assert again == record.Resumed(first.experiment_id, frozenset({1}), False)  # step 2 lost its checkpoint: redone
    with session_scope(db) as s:
        exp = get_experiment(s, first.experiment_id)
        assert (exp.status, exp.study_id) == ("running", study)
        record.finish(s, first.experiment_id)
    assert record.resume_experiment(db, name="e", method="bct", config={"a": 1}, study_id=None).finished
    record.discard(db, first.experiment_id)
    assert _counts(db) == {"Study": 1, "Experiment": 1, "ModelVersion": 0, "FeatureSet": 0, "CompatibilityMatrix": 0,
                           "Analysis": 0}  # the cancelled experiment's row stays, everything it recorded is gone
    fresh = record.resume_experiment(db, name="e", method="bct", config={"a": 1}, study_id=None)
    assert fresh.experiment_id != first.experiment_id and not fresh.finished
