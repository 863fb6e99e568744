"""The Compatibility page on a study run with three seeds (AppTest): one summary row per method and view with the
mean and sample std over the seeds, heatmaps averaged or one per seed, each seed's verdict per cross-test."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from engine.core.config import RunConfig
from engine.metrics import summarize
from storage import create_experiment, create_study, get_engine, save_matrix, session_scope, set_experiment_status

MAIN = Path(__file__).resolve().parents[1] / "app" / "main.py"
SEEDS = (0, 1, 2)
METHODS = ("independent", "bct")
STEPS = 3


def seed_matrix(rng: np.random.Generator) -> np.ndarray:
    """A random lower-triangular Recall@1 matrix: some cross-tests pass, some fail, depending on the draw."""
    C = np.full((STEPS, STEPS), np.nan)
    for t in range(STEPS):
        for k in range(t + 1):
            C[t, k] = rng.uniform(0.3, 0.9)
    return C


@pytest.fixture
def seeded_study(app_db) -> dict:
    """A finished study, two methods x three seeds, written by hand; returns each (method, seed)'s matrix."""
    rng = np.random.default_rng(7)
    cfg = RunConfig(name="three-seeds", methods=METHODS, seeds=SEEDS)
    matrices = {}
    with session_scope(get_engine(app_db)) as s:
        study = create_study(s, name="three-seeds", kind="compare", config=cfg.to_dict())
        for seed in SEEDS:
            for method in METHODS:
                one = RunConfig(name="three-seeds", methods=(method,), seed=seed)
                exp = create_experiment(s, name=f"three-seeds/{method}/seed {seed}", method=method,
                                        config=one.to_dict(), config_hash=f"h-{method}-{seed}", study_id=study.id)
                C = seed_matrix(rng)
                counts = np.where(np.isnan(C), 0, 40).astype(np.int64)
                summary = summarize(C)
                summary["comparable"] = np.tril(np.ones((STEPS, STEPS), bool)).tolist()
                save_matrix(s, exp.id, metric="recall@1", gallery_kind="instance", view="encoder", values=C,
                            valid_queries=counts, no_positive=np.zeros_like(counts), summary=summary)
                set_experiment_status(s, exp.id, "done")
                matrices[method, seed] = C
    return matrices


def open_compatibility() -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=120).run()
    at.switch_page("app_pages/compatibility.py").run()
    assert not at.exception, at.exception
    return at


def test_one_row_per_method_with_mean_and_std_over_the_seeds(seeded_study):
    at = open_compatibility()
    summary = at.dataframe[0].value
    assert sorted(summary["method"]) == sorted(METHODS) and len(summary) == len(METHODS)
    for _, row in summary.iterrows():
        stats = [summarize(seeded_study[row["method"], seed]) for seed in SEEDS]
        assert row["seeds"] == 3 and row["view"] == "encoder"
        for name in ("AC", "AA", "ACA"):
            values = 100 * np.array([s[name] for s in stats], dtype=float)
            assert row[f"{name} %"] == pytest.approx(np.mean(values)), name
            assert row[f"{name} % std"] == pytest.approx(np.std(values, ddof=1)), name


def test_heatmaps_averaged_with_each_seeds_verdicts_or_one_per_seed(seeded_study):
    at = open_compatibility()
    assert at.radio(key="cm_seed_mode").value == "averaged over the seeds"
    heatmaps = [c for c in at.get("vega_lite_chart") if "mean of 3 seeds" in c.proto.spec]
    assert len(heatmaps) == len(METHODS)
    tables = [d.value for d in at.dataframe if "seeds passing" in d.value.columns]
    assert len(tables) == len(METHODS)
    for method, verdicts in zip(METHODS, tables):
        assert list(verdicts.columns) == ["cross-test", "seed 0", "seed 1", "seed 2", "seeds passing"]
        assert len(verdicts) == 3  # three cross-tests in a 3 x 3 lower triangle
        cells = [(1, 0), (2, 0), (2, 1)]
        for (t, k), (_, row) in zip(cells, verdicts.iterrows()):
            passing = 0
            for seed in SEEDS:
                C = seeded_study[method, seed]
                ok = C[t, k] > C[k, k]
                passing += ok
                assert row[f"seed {seed}"] == f"{'✓' if ok else '✗'} {100 * C[t, k]:.1f}"
            assert row["seeds passing"] == f"{passing} of 3"
    # the averaged matrix's summary line is the summary of the cell-wise mean
    mean = np.mean([seeded_study[METHODS[0], seed] for seed in SEEDS], axis=0)
    lines = [m.value for m in at.markdown if m.value.startswith("Mean matrix:")]
    assert f"**AA** {100 * summarize(mean)['AA']:.1f}%" in lines[0]

    at.radio(key="cm_seed_mode").set_value("one per seed").run()
    assert not at.exception
    titles = [json.dumps(json.loads(c.proto.spec).get("title"), ensure_ascii=False) for c in at.get("vega_lite_chart")]
    for method in METHODS:
        for seed in SEEDS:
            assert sum(f"{method} · seed {seed} · encoder" in t for t in titles) == 1


def test_feature_views_side_by_side_average_the_seeds(seeded_study, app_db):
    """A second view per experiment: the views table (a pivot that crashed on duplicate methods) shows means."""
    from storage import list_experiments

    with session_scope(get_engine(app_db)) as s:
        for e in list_experiments(s):
            C = seeded_study[e.method, e.config["seed"]] - 0.1
            counts = np.where(np.isnan(C), 0, 40).astype(np.int64)
            save_matrix(s, e.id, metric="recall@1", gallery_kind="instance", view="logits", values=C,
                        valid_queries=counts, no_positive=np.zeros_like(counts), summary=summarize(C))
    at = open_compatibility()
    side = next(d.value for d in at.dataframe if "logits · AA %" in d.value.columns)
    for _, row in side.iterrows():
        expected = np.mean([100 * summarize(seeded_study[row["method"], s] - 0.1)["AA"] for s in SEEDS])
        assert row["logits · AA %"] == pytest.approx(expected)
