"""One cell recipe (``engine.core.cell``): the same PSP cell through every path that reads one.

Two small checkpoints embed one image folder (the checkpoint comparison); the comparison is stored; then the
pipeline's evaluation (in process and on Dask), the upgrade check (of the checkpoints and of the stored
experiment) and the backfill analysis read the cross-test cell (new query model, old gallery model) from the same
raw outputs: identical feature arrays, identical matrix values. A training run with ``eval_classes = "seen"`` and a
top-k checks the rows and top-k the same way.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support.checkpoints_factory import small_net, write_image_folder
from support.pipeline import _cfg, _ctx

import engine.run.pipeline as pipeline
from engine.analysis.backfill_analysis import compute_backfill
from engine.analysis.views import load_experiment
from engine.checkpoints.compare import _cells, compare_checkpoints
from engine.checkpoints.store import store_comparison
from engine.core.cell import CellRecipe, apply_recipe, cell_recipe, project_simplex, recipe_settings
from engine.core.contract import normalize_params
from engine.core.fan_out import FanOut
from engine.evaluate.matrix import CellSpec, _rows
from engine.methods import build_method
from engine.upgrade.from_checkpoints import check_models, comparison_pair
from engine.upgrade.stored import check_stored, load_pair
from storage import get_engine, list_model_versions, load_feature_set, load_matrices, session_scope

METRICS = ("recall@1", "map")
SETTINGS = {"resamples": 50, "level": 0.95, "seed": 0}


def _client():
    """An in-process Dask client (threads of this process)."""
    distributed = pytest.importorskip("distributed")
    return distributed.Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None)


def _nested_pair(tmp_path):
    """old.pt: a 4-class small CNN; new.pt: the same network with 2 more classes (its first 4 outputs are old's)."""
    net = small_net(4, width=8, seed=3)
    torch.save(net.state_dict(), tmp_path / "old.pt")
    state = dict(net.state_dict())
    extra = torch.randn(2, state["head.fc.weight"].shape[1], generator=torch.Generator().manual_seed(1))
    state["head.fc.weight"] = torch.cat([state["head.fc.weight"], extra])
    if "head.fc.bias" in state:
        state["head.fc.bias"] = torch.cat([state["head.fc.bias"], torch.zeros(2)])
    torch.save(state, tmp_path / "new.pt")
    return [{"path": str(tmp_path / name), "arch": "small_cnn"} for name in ("old.pt", "new.pt")]


def _psp_by_hand(softmax: np.ndarray, columns: int) -> np.ndarray:
    """Algorithm 1 written out: the first C^k outputs, centred, L2-normalised."""
    kept = softmax[:, :columns].astype(np.float64)
    kept = kept - kept.mean(axis=1, keepdims=True)
    return kept / np.linalg.norm(kept, axis=1, keepdims=True)


def test_recipe_by_hand():
    nested = cell_recipe("psp", 6, 4, eval_classes="seen", topk=3, same_set=True)
    assert nested == CellRecipe("psp", 4, 4, topk=3, below=4, same_set=True) and nested.raw == "softmax"
    named = cell_recipe("lsp", ("owl", "cat", "dog"), ("cat", "fox", "owl"))
    assert (named.query_columns, named.gallery_columns, named.raw) == ((1, 0), (0, 2), "logits")  # cat, owl
    assert cell_recipe("encoder", 6, 4, topk=3) == CellRecipe("encoder")  # top-k and columns are PSP/LSP's only
    assert cell_recipe("encoder", 6, 4, eval_classes="seen").below == 4
    assert recipe_settings({"eval": {"eval_classes": "seen", "topk": 2, "protocol": "open-set"}}) == \
        {"eval_classes": "seen", "topk": 2, "same_set": False}
    with pytest.raises(ValueError, match="eval_classes must be one of all, seen"):
        cell_recipe("psp", 4, 4, eval_classes="some")
    rng = np.random.default_rng(0)
    soft = rng.dirichlet(np.ones(6), size=5).astype(np.float32)
    labels = np.array([0, 5, 3, 4, 1])
    q, ql, ids, g, gl = apply_recipe(cell_recipe("psp", 6, 4, eval_classes="seen", same_set=True),
                                     soft, labels, soft[:, :4], labels)
    assert ids.tolist() == [0, 2, 4] and ql.tolist() == gl.tolist() == [0, 3, 1]
    np.testing.assert_allclose(q, _psp_by_hand(soft[[0, 2, 4]], 4), atol=1e-6)
    np.testing.assert_array_equal(q, g)
    np.testing.assert_array_equal(q, project_simplex(soft[[0, 2, 4]], 4))


def test_the_same_psp_cell_through_every_path(tmp_path):
    images = write_image_folder(tmp_path / "imgs", classes=4, per_class=5)
    spec = {"models": _nested_pair(tmp_path), "dataset": f"imagefolder:{images}", "views": ["psp"],
            "metrics": list(METRICS)}
    # 1. the checkpoint comparison: its cell (new query, old gallery) and its matrices
    cmp = compare_checkpoints(spec)
    cell = _cells("psp", cmp.outputs, cmp.split_labels, cmp.class_names, cmp.same_set)(1, 0)
    ql = cmp.split_labels["query"]
    np.testing.assert_allclose(cell.query, _psp_by_hand(cmp.outputs[1]["query"]["softmax"], 4), atol=1e-5)  # float32 centring
    np.testing.assert_allclose(cell.gallery, _psp_by_hand(cmp.outputs[0]["gallery"]["softmax"], 4), atol=1e-5)  # float32 centring
    want = cmp.results["psp"].values
    assert np.isfinite(want["recall@1"][1, 0])

    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    exp_id = store_comparison(db, cmp)
    config, versions = load_experiment(db, exp_id)
    with session_scope(db) as s:
        stored_versions = list_model_versions(s, exp_id)

    # 2. the pipeline's evaluation of the stored raw outputs (nested models: the first C^k outputs), in process
    cfg = _cfg(methods=["psp"], eval={"views": ["psp"], "metrics": list(METRICS)})
    recipes = pipeline._view_recipes(stored_versions, "psp", cfg, True)
    run_cell = pipeline._view_cells(db, stored_versions, recipes, "psp")(1, 0)
    for a, b in ((run_cell.query, cell.query), (run_cell.gallery, cell.gallery), (run_cell.query_labels, ql)):
        np.testing.assert_array_equal(a, b)
    in_process = pipeline.evaluate_experiment(db, exp_id, cfg, build_method("psp"), same_set=True)
    # 3. the Dask path: the cell's rows as a Dask task reads them, and the whole matrix on an in-process Dask client
    spec_10 = pipeline._view_cell_specs(db, stored_versions, recipes, "psp")(1, 0)
    assert spec_10.recipe == recipes(1, 0) and CellSpec(spec_10.query, spec_10.gallery, spec_10.recipe) == spec_10
    url = db.url.render_as_string(hide_password=False)
    task_q, task_ql, task_ids = _rows(url, spec_10, "query", 0, len(ql))
    task_g, _, _ = _rows(url, spec_10, "gallery", 0, len(ql))
    np.testing.assert_array_equal(task_q, cell.query)
    np.testing.assert_array_equal(task_g, cell.gallery)
    assert task_ids.tolist() == list(range(len(ql)))
    with _client() as client:
        on_dask = pipeline.evaluate_experiment(db, exp_id, cfg, build_method("psp"), same_set=True, client=client,
                                               fan_out=FanOut(block_rows=7, shard_rows=9))
    for metric in METRICS:
        np.testing.assert_array_equal(in_process["psp"][metric]["matrix"], want[metric])
        np.testing.assert_allclose(on_dask["psp"][metric]["matrix"], want[metric], rtol=0, atol=1e-9)

    # 4. the upgrade check, of the two checkpoints and of the stored experiment: old = step 1, new = step 2
    old, new = comparison_pair(cmp, "psp")
    stored_pair = load_pair(db, exp_id, 1, 2, "psp")
    for pair in ((old, new), (stored_pair.old, stored_pair.new)):
        np.testing.assert_array_equal(pair[1].query, cell.query)
        np.testing.assert_array_equal(pair[0].gallery, cell.gallery)
    report, _, _ = check_models({k: v for k, v in spec.items() if k not in ("views", "metrics")}, view="psp",
                                **SETTINGS)
    stored_report, _ = check_stored(db, exp_id, 1, 2, view="psp", **SETTINGS)
    for r in (report, stored_report):  # (new_new is the new model in the old model's space: not a matrix cell)
        assert (r.old_old, r.new_old) == (want["recall@1"][0, 0], want["recall@1"][1, 0])

    # 5. the backfill analysis: its curve starts at the cross-test (nothing backfilled yet)
    params = normalize_params("backfill", {"step_a": 1, "step_b": 2, "view": "psp", "metrics": list(METRICS)})
    backfill = compute_backfill(db, config, versions, params, lambda f, m: None)
    for metric in METRICS:
        assert backfill["cross_test"][metric] == want[metric][1, 0]


def test_seen_rows_and_topk_are_the_same_in_the_run_on_dask_the_upgrade_check_and_the_backfill(tmp_path):
    cfg = _cfg(methods=["psp"], scenario={"initial_classes": 5, "increment": 5, "num_steps": 2},
               eval={"views": ["psp"], "eval_classes": "seen", "topk": 3, "metrics": list(METRICS)})
    ctx = _ctx(tmp_path)
    exp_id = pipeline.run_experiment(cfg, ctx)
    with session_scope(ctx.db) as s:
        stored = {m.metric: m.values for m in load_matrices(s, exp_id) if m.view == "psp"}
        versions = list_model_versions(s, exp_id)
    config, analysis_versions = load_experiment(ctx.db, exp_id)
    recipe = pipeline._view_recipes(versions, "psp", cfg, True)(1, 0)
    assert recipe == CellRecipe("psp", 5, 5, topk=3, below=5, same_set=True)
    cell = pipeline._view_cells(ctx.db, versions, lambda t, k: recipe, "psp")(1, 0)
    with session_scope(ctx.db) as s:
        labels = load_feature_set(s, versions[1].id, "query", "softmax")[1]
    n = len(labels)
    np.testing.assert_array_equal(cell.query_ids, np.flatnonzero(labels < 5))  # the old model's 5 classes only
    assert 0 < len(cell.query_ids) < n and set(cell.query_labels.tolist()) == set(range(5))
    assert np.all(np.count_nonzero(cell.query, axis=1) <= 3)  # top-3 kept
    # the Dask path reads the same rows, in the same view
    spec = pipeline._view_cell_specs(ctx.db, versions, lambda t, k: recipe, "psp")(1, 0)
    task_q, task_ql, task_ids = _rows(ctx.db.url.render_as_string(hide_password=False), spec, "query", 0, n)
    np.testing.assert_array_equal(task_q, cell.query)
    np.testing.assert_array_equal(task_ids, cell.query_ids)
    with _client() as client:
        on_dask = pipeline.evaluate_experiment(ctx.db, exp_id, cfg, build_method("psp"), same_set=True, client=client,
                                               fan_out=FanOut(block_rows=150, shard_rows=200))
    # the upgrade check of the stored run and the backfill analysis: the same cell, the same values
    pair = load_pair(ctx.db, exp_id, 1, 2, "psp")
    np.testing.assert_array_equal(pair.new.query, cell.query)
    np.testing.assert_array_equal(pair.old.gallery, cell.gallery)
    assert any("eval_classes = seen" in note for note in pair.notes)
    report, _ = check_stored(ctx.db, exp_id, 1, 2, view="psp", **SETTINGS)
    params = normalize_params("backfill", {"step_a": 1, "step_b": 2, "view": "psp", "metrics": list(METRICS)})
    backfill = compute_backfill(ctx.db, config, analysis_versions, params, lambda f, m: None)
    assert (report.old_old, report.new_old) == (stored["recall@1"][0, 0], stored["recall@1"][1, 0])
    for metric in METRICS:
        np.testing.assert_allclose(on_dask["psp"][metric]["matrix"], stored[metric], rtol=0, atol=1e-9)
        assert backfill["cross_test"][metric] == stored[metric][1, 0]
