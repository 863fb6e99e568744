"""engine.analysis (the stored analyses and neighbours) on a small database filled by hand: numbers checked against independent computations."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.analysis.arrays import unit
from engine.metrics.backfill import curve_area, fraction_to_reach
from engine.analysis.collapse import collapse_report, probability_simplex_prototypes
from engine.analysis.map import embed_2d, sample_rows
from engine.analysis.neighbours import nearest_neighbours
from engine.jobs.analysis import run_analysis
from engine.core.config import RunConfig, config_from_dict
from engine.core.contract import CLASS_MEAN, PROTOTYPE, SAMPLE, analysis_key, available_views, normalize_params
from engine.models.extract import simplex_projection
from engine.metrics import definition1_check
from engine.metrics.retrieval import retrieval_metrics
from engine.models import build_model, save_checkpoint
from storage import (
    add_model_version,
    create_experiment,
    get_engine,
    init_db,
    load_analysis,
    save_feature_set,
    session_scope,
)

N_PER_CLASS = 12
CLASSES = 6
DIM = 8


def _features(rng: np.random.Generator, labels: np.ndarray, centres: np.ndarray, noise: float) -> np.ndarray:
    return (centres[labels] + noise * rng.normal(size=(len(labels), centres.shape[1]))).astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    return torch.softmax(torch.from_numpy(x), dim=1).numpy()


@pytest.fixture
def experiment(tmp_path, db_url):
    """Experiment with two model versions (3 then 6 classes) and known query = gallery features (closed-set).

    Step 2 carries a d-Simplex checkpoint (K = 6, 5-d features) so prototypes and NC3 can be checked;
    its encoder features are 5-d, step 1's 8-d (different spaces).
    """
    db = get_engine(db_url)
    init_db(db)
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(CLASSES), N_PER_CLASS)
    centres = rng.normal(size=(CLASSES, DIM)) * 3
    f1 = _features(rng, labels, centres, 1.0)
    f2 = _features(rng, labels, centres, 0.5)  # same space, less noise
    logits1 = _features(rng, labels, np.eye(CLASSES)[:, :3] * 4, 1.0)  # 3 outputs
    logits2 = _features(rng, labels, np.eye(CLASSES) * 4, 1.0)  # 6 outputs
    net = build_model(backbone="small_cnn", head="dsimplex", num_classes=CLASSES, in_channels=1, width=8)
    ckpt = tmp_path / "step_2.safetensors"
    save_checkpoint(net, ckpt)
    f2_simplex = _features(rng, labels, net.head.weight.numpy() * 5, 0.5)  # 5-d, around the prototypes
    cfg = RunConfig(name="synthetic", methods=("bct",)).to_dict()
    with session_scope(db) as s:
        exp = create_experiment(s, name="synthetic/bct", method="bct", config=cfg, config_hash="h")
        v1 = add_model_version(s, exp.id, 1, architecture="mlp", method="bct", classes=[0, 1, 2], num_outputs=3,
                               feature_dim=DIM, class_names=[f"c{i}" for i in range(3)])
        v2 = add_model_version(s, exp.id, 2, architecture="mlp", method="bct", classes=list(range(6)), num_outputs=6,
                               feature_dim=DIM, class_names=[f"c{i}" for i in range(6)])
        v3 = add_model_version(s, exp.id, 3, architecture="small_cnn", method="bct", classes=list(range(6)),
                               num_outputs=6, feature_dim=5, class_names=[f"c{i}" for i in range(6)],
                               checkpoint_path=str(ckpt))
        stored = {v1.id: (f1, logits1), v2.id: (f2, logits2), v3.id: (f2_simplex, logits2)}
        for vid, (enc, logits) in stored.items():
            for split in ("query", "gallery"):
                save_feature_set(s, vid, split, "encoder", enc, labels)
                save_feature_set(s, vid, split, "logits", logits, labels)
                save_feature_set(s, vid, split, "softmax", _softmax(logits), labels)
        ids = (exp.id, v1.id, v2.id, v3.id)
    return {"db": db, "ids": ids, "labels": labels, "f1": f1, "f2": f2, "f3": f2_simplex, "logits1": logits1,
            "logits2": logits2, "net": net}


def _load(db, exp_id, kind, params):
    with session_scope(db) as s:
        row = load_analysis(s, exp_id, kind, analysis_key(kind, params))
    assert row is not None, "the analysis was not stored under analysis_key(kind, params)"
    return row.payload, row.array


# ------------------------------------------------------------------------------------------ params and keys


def test_key_is_deterministic_and_fills_defaults():
    a = analysis_key("projection", {"step_a": 1, "step_b": 2, "method": "pca"})
    b = analysis_key("projection", {"method": "pca", "step_b": 2, "step_a": 1, "view": "encoder"})
    assert a == b
    assert a != analysis_key("projection", {"step_a": 1, "step_b": 2, "method": "umap"})
    assert normalize_params("backfill", {"step_a": 1, "step_b": 3})["orderings"] == [
        "random", "distance_mse", "distance_cosine"]


@pytest.mark.parametrize("kind, params, message", [
    ("projection", {"step_a": 2, "step_b": 1}, "step_a < step_b"),
    ("projection", {"step_a": 1, "step_b": 2, "colour": "red"}, "unknown projection parameter"),
    ("projection", {"step_b": 2}, "step_a"),
    ("backfill", {"step_a": 1, "step_b": 2, "orderings": ["alphabetical"]}, "alphabetical"),
    ("tsne", {}, "unknown analysis kind"),
])
def test_bad_params_say_what_is_wrong(kind, params, message):
    with pytest.raises(ValueError, match=message):
        normalize_params(kind, params)


def test_available_views_adds_psp_and_lsp():
    assert available_views(["encoder", "logits", "softmax"]) == ["encoder", "logits", "softmax", "psp", "lsp"]
    assert available_views(["external"]) == ["external"]


# ------------------------------------------------------------------------------------------ projection


def test_projection_pca_numbers(experiment):
    db, (exp_id, *_), labels = experiment["db"], experiment["ids"], experiment["labels"]
    f1, f2 = experiment["f1"], experiment["f2"]
    params = {"step_a": 1, "step_b": 2, "method": "pca", "max_points": 50, "seed": 3, "n_pairs": 500}
    run_analysis(db, exp_id, "projection", params)
    payload, array = _load(db, exp_id, "projection", params)

    assert payload["columns"] == ["x", "y", "model", "kind", "label", "row", "hit", "drift"]
    assert payload["joint"] and payload["embedding"] == "pca"
    samples = array[array[:, 3] == SAMPLE]
    old_rows = samples[samples[:, 2] == 0][:, 5].astype(int)
    new_rows = samples[samples[:, 2] == 1][:, 5].astype(int)
    np.testing.assert_array_equal(old_rows, new_rows)  # the same images for both models
    np.testing.assert_array_equal(old_rows, sample_rows(len(labels), 50, 3))
    assert len(old_rows) == 50 == payload["n_sampled"]
    np.testing.assert_array_equal(samples[samples[:, 2] == 0][:, 4], labels[old_rows])
    assert (array[:, 3] == CLASS_MEAN).sum() == 2 * CLASSES
    assert np.isfinite(array).all()

    # the PCA map is the PCA of the unit-normalised sampled features (up to the sign of each axis)
    from sklearn.decomposition import PCA

    stacked = np.vstack([unit(f1[old_rows]), unit(f2[old_rows])])
    expected = PCA(n_components=2, svd_solver="full").fit_transform(stacked)
    got = samples[:, :2]
    for axis in range(2):
        assert np.allclose(np.abs(got[:, axis]), np.abs(expected[:, axis]), atol=1e-6)

    # drift: cosine between old and new class means, by hand with torch
    for row in payload["drift"]:
        c = row["label"]
        mu_old = torch.from_numpy(f1[labels == c].astype(np.float64).mean(0))
        mu_new = torch.from_numpy(f2[labels == c].astype(np.float64).mean(0))
        assert row["cosine"] == pytest.approx(F.cosine_similarity(mu_old, mu_new, dim=0).item(), abs=1e-9)
        assert row["seen_old"] == (c < 3) and row["seen_new"]
        assert row["name"] == f"c{c}"

    # NC1-NC4 per model = engine.analysis.collapse on the model's own trained classes (NC3 needs a checkpoint: none here)
    for model, (feats, logits, known) in zip(payload["collapse"], ((f1, experiment["logits1"], 3),
                                                                   (f2, experiment["logits2"], 6))):
        keep = labels < known
        expected = collapse_report(feats[keep], labels[keep], predictions=logits[keep].argmax(1))
        for name, value in expected.items():
            assert model[name] == pytest.approx(value, rel=1e-9), name
        assert "nc3" not in model and any("checkpoint" in n for n in model["notes"])
        assert model["classes"] == known and model["n"] == keep.sum()
        assert model["simplex_angle"] == pytest.approx(np.degrees(np.arccos(-1 / (known - 1))))

    # angles between centred class means, by hand
    keep = labels < 3
    means = np.stack([f1[keep & (labels == c)].astype(np.float64).mean(0) for c in range(3)])
    centred = means - means.mean(0)
    cos01 = centred[0] @ centred[1] / np.linalg.norm(centred[0]) / np.linalg.norm(centred[1])
    assert payload["collapse"][0]["angles"][0] == pytest.approx(np.degrees(np.arccos(cos01)))

    d1 = definition1_check(f1, f2, labels, n_pairs=500, seed=3)
    assert payload["definition1"] == pytest.approx(d1)


def test_projection_psp_uses_the_old_models_classes(experiment):
    db, (exp_id, *_), labels = experiment["db"], experiment["ids"], experiment["labels"]
    params = {"step_a": 1, "step_b": 2, "view": "psp", "method": "pca", "max_points": 100}
    run_analysis(db, exp_id, "projection", params)
    payload, _ = _load(db, exp_id, "projection", params)
    assert [m["dim"] for m in payload["models"]] == [3, 3]
    old = simplex_projection(torch.from_numpy(_softmax(experiment["logits1"])), 3).double()
    new = simplex_projection(torch.from_numpy(_softmax(experiment["logits2"])), 3).double()
    c = 4  # a class only the new model was trained on still has a mean in both spaces
    cos = F.cosine_similarity(old[labels == c].mean(0), new[labels == c].mean(0), dim=0).item()
    assert next(r for r in payload["drift"] if r["label"] == c)["cosine"] == pytest.approx(cos, abs=1e-6)
    # NC on the model's own C^k: NC3 against the probability-simplex prototypes
    own = simplex_projection(torch.from_numpy(_softmax(experiment["logits2"])), 6).numpy()
    expected = collapse_report(own, labels, weights=probability_simplex_prototypes(6),
                               predictions=experiment["logits2"].argmax(1))
    assert payload["collapse"][1]["nc3"] == pytest.approx(expected["nc3"], rel=1e-6)


def test_projection_draws_fixed_prototypes_and_separates_spaces(experiment):
    db, (exp_id, *_), labels = experiment["db"], experiment["ids"], experiment["labels"]
    params = {"step_a": 2, "step_b": 3, "method": "pca"}
    run_analysis(db, exp_id, "projection", params)
    payload, array = _load(db, exp_id, "projection", params)
    assert not payload["joint"], "8-d and 5-d features cannot share one map"
    assert payload["drift"] is None and payload["definition1"] is None
    assert payload["prototypes"] == CLASSES
    protos = array[array[:, 3] == PROTOTYPE]
    np.testing.assert_array_equal(protos[:, 4], np.arange(CLASSES))
    weights = experiment["net"].head.weight.double().numpy()
    expected = collapse_report(experiment["f3"], labels, weights=weights, predictions=experiment["logits2"].argmax(1))
    assert payload["collapse"][1]["nc3"] == pytest.approx(expected["nc3"], rel=1e-6)


@pytest.fixture(scope="session")
def umap_warm():
    """Compile UMAP's numba code once per test session (~30 s on the first call)."""
    embed_2d(np.random.default_rng(0).normal(size=(40, 4)), [], method="umap", seed=0)


def test_projection_umap(experiment, umap_warm):
    db, (exp_id, *_), _ = experiment["db"], experiment["ids"], experiment["labels"]
    params = {"step_a": 1, "step_b": 2, "method": "umap", "max_points": 40}
    run_analysis(db, exp_id, "projection", params)
    payload, array = _load(db, exp_id, "projection", params)
    assert payload["embedding"] == "umap"
    assert np.isfinite(array[:, :2]).all()
    assert (array[:, 3] == SAMPLE).sum() == 80


# ------------------------------------------------------------------------------------------ backfilling


def test_backfill_endpoints_match_retrieval_metrics(experiment):
    db, (exp_id, *_), labels = experiment["db"], experiment["ids"], experiment["labels"]
    f1, f2 = experiment["f1"], experiment["f2"]
    params = {"step_a": 1, "step_b": 2, "num_fractions": 11}
    run_analysis(db, exp_id, "backfill", params)
    payload, array = _load(db, exp_id, "backfill", params)
    assert array is None and payload["same_set"] is True
    cross = retrieval_metrics(f2, labels, f1, labels, ks=(1,), same_set=True)
    self_test = retrieval_metrics(f2, labels, f2, labels, ks=(1,), same_set=True)
    assert payload["fractions"] == pytest.approx(np.linspace(0, 1, 11).tolist())
    assert payload["n_queries"] == len(labels) and payload["n_no_positive"] == 0
    for ordering in ("random", "distance_mse", "distance_cosine"):
        for metric in ("recall@1", "map"):
            curve = payload["curves"][ordering][metric]
            assert curve[0] == pytest.approx(cross[metric], abs=1e-12)
            assert curve[-1] == pytest.approx(self_test[metric], abs=1e-12)
            assert payload["area"][ordering][metric] == pytest.approx(curve_area(np.linspace(0, 1, 11), curve))
            assert payload["reach"][ordering][metric]["1"] == fraction_to_reach(
                np.linspace(0, 1, 11), np.array(curve), curve[-1])
            assert payload["reach"][ordering][metric]["1"] <= 1.0
    assert payload["self_test"]["map"] == pytest.approx(self_test["map"])
    assert payload["cross_test"]["recall@1"] == pytest.approx(cross["recall@1"])


def test_backfill_rollout_adds_rank_merge_and_rescoring(experiment):
    from engine.metrics.backfill_rollout import curve_summary

    db, (exp_id, *_), labels = experiment["db"], experiment["ids"], experiment["labels"]
    f1, f2 = experiment["f1"], experiment["f2"]
    params = {"step_a": 1, "step_b": 2, "num_fractions": 11, "rollout": True, "orderings": ["random", "adapter_residual"]}
    run_analysis(db, exp_id, "backfill", params)
    payload, _ = _load(db, exp_id, "backfill", params)
    out = payload["rollout"]
    old_self = retrieval_metrics(f1, labels, f1, labels, ks=(1,), same_set=True)  # the old index, old queries
    new_self = retrieval_metrics(f2, labels, f2, labels, ks=(1,), same_set=True)
    grid = np.linspace(0, 1, 11)
    for metric in ("recall@1", "map"):
        assert out["self_test"]["old"][metric] == pytest.approx(old_self[metric], abs=1e-12)
        for curve in (out["rank_merge"]["random"]["curves"][metric], out["rank_merge"]["adapter_residual"]["curves"][metric],
                      out["rescoring"]["curves"][metric]):
            assert curve[0] == pytest.approx(old_self[metric], abs=1e-12)
            assert curve[-1] == pytest.approx(new_self[metric], abs=1e-12)
        replaced = payload["curves"]["random"][metric]
        assert out["replacement_summary"]["random"][metric] == curve_summary(
            grid, np.array(replaced), old_self=old_self[metric], new_self=new_self[metric])
    assert out["rescoring"]["ks"] == np.unique(np.floor(grid * len(labels) + 0.5)).astype(int).tolist()
    assert analysis_key("backfill", {"step_a": 1, "step_b": 2}) == analysis_key("backfill", {"step_a": 1, "step_b": 2, "rollout": False})
    assert '"rollout"' not in analysis_key("backfill", {"step_a": 1, "step_b": 2})  # keys of analyses stored before stay
    with pytest.raises(ValueError, match="rollout must be true or false"):
        normalize_params("backfill", {"step_a": 1, "step_b": 2, "rollout": "yes"})


def test_backfill_seen_classes_restricts_to_the_old_model(experiment):
    db, (exp_id, *_), labels = experiment["db"], experiment["ids"], experiment["labels"]
    cfg = config_from_dict({"eval": {"eval_classes": "seen"}}).to_dict()
    with session_scope(db) as s:
        from storage.models import Experiment

        s.get(Experiment, exp_id).config = cfg
    params = {"step_a": 1, "step_b": 2, "metrics": ["recall@1"], "orderings": ["random"]}
    run_analysis(db, exp_id, "backfill", params)
    payload, _ = _load(db, exp_id, "backfill", params)
    keep = labels < 3
    f1, f2 = experiment["f1"][keep], experiment["f2"][keep]
    expected = retrieval_metrics(f2, labels[keep], f1, labels[keep], ks=(1,), same_set=True)["recall@1"]
    assert payload["n_gallery"] == keep.sum()
    assert payload["cross_test"]["recall@1"] == pytest.approx(expected)


def test_analyses_use_the_experiments_topk(experiment):
    """With eval.topk = 1 a PSP feature on the old model's 3 classes is the one-hot of its largest probability."""
    db, (exp_id, v1, v2, _), labels = experiment["db"], experiment["ids"], experiment["labels"]
    cfg = config_from_dict({"eval": {"topk": 1}}).to_dict()
    with session_scope(db) as s:
        from storage.models import Experiment

        s.get(Experiment, exp_id).config = cfg
    old_top = np.eye(3)[experiment["logits1"].argmax(1)]  # softmax is monotone: the largest logit's class
    new_top = np.eye(3)[experiment["logits2"][:, :3].argmax(1)]
    assert not np.array_equal(old_top, new_top)  # the two models disagree on some images

    out = nearest_neighbours(db, v2, v1, "psp", 7, k=5)
    sims = old_top @ new_top[7]
    sims[7] = -np.inf
    assert [n["gallery_index"] for n in out["neighbours"]] == np.argsort(-sims, kind="stable")[:5].tolist()
    assert [n["similarity"] for n in out["neighbours"]] == pytest.approx(np.sort(sims)[::-1][:5].tolist())

    params = {"step_a": 1, "step_b": 2, "view": "psp", "metrics": ["recall@1", "map"], "orderings": ["random"]}
    run_analysis(db, exp_id, "backfill", params)
    payload, _ = _load(db, exp_id, "backfill", params)
    cross = retrieval_metrics(new_top, labels, old_top, labels, ks=(1,), same_set=True)
    self_test = retrieval_metrics(new_top, labels, new_top, labels, ks=(1,), same_set=True)
    for metric in ("recall@1", "map"):
        assert payload["cross_test"][metric] == pytest.approx(cross[metric], abs=1e-12)
        assert payload["self_test"][metric] == pytest.approx(self_test[metric], abs=1e-12)
    assert any("top-1" in note for note in payload["notes"])


# ------------------------------------------------------------------------------------------ geometry over steps


def test_geometry_over_steps(experiment):
    db, (exp_id, *_), labels = experiment["db"], experiment["ids"], experiment["labels"]
    params = {"n_pairs": 300}
    run_analysis(db, exp_id, "geometry", params)
    payload, _ = _load(db, exp_id, "geometry", params)
    assert [m["step"] for m in payload["models"]] == [1, 2, 3]
    keep = labels < 3
    nc1 = collapse_report(experiment["f1"][keep], labels[keep])["nc1"]
    assert payload["models"][0]["nc1"] == pytest.approx(nc1)
    first, second = payload["pairs"]
    d1 = definition1_check(experiment["f1"], experiment["f2"], labels, n_pairs=300, seed=0)
    assert first["1a_fraction"] == pytest.approx(d1["1a_fraction"])
    assert "not comparable" in second["note"]


# ------------------------------------------------------------------------------------------ nearest neighbours


def test_nearest_neighbours_cross_model(experiment):
    db, (_, v1, v2, _), labels = experiment["db"], experiment["ids"], experiment["labels"]
    f1, f2 = experiment["f1"], experiment["f2"]
    out = nearest_neighbours(db, v2, v1, "encoder", 5, k=4)
    sims = F.cosine_similarity(torch.from_numpy(f2[5:6]).double(), torch.from_numpy(f1).double(), dim=1).numpy()
    sims[5] = -np.inf  # closed-set: the query's own image is not in its gallery
    expected = np.argsort(-sims, kind="stable")[:4]
    assert [n["gallery_index"] for n in out["neighbours"]] == expected.tolist()
    assert [n["hit"] for n in out["neighbours"]] == (labels[expected] == labels[5]).tolist()
    assert out["neighbours"][0]["similarity"] == pytest.approx(sims[expected[0]], abs=1e-6)
    assert out["query"]["name"] == "c0" and out["n_positives"] == N_PER_CLASS - 1
    with pytest.raises(ValueError, match="choose a view"):
        nearest_neighbours(db, experiment["ids"][3], v1, "encoder", 0)
    with pytest.raises(ValueError, match="out of range"):
        nearest_neighbours(db, v2, v1, "encoder", 10_000)


def test_missing_view_names_the_stored_ones(experiment):
    db, (exp_id, *_), _ = experiment["db"], experiment["ids"], experiment["labels"]
    with pytest.raises(ValueError, match="views available: encoder, logits, softmax, psp, lsp"):
        run_analysis(db, exp_id, "projection", {"step_a": 1, "step_b": 2, "view": "B(new)"})


def test_projection_of_models_that_embedded_different_images_is_refused_and_stores_nothing(experiment):
    db, (exp_id, v1, _, _), labels = experiment["db"], experiment["ids"], experiment["labels"]
    with session_scope(db) as s:  # step 1's query split now holds other images (fewer rows)
        save_feature_set(s, v1, "query", "encoder", experiment["f1"][:-1], labels[:-1])
    params = {"step_a": 1, "step_b": 2, "split": "query", "view": "encoder"}
    with pytest.raises(ValueError, match="the query features of steps 1 and 2 do not embed the same images"):
        run_analysis(db, exp_id, "projection", params)
    with session_scope(db) as s:
        assert load_analysis(s, exp_id, "projection", analysis_key("projection", params)) is None
