"""``eval.also_eval_classes``: a run stores its matrices under further evaluation conventions (``seen`` and ``all``
side by side), strictly parsed, without changing the hash of a config that leaves it out."""
import numpy as np
import pytest

import engine.run.pipeline as pipeline
from engine.core.cluster import LOCAL, ClusterSpec
from engine.core.config import config_from_dict
from engine.core.fan_out import FanOut
from engine.evaluate.dask_search import dask_client
from engine.core.presets import PRESET_DEVIATIONS, RUN_PRESETS, preset_config
from engine.results.record import config_hash
from storage import list_model_versions, load_feature_set, load_matrices, session_scope
from support.pipeline import TINY, _cfg, _ctx


def test_the_option_is_parsed_strictly():
    assert config_from_dict({}).eval.also_eval_classes == ()
    cfg = config_from_dict({"eval": {"eval_classes": "seen", "also_eval_classes": ["all"]}})
    assert cfg.eval.also_eval_classes == ("all",)
    assert config_from_dict(cfg.to_dict()) == cfg
    for ev, words in (({"also_eval_classes": ["some"]}, "config key eval.also_eval_classes must be one of all, seen"),
                      ({"also_eval_classes": "all"}, "config key eval.also_eval_classes must be a list"),
                      ({"eval_classes": "seen", "also_eval_classes": ["seen"]}, "repeats a convention"),
                      ({"also_eval_classes": ["seen", "seen"]}, "repeats a convention"),
                      ({"protocol": "open-set", "also_eval_classes": ["seen"]},
                       "config key eval.also_eval_classes = 'seen' needs the closed-set protocol")):
        with pytest.raises(ValueError, match=words) as caught:
            config_from_dict({"eval": ev})
        assert "\n" not in str(caught.value)


def test_a_config_without_the_option_keeps_its_hash():
    new = config_from_dict(TINY).to_dict()
    assert new["eval"]["also_eval_classes"] == []
    # the same dict without the key: what every run stored before the option existed
    old = {**new, "eval": {k: v for k, v in new["eval"].items() if k != "also_eval_classes"}}
    assert config_hash(new) == config_hash(old)
    both = {**new, "eval": {**new["eval"], "also_eval_classes": ["seen"]}}
    assert config_hash(both) != config_hash(old)


def test_the_quick_demo_stores_both_conventions():
    cfg = preset_config("quick-demo")
    assert (cfg.eval.eval_classes, cfg.eval.also_eval_classes) == ("seen", ("all",))
    assert any("both are stored" in line for line in PRESET_DEVIATIONS["quick-demo"])
    assert all(RUN_PRESETS[name].get("eval", {}).get("also_eval_classes") is None
               for name in RUN_PRESETS if name.startswith("psp-"))  # paper 000's presets: their one convention


def _recall1(q, ql, g, gl):
    """Recall@1 by brute force (cosine, float64, own image left out, a negative tying the best positive first)."""
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    g = g / np.linalg.norm(g, axis=1, keepdims=True)
    sims = q.astype(np.float64) @ g.astype(np.float64).T
    np.fill_diagonal(sims, -np.inf)  # closed set: query i is gallery image i
    same = ql[:, None] == gl[None, :]
    best_pos = np.where(same, sims, -np.inf).max(1)
    best_neg = np.where(~same, sims, -np.inf).max(1)
    return float(np.mean(best_pos > best_neg))


@pytest.mark.parametrize("on_dask", [False, True], ids=["in process", "dask"])
def test_a_run_stores_the_matrices_under_both_conventions(tmp_path, on_dask):
    cfg = _cfg(methods=["independent"], eval={"views": ["encoder"], "metrics": ["recall@1", "map"],
                                              "eval_classes": "seen", "also_eval_classes": ["all"]})
    lines = []
    with dask_client(ClusterSpec(LOCAL, workers=1) if on_dask else ClusterSpec()) as client:
        ctx = _ctx(tmp_path, client=client, fan_out=FanOut(block_rows=500, shard_rows=500),
                   progress=lambda f, m: lines.append(m))
        exp_id = pipeline.run_experiment(cfg, ctx)
    with session_scope(ctx.db) as s:
        stored = {(m.eval_classes, m.metric): np.asarray(m.values) for m in load_matrices(s, exp_id)}
        versions = list_model_versions(s, exp_id)
        feats = {(i, split): load_feature_set(s, v.id, split, "encoder")[:2]
                 for i, v in enumerate(versions) for split in ("query", "gallery")}
    assert set(stored) == {(ec, m) for ec in ("seen", "all") for m in ("recall@1", "map")}
    evaluated = sorted({m.split(":")[0] for m in lines if " on Dask: " in m})
    if on_dask:  # the configured convention's line as before, the other named
        assert evaluated == ["evaluating encoder on Dask", "evaluating encoder, all classes on Dask"]
    else:
        assert evaluated == []
    # every cell recomputed by brute force from the stored features: seen keeps the classes the gallery model learned
    # (0 .. C^k - 1 after the remapping to the class order), all keeps every test class. Tolerance: one query in the
    # cell may flip on a float32 near-tie between the engine's products and these float64 ones
    counts = [len(v.classes) for v in versions]
    for t in range(len(versions)):
        for k in range(t + 1):
            (q, ql), (g, gl) = feats[(t, "query")], feats[(k, "gallery")]
            for ec, keep in (("all", np.ones(len(ql), bool)), ("seen", ql < counts[k])):
                want = _recall1(q[keep], ql[keep], g[keep], gl[keep])
                assert abs(stored[(ec, "recall@1")][t, k] - want) <= 1 / keep.sum() + 1e-12, (ec, t, k)
    # the conventions differ where the gallery model has not learned every test class, and agree where it has
    assert not np.allclose(np.tril(stored[("seen", "recall@1")])[:, 0], np.tril(stored[("all", "recall@1")])[:, 0])
    # the study summary (run's tables) reads the configured convention only
    from engine.results.study_summary import study_summary

    entry = study_summary(ctx.db, 0, [exp_id])["methods"]["independent"]["views"]["encoder"]["recall@1"]
    assert entry["eval_classes"] == "seen"
    np.testing.assert_allclose(np.array(entry["matrix"], float), stored[("seen", "recall@1")], rtol=0, atol=1e-12)
    last = len(versions) - 1
    assert stored[("seen", "recall@1")][last, last] == pytest.approx(stored[("all", "recall@1")][last, last], abs=1e-9)


@pytest.mark.parametrize("changes", [{"eval_classes": "all"}, {"eval_classes": "all", "protocol": "open-set",
                                                                "dataset": "shapes"}, {}])
def test_the_form_keeps_the_demo_conventions_it_can(changes):
    from app import forms

    base = forms.preset_config(forms.DEMO_PRESET)
    config = forms.form_to_config({**forms.config_to_form(base), **changes}, base)
    kept = config_from_dict(config).eval
    assert kept.also_eval_classes == (() if changes else ("all",)) and kept.eval_classes == changes.get("eval_classes", "seen")


def test_the_compatibility_page_shows_both_conventions_side_by_side(app_db):
    import json

    from storage import get_engine, save_matrix, session_scope as scope
    from storage.models import Experiment
    from support.app_pages import open_page, texts
    from support.app_synthetic import fill_study

    made = fill_study(app_db, steps=3, methods=("independent",), analyses=False)
    seen = np.array(made["matrices"]["independent"]) + 0.2  # hand-made: every cross-test passes under seen
    for t in range(3):
        for k in range(t):
            seen[t, k] = seen[k, k] + 0.01
    exp = made["experiments"]["independent"]
    counts = np.where(np.isnan(seen), 0, made["n"]).astype(np.int64)
    with scope(get_engine(app_db)) as s:
        save_matrix(s, exp, metric="recall@1", gallery_kind="instance", view="encoder", values=seen,
                    valid_queries=counts, no_positive=np.zeros_like(counts), summary={"AC": 1.0, "AA": 0.7, "ACA": 0.7},
                    eval_classes="seen")
        row = s.get(Experiment, exp)  # configured as the quick demo: seen, with all stored beside it
        row.config = {**row.config, "eval": {**row.config["eval"], "eval_classes": "seen", "also_eval_classes": ["all"]}}
    at = open_page("compatibility")
    assert at.selectbox(key="cm_classes").value == "seen"  # the run's own convention first
    page = texts(at)
    assert "The same cells under seen and all classes" in page
    assert "This run was configured with eval_classes = seen" in page and "open-set protocol" in page
    figure = json.loads(at.get("vega_lite_chart")[-1].proto.spec)
    titles = [panel["title"] for panel in figure["hconcat"]]
    assert titles[0] == "seen classes (configured) · AC 100.0% · AA 70.0% · ACA 70.0%"
    assert titles[1].startswith("all classes · AC ") and "**" not in titles[1]
    # one colour scale over both matrices: from the lowest cell of either to the highest
    both = np.concatenate([made["matrices"]["independent"].ravel(), seen.ravel()])
    scales = [((layer.get("encoding") or {}).get("color") or {}).get("scale") or {}
              for panel in figure["hconcat"] for layer in panel["layer"]]
    domains = {tuple(scale["domain"]) for scale in scales if "domain" in scale}
    assert len(domains) == 1
    np.testing.assert_allclose(domains.pop(), [np.nanmin(both), np.nanmax(both)], rtol=0, atol=1e-9)
    # the mAP matrices exist under all only: no side-by-side figure for them
    at.selectbox(key="cm_metric").set_value("map").run()
    assert not at.exception and "The same cells under seen and all classes" not in texts(at)
