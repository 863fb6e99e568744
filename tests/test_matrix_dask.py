"""engine.evaluate.matrix: a whole compatibility matrix on Dask (query blocks x gallery partitions of the stored feature
sets, two counting passes, an exact merge) equals the plain in-process computation, on an in-process Dask client and on
a LocalCluster of 2 worker processes; the run pipeline stores the in-process matrices (``run --cluster``,
``RunContext.client``); a cancel ends it with its futures cancelled and no rows; what it cannot compute is refused."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import engine.run.pipeline as pipeline
from engine.core.cell import CellRecipe
from engine.core.cluster import LOCAL, ClusterSpec
from engine.core.fan_out import FanOut
from engine.core.signals import Cancelled
from engine.evaluate.dask_search import dask_client
from engine.evaluate.matrix import CellSpec, matrix_on_dask
from engine.methods import build_method
from engine.metrics.compatibility import CellFeatures, compatibility_matrices
from engine.metrics.paired import PairedOptions
from storage import add_model_version, create_experiment, init_db, load_matrices, save_feature_set, session_scope
from storage.models import CompatibilityMatrix, Experiment, FeatureSet
from support.pipeline import _cfg, _count, _ctx
from support.sharded import _cell, _exact_rows  # exact float32 similarities with many ties, queries without positives

distributed = pytest.importorskip("distributed")
PAIRED = PairedOptions(resamples=200)
TOL = 1e-9


@pytest.fixture(scope="module")
def local2():
    """A LocalCluster of 2 worker processes, shared by the module's tests."""
    with dask_client(ClusterSpec(LOCAL, workers=2)) as client:
        yield client


@pytest.fixture
def inproc():
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as client:
        yield client


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
        np.testing.assert_allclose(got.values[metric], want.values[metric], rtol=0, atol=TOL)
        for key in ("diff", "lo", "hi", "n"):
            np.testing.assert_allclose(got.paired[metric][key], want.paired[metric][key], rtol=0, atol=TOL)
        assert got.paired[metric]["verdict"] == want.paired[metric]["verdict"]
    for key in ("valid_queries", "no_positive", "comparable"):
        np.testing.assert_array_equal(getattr(got, key), getattr(want, key))
    for metric, cells in (want.ties or {}).items():  # each Recall@k cell's ties, counted partition by partition
        for key, matrix in cells.items():
            np.testing.assert_allclose(got.ties[metric][key], matrix, rtol=0, atol=TOL)


@pytest.mark.parametrize("where, below", [("inproc", None), ("inproc", 15), ("local2", None)])
def test_a_matrix_on_dask_equals_the_in_process_matrix(engine, request, where, below):
    # three models on one gallery (same_set), the third 16-d: its cells with the others are not comparable. Every
    # similarity is exact in float32 (test_sharded's rows; +-1 rows of norm 4), so ties are the same in any blocking
    client = request.getfixturevalue(where)
    _, _, g, gl = _cell(seed=4, n=120, nq=1)
    sets = [(g, gl), (_exact_rows(np.random.default_rng(1), gl, 20), gl), (np.sign(g[:, :16]), gl)]
    ids = _models(engine, sets)
    metrics = ("recall@1", "recall@5", "map", "map@10")

    def spec(t, k):
        if sets[t][0].shape[1] != sets[k][0].shape[1]:
            return None
        return CellSpec(ids[t]["query"], ids[k]["gallery"], CellRecipe("encoder", below=below, same_set=True))

    def cell(t, k):
        (q, ql), (gg, ggl) = sets[t], sets[k]
        keep = np.ones(len(ql), bool) if below is None else ql < below
        return CellFeatures(q[keep], ql[keep], gg[keep], ggl[keep], query_ids=np.flatnonzero(keep))

    seen = []
    # with the cells' features the paired test is the two-way interval check-upgrade computes, as in process
    got = matrix_on_dask(engine, client, spec, 3, metrics=metrics, paired=PAIRED,
                         fan_out=FanOut(block_rows=37, shard_rows=29), features=cell, same_set=True,
                         progress=lambda done, total, link: seen.append((done, total)))
    want = compatibility_matrices(cell, num_models=3, metrics=metrics, same_set=True, paired=PAIRED)
    _assert_same(got, want)
    assert got.paired["recall@1"]["interval"][1][0] == "two-way" and got.paired["map"]["interval"][1][0] == "queries"
    assert got.comparable.tolist() == [[True, False, False], [True, True, False], [False, False, True]]
    # 4 comparable cells; 4 query blocks (37 x 3 + 9) x (5 partitions (29 x 4 + 4) x 2 passes + a merge + a reduce)
    assert seen[-1] == (4 * 4 * (5 * 2 + 2),) * 2 and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_a_cell_of_other_query_rows_equals_numpy_on_two_processes(engine, local2):
    q, ql, g, gl = _cell(seed=6, n=90, nq=30)
    ids = _models(engine, [(g, gl)])
    with session_scope(engine) as s:
        query = save_feature_set(s, 1, "train", "encoder", q, ql)
    metrics = ("recall@1", "recall@5", "map")
    got = matrix_on_dask(engine, local2, lambda t, k: CellSpec(query, ids[0]["gallery"]), 1, metrics=metrics,
                         fan_out=FanOut(block_rows=11, shard_rows=40))
    want = compatibility_matrices([CellFeatures(q, ql, g, gl)], metrics=metrics)
    for metric in metrics:
        assert got.values[metric][0, 0] == pytest.approx(want.values[metric][0, 0], abs=TOL)


@pytest.mark.both_databases
def test_a_run_on_dask_stores_the_in_process_matrices(tmp_path, db_url, inproc):
    cfg = _cfg(methods=["psp"], eval={"views": ["encoder", "psp"], "eval_classes": "seen",
                                      "metrics": ["recall@1", "map", "verification"]})
    lines = []
    ctx = _ctx(tmp_path, db_url, client=inproc, fan_out=FanOut(block_rows=70, shard_rows=45),
               progress=lambda f, m: lines.append(m))
    exp_id = pipeline.run_experiment(cfg, ctx)
    with session_scope(ctx.db) as s:
        stored = {(m.view, m.metric): (m.values, m.summary) for m in load_matrices(s, exp_id)}
    assert any(line.startswith("evaluating psp on Dask: ") and " tasks done" in line for line in lines)
    # the same stored features evaluated in this process, as a run without a cluster does
    again = pipeline.evaluate_experiment(ctx.db, exp_id, cfg, build_method("psp"), same_set=True)
    assert set(stored) == {(view, metric) for view in again for metric in again[view]}
    # the (block x partition) products and the in-process (block x gallery) ones may round a similarity's last bit
    # differently (BLAS picks its kernel by shape), so two scores of one query within a float32 ulp may swap: mAP moves
    # by about 1e-6 here (numpy's OpenBLAS); the tolerance leaves room for more such swaps on another CPU's BLAS
    for (view, metric), (values, summary) in stored.items():
        np.testing.assert_allclose(values, again[view][metric]["matrix"], rtol=0, atol=1e-3)
        assert summary["paired"]["verdict"] == again[view][metric]["paired"]["verdict"]
        np.testing.assert_allclose(np.array(summary["paired"]["diff"], dtype=float),
                                   np.array(again[view][metric]["paired"]["diff"], dtype=float), rtol=0, atol=1e-3)


def test_a_cancel_while_the_run_evaluates_on_dask_leaves_no_rows(tmp_path, monkeypatch, inproc):
    evaluating = []
    real = pipeline.matrix_on_dask

    def start_evaluating(*args, **kwargs):
        evaluating.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "matrix_on_dask", start_evaluating)
    ctx = _ctx(tmp_path, client=inproc, should_stop=lambda: bool(evaluating))
    with pytest.raises(Cancelled, match="cancelled during the matrix's search"):
        pipeline.run_experiment(_cfg(methods=["independent"]), ctx)
    assert evaluating and _count(ctx.db, CompatibilityMatrix) == 0 and _count(ctx.db, FeatureSet) == 0
    with session_scope(ctx.db) as s:
        assert s.get(Experiment, 1).status == "cancelled"
    assert not inproc.futures  # every future of the graph was cancelled


def test_what_dask_cannot_compute_is_refused_before_any_row(tmp_path, inproc):
    ctx = _ctx(tmp_path, client=inproc)
    with pytest.raises(ValueError, match="needs the instance gallery"):
        pipeline.run_study(_cfg(methods=["independent"], eval={"gallery": "template"}), ctx)
    init_db(ctx.db)
    assert _count(ctx.db, Experiment) == 0
    with pytest.raises(ValueError, match="must be >= 1"):
        FanOut(block_rows=0)
    cli = subprocess.run([sys.executable, "-m", "engine", "run", "--preset", "digits-tiny", "--cluster", "local:1",
                          "--gallery-partition-rows", "0", "--db", f"sqlite:///{tmp_path / 'cli.db'}"],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 2 and cli.stderr.strip().splitlines()[-1].endswith("must be >= 1, got 10000 and 0")
    assert len(cli.stderr.strip().splitlines()) == 1


def test_a_worker_killed_mid_matrix_is_recomputed_by_dask(engine):
    # a LocalCluster of its own (its nanny restarts the killed process); the first tasks done, one worker gets SIGKILL:
    # Dask recomputes what it held or ran, and the matrix equals numpy's single-shot one
    q, ql, g, gl = _cell(seed=8, n=150, nq=60)
    ids = _models(engine, [(g, gl)])
    with session_scope(engine) as s:
        query = save_feature_set(s, 1, "train", "encoder", q, ql)
    metrics = ("recall@1", "recall@5", "map")
    killed = []

    with dask_client(ClusterSpec(LOCAL, workers=2)) as client:
        def kill_one(done, total, link):
            if not killed:
                pid = next(iter(client.run(os.getpid).values()))
                os.kill(pid, signal.SIGKILL)
                killed.append((pid, done, total))

        got = matrix_on_dask(engine, client, lambda t, k: CellSpec(query, ids[0]["gallery"]), 1, metrics=metrics,
                             fan_out=FanOut(block_rows=7, shard_rows=11), progress=kill_one)
    want = compatibility_matrices([CellFeatures(q, ql, g, gl)], metrics=metrics)
    assert killed and killed[0][1] < killed[0][2]  # killed while tasks were left
    for metric in metrics:
        assert got.values[metric][0, 0] == pytest.approx(want.values[metric][0, 0], abs=TOL)
