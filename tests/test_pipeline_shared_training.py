"""A study trains methods with identical training once per seed: psp and lsp are views of independent's models."""
import numpy as np
import pytest

import engine.run.pipeline as pipeline
from engine.core.config import config_from_dict
from engine.methods import build_method
from engine.run.pipeline import RunContext, run_study
from storage import get_engine, list_model_versions, load_feature_set, load_matrices, session_scope
from storage.models import Experiment

TINY = {
    "dataset": {"name": "digits"},
    "scenario": {"initial_classes": 4, "increment": 3, "num_steps": 3},
    "model": {"backbone": "small_cnn", "width": 8},
    "training": {"epochs": 1, "batch_size": 64, "lr": 0.05},
}


def _run(tmp_path, monkeypatch, **over):
    calls = []
    real = pipeline.train_step
    monkeypatch.setattr(pipeline, "train_step", lambda net, method, *a, **k: (calls.append(method.name), real(net, method, *a, **k))[1])
    ctx = RunContext(get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), tmp_path / "ckpt")
    _, ids = run_study(config_from_dict({**TINY, **over}), ctx)
    return ctx.db, ids, calls


@pytest.mark.parametrize("a, b, same", [
    (("independent", {}), ("psp", {}), True),
    (("independent", {}), ("lsp", {}), True),
    (("psp", {"temperature": 12.0}), ("lsp", {"temperature": 12.0}), True),
    (("independent", {}), ("psp", {"temperature": 12.0}), False),  # another loss: trained on its own
    (("independent", {}), ("er", {}), False),  # fine-tunes with replay
    (("independent", {}), ("cores", {}), False),  # fixed head, same seed every step
    (("bct", {}), ("bct", {"lam": 0.5}), False),
])
def test_training_key_is_equal_only_for_identical_training(a, b, same):
    key = lambda m: build_method(m[0], **m[1]).training_key("auto")  # noqa: E731
    assert (key(a) == key(b)) is same


def test_independent_psp_lsp_study_trains_one_sequence_per_seed(tmp_path, monkeypatch):
    db, ids, calls = _run(tmp_path, monkeypatch, methods=["independent", "psp", "lsp"], seeds=[0, 1])
    assert calls == ["independent"] * 6  # 2 seeds x 3 steps, nothing for psp / lsp
    with session_scope(db) as s:
        exps = [s.get(Experiment, i) for i in ids]
        assert [(e.method, e.config["seed"], e.status) for e in exps] == [
            (m, seed, "done") for seed in (0, 1) for m in ("independent", "psp", "lsp")]
        for trainer, *views in (ids[:3], ids[3:]):
            base = list_model_versions(s, trainer)
            for exp_id in views:
                versions = list_model_versions(s, exp_id)
                assert [v.step for v in versions] == [1, 2, 3]
                for v, b in zip(versions, base):
                    # its own checkpoint file, byte-equal to the trainer's; the same raw outputs
                    assert v.checkpoint_path != b.checkpoint_path
                    assert open(v.checkpoint_path, "rb").read() == open(b.checkpoint_path, "rb").read()
                    np.testing.assert_array_equal(load_feature_set(s, v.id, "query", "softmax")[0],
                                                  load_feature_set(s, b.id, "query", "softmax")[0])


def _algorithm1(softmax: np.ndarray, c: int) -> np.ndarray:
    """Paper 000, Algorithm 1, written out: first c outputs, minus their mean, L2-normalised."""
    x = softmax[:, :c].astype(np.float64)
    x = x - x.mean(axis=1, keepdims=True)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_psp_matrix_equals_algorithm1_on_independents_stored_outputs(tmp_path, monkeypatch):
    db, (ind, psp), calls = _run(tmp_path, monkeypatch, methods=["independent", "psp"])
    assert calls == ["independent"] * 3
    with session_scope(db) as s:
        versions = list_model_versions(s, ind)
        C = next(m.values for m in load_matrices(s, psp) if m.view == "psp" and m.metric == "recall@1")
        outs = [load_feature_set(s, v.id, "query", "softmax")[:2] for v in versions]
        classes = [len(v.classes) for v in versions]
    expected, near = np.full((3, 3), np.nan), np.zeros((3, 3))
    for t in range(3):
        for k in range(t + 1):
            (q, labels), (g, _) = outs[t], outs[k]
            sim = _algorithm1(q, classes[k]) @ _algorithm1(g, classes[k]).T
            np.fill_diagonal(sim, np.nan)  # closed-set: a query is never its own neighbour
            same = labels[:, None] == labels[None, :]
            best_pos = np.nanmax(np.where(same, sim, -np.inf), axis=1)
            best_neg = np.nanmax(np.where(same, -np.inf, sim), axis=1)
            # pessimistic ties (the engine's rule): a hit only when no other-class image is as close
            expected[t, k] = np.mean(best_pos > best_neg)
            # a 1-epoch model has near-uniform softmax: queries within float32 rounding of a tie may go either way
            gap = np.abs(best_pos - best_neg)
            near[t, k] = np.mean((gap > 0) & (gap < 1e-6))  # exact ties (duplicate images) are not ambiguous
    assert np.all(np.abs(C - expected)[np.tril_indices(3)] <= near[np.tril_indices(3)] + 1e-12)
    assert np.isnan(C[np.triu_indices(3, 1)]).all() and np.sum(near[np.tril_indices(3)] == 0) >= 3  # most cells: exact


def test_a_different_temperature_trains_its_own_sequence(tmp_path, monkeypatch):
    _, _, calls = _run(tmp_path, monkeypatch, methods=["independent", "psp", "lsp"],
                       method_params={"psp": {"temperature": 12.0}, "lsp": {"temperature": 12.0}})
    assert calls == ["independent", "independent", "independent", "psp", "psp", "psp"]
