"""Stopping one experiment of a study (Overview's Cancel -> "Stop only ...") discards it and the study goes on."""
from __future__ import annotations

from sqlalchemy import select

from engine.core.config import config_from_dict
from engine.run.pipeline import RunContext, run_study
from storage import cancel_experiment, get_engine, list_model_versions, load_matrices, session_scope
from storage.models import Experiment

TINY = {
    "dataset": {"name": "digits"},
    "scenario": {"initial_classes": 4, "increment": 6, "num_steps": 2},
    "model": {"backbone": "small_cnn", "width": 8},
    "training": {"epochs": 1, "batch_size": 64, "lr": 0.05},
}


def test_cancelling_one_experiment_lets_the_study_run_the_others(tmp_path):
    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    messages: list[str] = []

    def progress(fraction: float, message: str) -> None:
        messages.append(message)
        if message.startswith("independent: step 1/"):  # the first method is training: stop it alone
            with session_scope(db) as s:
                running = s.scalars(select(Experiment).where(Experiment.method == "independent")).one()
                assert cancel_experiment(s, running.id) == "cancelled"

    cfg = config_from_dict({**TINY, "methods": ["independent", "cores"]})
    study_id, ids = run_study(cfg, RunContext(db, tmp_path / "ckpt", progress=progress, should_stop=lambda: False))
    with session_scope(db) as s:
        exps = {e.method: e for e in s.scalars(select(Experiment))}
        assert exps["independent"].status == "cancelled"
        assert list_model_versions(s, exps["independent"].id) == [] and load_matrices(s, exps["independent"].id) == []
        assert exps["cores"].status == "done" and ids == [exps["cores"].id]
        assert len(list_model_versions(s, exps["cores"].id)) == 2
    assert any("cancelled on its own" in m for m in messages)
    assert not list((tmp_path / "ckpt" / f"experiment_{exps['independent'].id}").glob("*.safetensors"))
