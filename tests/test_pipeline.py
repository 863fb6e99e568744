"""End-to-end runs on tiny data: every method, resume after a kill, reuse, cancel."""
import dataclasses

import numpy as np
import pytest
import torch

import engine.run.pipeline as pipeline
from engine.run.data_setup import prepare_run_data
from engine.methods import METHODS, build_method
from engine.metrics.compatibility import compatibility_matrix
from engine.run.pipeline import run_experiment, run_study
from engine.core.signals import Cancelled
from storage import list_model_versions, load_feature_set, load_matrices, session_scope
from storage.models import CompatibilityMatrix, Experiment, FeatureSet, ModelVersion
from support.pipeline import TINY, _cfg, _count, _ctx









@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_runs_end_to_end(tmp_path, method):
    training = "finetune" if METHODS[method].uses_replay else "cumulative"
    scenario = {**TINY["scenario"], "training": training, "replay_per_class": 5 if training == "finetune" else 0}
    cfg = _cfg(methods=[method], scenario=scenario)
    ctx = _ctx(tmp_path)
    exp_id = run_experiment(cfg, ctx)
    with session_scope(ctx.db) as s:
        versions = list_model_versions(s, exp_id)
        assert [v.step for v in versions] == [1, 2, 3] and [len(v.classes) for v in versions] == [4, 7, 10]
        mats = {(m.metric, m.view): m for m in load_matrices(s, exp_id)}
        assert s.get(Experiment, exp_id).status == "done"
    view = METHODS[method].default_views[0]
    C = mats[("recall@1", view)].values
    assert np.isnan(C[0, 1]) and np.all(np.isfinite(C[np.tril_indices(3)]))
    assert mats[("recall@1", view)].summary["AA"] == pytest.approx(np.nanmean(C[np.tril_indices(3)]))


@pytest.mark.both_databases
def test_stored_matrix_equals_an_independent_recomputation_from_stored_features(tmp_path, db_url):
    ctx = _ctx(tmp_path, db_url)
    exp_id = run_experiment(_cfg(methods=["psp"], eval={"views": ["encoder", "psp"]}), ctx)
    with session_scope(ctx.db) as s:
        versions = list_model_versions(s, exp_id)
        raw = {(v.step, split): load_feature_set(s, v.id, split, "softmax")[:2] for v in versions for split in ("query", "gallery")}
        stored = {m.view: m.values for m in load_matrices(s, exp_id, metric="recall@1")}
    classes = [len(v.classes) for v in versions]

    def psp(x, c):  # Algorithm 1 written out: keep the first C^k outputs, centre, normalise
        g = x[:, :c] - x[:, :c].mean(1, keepdims=True)
        return g / np.linalg.norm(g, axis=1, keepdims=True)

    from engine.metrics.compatibility import CellFeatures

    def cell(t, k):
        (q, ql), (g, gl) = raw[(t + 1, "query")], raw[(k + 1, "gallery")]
        return CellFeatures(psp(q, classes[k]), ql, psp(g, classes[k]), gl)

    expected = compatibility_matrix(cell, num_models=3, same_set=True)
    np.testing.assert_allclose(stored["psp"], expected, atol=1e-12)


def test_a_closed_set_step_embeds_the_test_images_once(tmp_path, monkeypatch):
    cfg = _cfg(methods=["independent"], scenario={"initial_classes": 5, "increment": 5, "num_steps": 2})
    data = prepare_run_data(cfg)
    assert data.query is data.gallery and len(data.adapter_train) > 0  # closed-set: one test set, plus adapter images
    embedded = []
    real = pipeline.extract_outputs

    def counting(net, images, **kwargs):
        embedded.append(len(images))
        return real(net, images, **kwargs)

    monkeypatch.setattr(pipeline, "extract_outputs", counting)
    run_experiment(cfg, _ctx(tmp_path), data=data)
    # per step: the test images once (query = gallery) and the adapter-training images once
    assert embedded == [len(data.query), len(data.adapter_train)] * 2


def test_topk_reaches_the_stored_matrix_and_the_backfill_analysis_alike(tmp_path):
    from engine.jobs.analysis import run_analysis
    from engine.core.contract import analysis_key
    from engine.metrics.retrieval import retrieval_metrics
    from storage import load_analysis

    ctx = _ctx(tmp_path)
    cfg = _cfg(methods=["psp"], eval={"views": ["psp"], "topk": 2},
               scenario={"initial_classes": 5, "increment": 5, "num_steps": 2})
    exp_id = run_experiment(cfg, ctx)
    params = {"step_a": 1, "step_b": 2, "view": "psp", "metrics": ["recall@1", "map"], "orderings": ["random"]}
    run_analysis(ctx.db, exp_id, "backfill", params)
    with session_scope(ctx.db) as s:
        old, new = list_model_versions(s, exp_id)
        stored = {m.metric: m.values for m in load_matrices(s, exp_id, view="psp")}
        (q, ql), (g_old, gl), (g_new, _) = (load_feature_set(s, v.id, split, "softmax")[:2]
                                            for v, split in ((new, "query"), (old, "gallery"), (new, "gallery")))
        payload = load_analysis(s, exp_id, "backfill", analysis_key("backfill", params)).payload

    def top2_psp(x, c):  # keep the first C^k outputs, centre, zero all but the 2 largest, normalise
        h = x[:, :c] - x[:, :c].mean(1, keepdims=True)
        h[np.arange(len(h))[:, None], np.argsort(-h, axis=1, kind="stable")[:, 2:]] = 0
        return h / np.linalg.norm(h, axis=1, keepdims=True)

    c = len(old.classes)  # the backfill space and the cross-test cell (new queries, old gallery): the old model's 5
    # fraction 0 is the cross-test: the stored matrix's cell (new model, old model), top-k included
    for metric in ("recall@1", "map"):
        assert payload["cross_test"][metric] == pytest.approx(stored[metric][1, 0], abs=1e-12)
    cross = retrieval_metrics(top2_psp(q, c), ql, top2_psp(g_old, c), gl, ks=(1,), same_set=True)
    full = retrieval_metrics(top2_psp(q, c), ql, top2_psp(g_new, c), gl, ks=(1,), same_set=True)
    for metric in ("recall@1", "map"):
        assert stored[metric][1, 0] == pytest.approx(cross[metric], abs=1e-12)
        assert payload["self_test"][metric] == pytest.approx(full[metric], abs=1e-12)  # fraction 1: all re-embedded


@pytest.mark.both_databases
def test_resume_after_a_kill_trains_only_the_missing_steps(tmp_path, db_url, monkeypatch):
    cfg = _cfg(methods=["independent"])
    ctx = _ctx(tmp_path, db_url)
    real = pipeline.train_step
    trained = []

    def dying(net, method, images, labels, sctx, *a, **k):
        if sctx.step == 3:
            raise KeyboardInterrupt("killed")  # the process dies during step 3
        trained.append(sctx.step)
        return real(net, method, images, labels, sctx, *a, **k)

    monkeypatch.setattr(pipeline, "train_step", dying)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, ctx)
    assert trained == [1, 2] and _count(ctx.db, ModelVersion) == 2
    with session_scope(ctx.db) as s:
        first_ids = [v.id for v in list_model_versions(s, 1)]

    trained.clear()
    monkeypatch.setattr(pipeline, "train_step", lambda net, method, images, labels, sctx, *a, **k: (trained.append(sctx.step), real(net, method, images, labels, sctx, *a, **k))[1])
    exp_id = run_experiment(cfg, ctx)
    assert trained == [3] and exp_id == 1
    with session_scope(ctx.db) as s:
        assert [v.id for v in list_model_versions(s, 1)][:2] == first_ids
        assert s.get(Experiment, 1).status == "done"
    trained.clear()
    assert run_experiment(cfg, ctx) == 1 and trained == []  # finished config: reused, nothing retrained
    assert _count(ctx.db, Experiment) == 1


@pytest.mark.parametrize("init_seed, same", [("same", True), ("per_step", False)])
def test_scratch_models_start_from_the_same_weights_every_step_by_default(init_seed, same):
    # CoReS (paper 002, Sec. 5.1 and Tab. 9): the same random initialisation at every upgrade
    cfg = _cfg(methods=["cores"], model={**TINY["model"], "init_seed": init_seed})
    data = prepare_run_data(cfg)
    method = build_method("cores")
    nets, previous = [], None
    for step in (1, 2, 3):
        previous = pipeline._next_model(method, cfg, data, previous, 4 + 3 * (step - 1), step, replaced=False)
        nets.append(previous)
    for net in nets[1:]:
        assert all(torch.equal(p, q) for p, q in zip(nets[0].parameters(), net.parameters())) is same


@pytest.mark.parametrize("method, same", [("cores", True), ("independent", False), ("psp", False)])
def test_auto_init_seed_follows_each_methods_paper(method, same):
    # default "auto": CoReS keeps one initialisation (paper 002, Tab. 9); the others are trained independently
    cfg = _cfg(methods=[method])
    assert cfg.model.init_seed == "auto"
    data = prepare_run_data(cfg)
    m = build_method(method)
    first = pipeline._new_model(m, cfg, data, 4, 1)
    second = pipeline._new_model(m, cfg, data, 7, 2)
    same_backbone = all(torch.equal(p, q) for p, q in zip(first.backbone.parameters(), second.backbone.parameters()))
    assert same_backbone is same
    assert pipeline.resolve_init_seed(m, "per_step") == "per_step" and pipeline.resolve_init_seed(m, "same") == "same"


@pytest.mark.parametrize("method", ["etf", "cores"])
def test_a_fixed_classifier_is_drawn_once_per_run_from_the_runs_seed(method):
    # issue 38: ETF drew its frame from the per-step seed, so every step had another classifier
    cfg = _cfg(methods=[method])
    data = prepare_run_data(cfg)
    m = build_method(method)
    first, second = pipeline._new_model(m, cfg, data, 4, 1), pipeline._new_model(m, cfg, data, 7, 2)
    assert torch.equal(first.head.prototypes, second.head.prototypes)  # the same tensor, drawn the same way
    if method == "etf":  # the weights still follow the per-step seed (independently trained models)
        assert not torch.equal(first.backbone.layers[0][0].weight, second.backbone.layers[0][0].weight)
        other = pipeline._new_model(m, dataclasses.replace(cfg, seed=cfg.seed + 1), data, 4, 1)
        assert (other.head.prototypes - first.head.prototypes).abs().max() > 0.1


def test_init_seed_must_be_known():
    with pytest.raises(ValueError, match="model.init_seed must be one of auto, same, per_step, got 'random'"):
        _cfg(model={"init_seed": "random"})


@pytest.mark.slow
def test_resumed_fine_tuning_run_matches_an_uninterrupted_one(tmp_path, monkeypatch):
    # er fine-tunes a linear head that grows each step: its new rows are seeded, not drawn from the global RNG
    cfg = _cfg(methods=["er"])
    whole = _ctx(tmp_path / "whole")
    run_experiment(cfg, whole)
    resumed = _ctx(tmp_path / "resumed")
    real = pipeline.train_step

    def dying(net, method, images, labels, sctx, *a, **k):
        if sctx.step == 3:
            raise KeyboardInterrupt("killed")
        return real(net, method, images, labels, sctx, *a, **k)

    monkeypatch.setattr(pipeline, "train_step", dying)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, resumed)
    monkeypatch.setattr(pipeline, "train_step", real)
    torch.manual_seed(12345)  # a different global RNG state must not matter
    run_experiment(cfg, resumed)
    last = []
    for ctx in (whole, resumed):
        with session_scope(ctx.db) as s:
            version = list_model_versions(s, 1)[-1]
            last.append((version.step, load_feature_set(s, version.id, "gallery", "logits")[0]))
    assert last[0][0] == last[1][0] == 3
    np.testing.assert_array_equal(last[0][1], last[1][1])


@pytest.mark.both_databases
def test_cancel_leaves_no_partial_rows(tmp_path, db_url):
    calls = {"n": 0}

    def stop_in_step_two():
        calls["n"] += 1
        return calls["n"] > 30  # step 1 (about 15 batches) finishes, step 2 is cancelled

    ctx = _ctx(tmp_path, db_url, should_stop=stop_in_step_two)
    with pytest.raises(Cancelled):
        run_experiment(_cfg(methods=["independent"], training={**TINY["training"], "epochs": 2}), ctx)
    assert _count(ctx.db, ModelVersion) == 0 and _count(ctx.db, FeatureSet) == 0 and _count(ctx.db, CompatibilityMatrix) == 0
    with session_scope(ctx.db) as s:
        assert s.get(Experiment, 1).status == "cancelled"
    assert not list((tmp_path / "ckpt").rglob("*.safetensors"))


def test_study_groups_methods_on_the_same_scenario_and_eval_classes_seen(tmp_path):
    ctx = _ctx(tmp_path)
    cfg = _cfg(methods=["independent", "cores"], eval={"eval_classes": "seen"})
    study_id, ids = run_study(cfg, ctx)
    with session_scope(ctx.db) as s:
        exps = [s.get(Experiment, i) for i in ids]
        assert {e.study_id for e in exps} == {study_id} and [e.method for e in exps] == ["independent", "cores"]
        m = load_matrices(s, ids[0], metric="recall@1")[0]
        assert m.eval_classes == "seen"
        # with 'seen', cell (t, k) uses only the classes of gallery model k: 4 classes of the step-1 model
        q, ql, _ = load_feature_set(s, list_model_versions(s, ids[0])[0].id, "query", "encoder")
        assert m.valid_queries[1, 0] + m.no_positive[1, 0] == int((ql < 4).sum())
    assert run_study(cfg, ctx)[0] == study_id  # the same study is found again


def test_several_seeds_give_mean_and_std_and_paired_verdicts(tmp_path, capsys):
    from engine.results.study_summary import print_study, study_summary

    ctx = _ctx(tmp_path)
    cfg = _cfg(methods=["independent"], seeds=[0, 1], eval={"eval_classes": "seen"},
               scenario={"initial_classes": 5, "increment": 5, "num_steps": 2})
    study_id, ids = run_study(cfg, ctx)
    with session_scope(ctx.db) as s:
        exps = [s.get(Experiment, i) for i in ids]
        assert [e.config["seed"] for e in exps] == [0, 1] and exps[0].config["seeds"] == []
        m = load_matrices(s, ids[0], metric="recall@1")[0]
        paired = m.summary["paired"]
        # the cross-test and the self-test are paired on the same queries: all valid queries of the cell
        assert paired["n"][1][0] == m.valid_queries[1, 0] == m.valid_queries[0, 0]
        assert paired["verdict"][1][0] in ("pass", "fail", "unresolved") and paired["verdict"][0][0] is None
        assert paired["diff"][1][0] == pytest.approx(m.values[1, 0] - m.values[0, 0])
        g = m.summary["update_gain"][1][0]
        assert g is None or g == pytest.approx((m.values[1, 0] - m.values[0, 0]) / (m.values[1, 1] - m.values[0, 0]))
        acs = [load_matrices(s, i, metric="recall@1")[0].summary["AA"] for i in ids]
    summary = study_summary(ctx.db, study_id, ids)
    spread = summary["methods"]["independent"]["spread"]["encoder"]["recall@1"]["AA"]
    assert summary["seeds"] == [0, 1] and spread["n"] == 2
    assert spread["mean"] == pytest.approx(np.mean(acs)) and spread["std"] == pytest.approx(np.std(acs, ddof=1))
    print_study(summary)
    out = capsys.readouterr().out
    assert "init_seed: independent per_step" in out and "seeds 0, 1" in out and "±" in out and "paired test" in out


def test_bad_run_configs_fail_before_training(tmp_path):
    ctx = _ctx(tmp_path)
    with pytest.raises(ValueError, match="10 classes cannot be split"):
        run_experiment(_cfg(methods=["independent"], scenario={"initial_classes": 4, "increment": 4}), ctx)
    with pytest.raises(ValueError, match="unknown method"):
        run_experiment(_cfg(methods=["nope"]), ctx)
    with pytest.raises(ValueError, match="needs the closed-set protocol"):
        run_experiment(_cfg(methods=["independent"], eval={"protocol": "open-set", "eval_classes": "seen"}), ctx)
