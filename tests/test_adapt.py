"""Adapters between two stored models: stored views, the combination table against stored matrices."""
import pytest

from engine.analysis.adapted import AdapterJob, run_adapters
from engine.cli import main
from engine.core.config import config_from_dict
from engine.run.pipeline import RunContext, run_experiment
from storage import get_engine, list_feature_views, list_model_versions, load_analysis, load_matrices, session_scope

CFG = {"methods": ["independent"], "dataset": {"name": "digits"}, "scenario": {"initial_classes": 5, "increment": 5, "num_steps": 2},
       "model": {"width": 8}, "training": {"epochs": 2}, "eval": {"train_features_per_class": 20}}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("adapt")
    db = get_engine(f"sqlite:///{tmp / 'db.sqlite'}")
    exp_id = run_experiment(config_from_dict(CFG), RunContext(db, tmp / "ckpt"))
    with session_scope(db) as s:
        versions = [v.id for v in list_model_versions(s, exp_id)]
        C = load_matrices(s, exp_id, metric="recall@1", view="encoder")[0].values
    return db, exp_id, versions, C


def test_table_rows_match_the_stored_matrix_and_orthogonal_b_keeps_the_self_test(stored):
    db, exp_id, (v1, v2), C = stored
    result = run_adapters(db, AdapterJob(v1, v2, "perp", "encoder", True))
    rows = {r["row"]: r for r in result["table"]}
    assert rows["old/old"]["recall@1"] == pytest.approx(C[0, 0])
    assert rows["new/old"]["recall@1"] == pytest.approx(C[1, 0])
    assert rows["B(new)/B(new)"]["recall@1"] == pytest.approx(C[1, 1])  # a rotation preserves every cosine
    assert result["adapters"]["kind"] == "perp"
    curve = result["backfill"]["random"]
    assert curve["recall@1"][0] == pytest.approx(rows["B(new)/F(old)"]["recall@1"])  # beta = 0: nothing backfilled
    assert curve["recall@1"][-1] == pytest.approx(rows["B(new)/B(new)"]["recall@1"])  # beta = 1: all backfilled
    with session_scope(db) as s:
        assert "F(perp,to=2)" in list_feature_views(s, v1, "gallery") and "B(perp,to=1)" in list_feature_views(s, v2, "query")
        assert load_analysis(s, exp_id, "adapters", f"{v1}->{v2}:perp:encoder").payload["table"][0]["row"] == "old/old"


def test_adapters_improve_the_cross_test_on_a_real_pair(stored):
    db, _, (v1, v2), C = stored
    rows = {r["row"]: r for r in run_adapters(db, AdapterJob(v1, v2, "lambda", "encoder", True))["table"]}
    assert rows["B(new)/F(old)"]["recall@1"] > rows["new/old"]["recall@1"]


def test_adapt_command_and_its_errors(stored, capsys):
    db, exp_id, _, _ = stored
    url = str(db.url)
    assert main(["adapt", "--experiment", str(exp_id), "--db", url, "--kind", "fct", "--epochs", "5"]) == 0
    out = capsys.readouterr().out
    assert "B(new)/F(old)" in out and "M-tilde" in out
    assert main(["adapt", "--experiment", "99", "--db", url]) == 2
    assert "no experiment 99" in capsys.readouterr().err
    assert main(["adapt", "--experiment", str(exp_id), "--old-step", "2", "--new-step", "1", "--db", url]) == 2
