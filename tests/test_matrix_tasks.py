"""engine.evaluate.matrix: a whole compatibility matrix through tasks equals the in-process one; the run pipeline stores
it (``run --tasks``, ``RunContext.fan_out``); other worker processes share the job; cancel and failure end it."""
import subprocess
import sys

import numpy as np
import pytest

import engine.run.pipeline as pipeline
from engine.core.fan_out import FanOut
from engine.evaluate.matrix import TaskJobStopped, cell_results, matrix_by_tasks, run_task_job
from engine.evaluate.search_tasks import SEARCH_HANDLERS, CellSpec, fan_out_cells
from engine.metrics.compatibility import CellFeatures, compatibility_matrices
from engine.metrics.paired import PairedOptions
from engine.methods import build_method
from engine.core.signals import Cancelled
from storage import Job, add_model_version, create_experiment, get_engine, init_db, load_matrices, save_feature_set, \
    session_scope
from storage.models import CompatibilityMatrix, Experiment, FeatureSet, Task
from support.pipeline import _cfg, _count, _ctx
from support.sharded import _cell, _exact_rows  # exact float32 similarities with many ties, queries without positives

PAIRED = PairedOptions(resamples=200)


def _models(engine, sets):
    """Store one model version per entry of ``sets`` ([(features, labels)]), as both its query and gallery split."""
    ids = []
    with session_scope(engine) as s:
        exp = create_experiment(s, name="m", method="none", config={}, config_hash="h")
        for step, (f, y) in enumerate(sets, start=1):
            mv = add_model_version(s, exp.id, step, architecture="x", method="none", classes=[0], num_outputs=1,
                                   feature_dim=f.shape[1])
            ids.append({split: save_feature_set(s, mv.id, split, "encoder", f, y) for split in ("query", "gallery")})
    return ids


def _assert_same(got, want):
    for metric in want.values:
        np.testing.assert_allclose(got.values[metric], want.values[metric], rtol=0, atol=1e-12)
        for key in ("diff", "lo", "hi", "n"):
            np.testing.assert_allclose(got.paired[metric][key], want.paired[metric][key], rtol=0, atol=1e-12)
        assert got.paired[metric]["verdict"] == want.paired[metric]["verdict"]
    for key in ("valid_queries", "no_positive", "comparable"):
        np.testing.assert_array_equal(getattr(got, key), getattr(want, key))
    for metric, cells in (want.ties or {}).items():  # each Recall@k cell's ties, counted shard by shard
        for key, matrix in cells.items():
            np.testing.assert_allclose(got.ties[metric][key], matrix, rtol=0, atol=1e-12)


@pytest.mark.parametrize("below", [None, 15])
def test_a_matrix_through_tasks_equals_the_in_process_matrix(engine, below):
    # three models on one gallery (same_set), the third 16-d: its cells with the others are not comparable. Every
    # similarity is exact in float32 (test_sharded's rows; +-1 rows of norm 4), so ties are the same in any blocking
    _, _, g, gl = _cell(seed=4, n=120, nq=1)
    sets = [(g, gl), (_exact_rows(np.random.default_rng(1), gl, 20), gl), (np.sign(g[:, :16]), gl)]
    ids = _models(engine, sets)
    metrics = ("recall@1", "recall@5", "map", "map@10")

    def spec(t, k):
        if sets[t][0].shape[1] != sets[k][0].shape[1]:
            return None
        return CellSpec(ids[t]["query"], ids[k]["gallery"], below=below, same_set=True)

    def cell(t, k):
        (q, ql), (gg, ggl) = sets[t], sets[k]
        keep = np.ones(len(ql), bool) if below is None else ql < below
        return CellFeatures(q[keep], ql[keep], gg[keep], ggl[keep], query_ids=np.flatnonzero(keep))

    # with the cells' features the paired test is the two-way interval check-upgrade computes, as in process
    got = matrix_by_tasks(engine, spec, 3, metrics=metrics, paired=PAIRED, fan_out=FanOut(block_rows=37, shard_rows=29),
                          features=cell, same_set=True)
    want = compatibility_matrices(cell, num_models=3, metrics=metrics, same_set=True, paired=PAIRED)
    _assert_same(got, want)
    assert got.paired["recall@1"]["interval"][1][0] == "two-way" and got.paired["map"]["interval"][1][0] == "queries"
    assert got.comparable.tolist() == [[True, False, False], [True, True, False], [False, False, True]]
    with session_scope(engine) as s:  # 4 comparable cells; 4 query blocks (37 x 3 + 9) x 5 shards (29 x 4 + 4) x 2 passes + 1
        assert s.query(Task).count() == 4 * (4 * 5 * 2 + 1)


@pytest.mark.both_databases
def test_a_run_through_tasks_stores_the_in_process_matrices(tmp_path, db_url):
    cfg = _cfg(methods=["psp"], eval={"views": ["encoder", "psp"], "eval_classes": "seen",
                                      "metrics": ["recall@1", "map", "verification"]})
    ctx = _ctx(tmp_path, db_url, fan_out=FanOut(block_rows=70, shard_rows=45))
    exp_id = pipeline.run_experiment(cfg, ctx)
    with session_scope(ctx.db) as s:
        stored = {(m.view, m.metric): (m.values, m.summary) for m in load_matrices(s, exp_id)}
        jobs = s.query(Job).filter(Job.kind == "search").all()
    assert sorted(j.payload["label"] for j in jobs) == [f"experiment {exp_id}, encoder", f"experiment {exp_id}, psp"]
    assert {j.status for j in jobs} == {"done"}
    # the same stored features evaluated in this process, as a run without tasks does
    again = pipeline.evaluate_experiment(ctx.db, exp_id, cfg, build_method("psp"), same_set=True)
    assert set(stored) == {(view, metric) for view in again for metric in again[view]}
    # the tasks' (block x shard) products and the in-process (block x gallery) ones may round a similarity's last bit
    # differently (BLAS picks its kernel by shape), so two scores of one query within a float32 ulp may swap: mAP moves
    # by about 1e-6 here (numpy's OpenBLAS); the tolerance leaves room for more such swaps on another CPU's BLAS
    for (view, metric), (values, summary) in stored.items():
        np.testing.assert_allclose(values, again[view][metric]["matrix"], rtol=0, atol=1e-3)
        assert summary["paired"]["verdict"] == again[view][metric]["paired"]["verdict"]
        np.testing.assert_allclose(np.array(summary["paired"]["diff"], dtype=float),
                                   np.array(again[view][metric]["paired"]["diff"], dtype=float), rtol=0, atol=1e-3)


def test_another_worker_process_runs_the_tasks(tmp_path):
    url = f"sqlite:///{tmp_path / 'w.db'}"
    db = get_engine(url)
    init_db(db)
    q, ql, g, gl = _cell(seed=6, n=90, nq=30)
    ids = _models(db, [(g, gl)])
    with session_scope(db) as s:
        query = save_feature_set(s, 1, "train", "encoder", q, ql)
    job_id = fan_out_cells(db, [CellSpec(query, ids[0]["gallery"])], ks=(1, 5), block_rows=11, shard_rows=40)
    done = subprocess.run([sys.executable, "-m", "engine", "worker", "--tasks", "--once", "--db", url],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    run_task_job(db, job_id)  # nothing left: returns at once
    (cell,) = cell_results(db, job_id)
    want = compatibility_matrices([CellFeatures(q, ql, g, gl)], metrics=("recall@1", "recall@5", "map"))
    got = compatibility_matrices(lambda t, k: cell, num_models=1, metrics=("recall@1", "recall@5", "map"))
    for metric in want.values:
        assert got.values[metric][0, 0] == pytest.approx(want.values[metric][0, 0], abs=1e-12)
    with session_scope(db) as s:
        workers = {w for (w,) in s.query(Task.worker).filter(Task.job_id == job_id)}
    assert len(workers) == 1 and not workers & {None}


def test_stop_and_failure_end_the_task_job(engine, monkeypatch):
    _, _, g, gl = _cell(seed=2, n=60, nq=1)
    ids = _models(engine, [(g, gl)])
    spec = lambda t, k: CellSpec(ids[0]["query"], ids[0]["gallery"], same_set=True)  # noqa: E731
    with pytest.raises(TaskJobStopped, match="cancelled") as stopped:
        matrix_by_tasks(engine, spec, 1, metrics=("recall@1",), should_stop=lambda: True)
    assert stopped.value.cancelled
    with session_scope(engine) as s:
        assert [j.status for j in s.query(Job)] == ["cancelled"]
        assert {t.state for t in s.query(Task)} == {"cancelled"}

    def broken(db, task):
        raise OSError("disk on fire")

    monkeypatch.setitem(SEARCH_HANDLERS, "search", broken)
    with pytest.raises(TaskJobStopped, match=r"failed: task \d+ \(search\) failed after 3 attempt\(s\): OSError: disk on fire") as stopped:
        matrix_by_tasks(engine, spec, 1, metrics=("recall@1",))
    assert not stopped.value.cancelled
    with session_scope(engine) as s:
        failed = s.query(Task).filter(Task.state == "failed").one()
        assert failed.attempts == 3  # the bound on attempts


def test_a_cancel_while_the_run_evaluates_through_tasks_leaves_no_rows(tmp_path, monkeypatch):
    evaluating = []
    real = pipeline.matrix_by_tasks

    def start_evaluating(*args, **kwargs):
        evaluating.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "matrix_by_tasks", start_evaluating)
    ctx = _ctx(tmp_path, fan_out=FanOut(), should_stop=lambda: bool(evaluating))
    with pytest.raises(Cancelled, match="cancelled"):
        pipeline.run_experiment(_cfg(methods=["independent"]), ctx)
    assert evaluating and _count(ctx.db, CompatibilityMatrix) == 0 and _count(ctx.db, FeatureSet) == 0
    with session_scope(ctx.db) as s:
        assert s.get(Experiment, 1).status == "cancelled"
        assert [j.status for j in s.query(Job)] == ["cancelled"]


def test_what_tasks_cannot_compute_is_refused_before_any_row(tmp_path):
    ctx = _ctx(tmp_path, fan_out=FanOut())
    with pytest.raises(ValueError, match="needs the instance gallery"):
        pipeline.run_study(_cfg(methods=["independent"], eval={"gallery": "template"}), ctx)
    init_db(ctx.db)
    assert _count(ctx.db, Experiment) == 0
    with pytest.raises(ValueError, match="must be >= 1"):
        FanOut(block_rows=0)
    cli = subprocess.run([sys.executable, "-m", "engine", "run", "--preset", "digits-tiny", "--tasks", "--task-shard-rows", "0",
                          "--db", f"sqlite:///{tmp_path / 'cli.db'}"], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 2 and cli.stderr.strip().splitlines()[-1].endswith("must be >= 1, got 10000 and 0")
    assert len(cli.stderr.strip().splitlines()) == 1
