"""Where a fan-out runs (engine.core.cluster) and ``check-upgrade --old-gallery`` sharded on Dask
(engine.evaluate.dask_search): the spec's one-line errors, the partition merge against a stable numpy sort, a
source's row ranges against numpy slices, one line without Dask, and the same check in-process and on
``LocalCluster(2)``: top-k ids and every count equal, scores to float32 rounding (1e-6), every number of the JSON
to 1e-9 (the lists are the same, so the means and intervals are)."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.cli import main
from engine.core.cluster import LOCAL, SCHEDULER, ClusterSpec, parse_cluster, requested_cluster
from engine.core.fan_out import FanOut
from engine.metrics.topk import array_blocks, merge_topk, stream_topk
from engine.sources import open_source
from support.upgrade_sources import close_json, embeddings, run, tables, write_all

ROOT = Path(__file__).resolve().parents[1]


# ---- the setting ----------------------------------------------------------------------------------------------------

def test_the_three_forms_parse():
    assert parse_cluster(None) == parse_cluster("  ") == parse_cluster("in-process") == ClusterSpec()
    assert parse_cluster("local:2") == ClusterSpec(LOCAL, workers=2)
    assert parse_cluster("tcp://10.0.0.5:8786") == ClusterSpec(SCHEDULER, address="tcp://10.0.0.5:8786")
    assert parse_cluster("tcp://dask-scheduler.internal:8786").address == "tcp://dask-scheduler.internal:8786"
    assert str(parse_cluster("local:3")) == "local:3" and str(ClusterSpec()) == "in-process"


@pytest.mark.parametrize("text, words", [
    ("local:0", "from 1 to 1024"), ("local:two", "whole number"), ("local:-1", "whole number"),
    ("local:5000", "from 1 to 1024"), ("tcp://host", "is not a cluster"), ("tcp://host:99999", "port must be"),
    ("http://host:8786", "is not a cluster"), ("host:8786", "is not a cluster"), ("tcp://a b:1", "is not a cluster"),
])
def test_a_bad_spec_is_one_line_naming_where_it_came_from(text, words):
    with pytest.raises(ValueError) as exc:
        parse_cluster(text)
    assert "\n" not in str(exc.value) and words in str(exc.value) and str(exc.value).startswith("--cluster")


def test_the_flag_replaces_the_variable():
    env = {"COMPATLAB_DASK_SCHEDULER": "tcp://10.0.0.5:8786"}
    assert requested_cluster(None, env).address == "tcp://10.0.0.5:8786"
    assert requested_cluster("in-process", env) == ClusterSpec()
    assert requested_cluster(None, {}) == ClusterSpec()
    with pytest.raises(ValueError, match=r"^\$COMPATLAB_DASK_SCHEDULER 'nowhere' is not a cluster"):
        requested_cluster(None, {"COMPATLAB_DASK_SCHEDULER": "nowhere"})


def test_a_cluster_without_dask_is_one_line(monkeypatch):
    from engine.evaluate.dask_search import dask_client

    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed raises ImportError
    with dask_client(ClusterSpec()) as client:  # in-process needs no Dask
        assert client is None
    with pytest.raises(ValueError) as exc, dask_client(ClusterSpec(LOCAL, workers=2)):
        pass
    assert "\n" not in str(exc.value) and "needs Dask: pip install -r requirements-dask.txt" in str(exc.value)


def test_the_engine_imports_without_dask():
    code = ("import sys; sys.modules['dask'] = sys.modules['distributed'] = None\n"
            "import engine.cli, engine.upgrade.from_sources, engine.evaluate.dask_search, engine.core.cluster")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_cli_refuses_a_bad_cluster_in_one_line(tmp_path, capsys):
    specs = write_all("npz", tmp_path / "s", tables(embeddings()))
    code = main(["check-upgrade", "--old-gallery", specs.old_gallery, "--old-queries", specs.old_queries,
                 "--new-queries", specs.new_queries, "--cluster", "local:zero"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: --cluster 'local:zero'") and "\n" not in err
    assert main(["check-upgrade", "--features", str(tmp_path), "--cluster", "local:2"]) == 2
    assert "--cluster go(es) with --old-gallery" in capsys.readouterr().err


# ---- the pieces: a partition's rows, the exact merge ----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["parquet", "npz"])
def test_rows_are_the_slices_of_the_reading_order(tmp_path, kind):
    tabs = tables(embeddings())
    specs = write_all(kind, tmp_path / kind, tabs)
    ids, vectors, _ = tabs["old_gallery"]
    source = open_source(specs.old_gallery, what="old gallery")
    for lo, hi in [(0, 240), (63, 64), (64, 128), (50, 190), (239, 240), (240, 240), (0, 1)]:
        got = list(source.rows(lo, hi, 25))
        assert all(1 <= len(b) <= 25 for b in got)
        assert np.array_equal(np.concatenate([b.ids for b in got]) if got else ids[:0], ids[lo:hi])
        assert np.array_equal(np.concatenate([b.vectors for b in got]) if got else vectors[:0], vectors[lo:hi])


def test_partition_lists_merge_into_one_pass_ties_included():
    """Unit vectors of entries +-0.5 or one +-1: every product is exact, so ties are exact and many."""
    rng = np.random.default_rng(1)
    units = np.array([*itertools.product((-0.5, 0.5), repeat=4), *np.eye(4), *-np.eye(4)], np.float32)
    g, q = units[rng.integers(0, len(units), 500)], units[rng.integers(0, len(units), 40)]
    sims, rows = q @ g.T, np.arange(500)
    for k in (1, 5, 37, 200):
        order = np.argsort(-sims, axis=1, kind="stable")[:, :k]  # ties: lower row first
        top = np.take_along_axis(sims, order, 1)
        beyond = (sims == top[:, -1:]).sum(1) - (top == top[:, -1:]).sum(1)
        cuts = [0, 7, 100, 101, 333, 500]
        merged = merge_topk([stream_topk(q, array_blocks(rows[a:b], g[a:b], 30), k=k) for a, b in zip(cuts, cuts[1:])], k)
        assert np.array_equal(merged.ids, order) and np.array_equal(merged.scores, top)
        assert np.array_equal(merged.tied_beyond, beyond) and merged.n_gallery == 500
    assert beyond.max() > 0


# ---- the check: in-process and on a LocalCluster of 2 worker processes ----------------------------------------------

def test_local_cluster_gives_the_in_process_check(tmp_path):
    e = embeddings()
    specs = write_all("parquet", tmp_path / "p", tables(e, text=True))  # row groups of 64: partitions start inside them
    fan_out = FanOut(block_rows=20, shard_rows=50)  # 96 stacked queries x 240 items: 5 x 5 tasks
    for settings in ({"metric": "recall@1"}, {"relevance": "none"}):
        alone = run(specs, **settings)
        said: list[str] = []
        sharded = run(specs, **settings, cluster=parse_cluster("local:2"), fan_out=fan_out,
                      progress=lambda f, m: said.append(m))
        # the search ran on the cluster (the line ends with the Dask dashboard's address when it serves one)
        assert any(m.startswith("searching the old gallery: 25 of 25 tasks") for m in said)
        a, b = alone.lists.old_old, sharded.lists.old_old
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.tied_beyond, b.tied_beyond)
        np.testing.assert_allclose(a.scores, b.scores, rtol=0, atol=1e-6)
        close_json(json.loads(json.dumps(alone.to_json())), json.loads(json.dumps(sharded.to_json())))
    # independently: old/old lists are the float64 brute-force top-k of the old queries on the old gallery
    g_ids, g_vec, _ = tables(e, text=True)["old_gallery"]
    q_ids, q_vec, _ = tables(e, text=True)["old_queries"]
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    at = {i: n for n, i in enumerate(g_ids)}
    want = np.argsort(-(unit(q_vec.astype(np.float64)) @ unit(g_vec.astype(np.float64)).T), axis=1, kind="stable")
    rows = np.array([at[i] for i in g_ids[want[:, :b.k].ravel()]]).reshape(len(q_ids), b.k)
    order = np.argsort(sharded.lists.queries.ids)  # the check's query order, by id, against the table's
    assert np.array_equal(b.ids[order], rows[np.argsort(q_ids)])


def test_a_scheduler_that_does_not_answer_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    from engine.evaluate import dask_search

    monkeypatch.setattr(dask_search, "CONNECT_TIMEOUT_S", 1)
    specs = write_all("npz", tmp_path / "s", tables(embeddings()))
    with pytest.raises(ValueError) as exc:
        run(specs, cluster=parse_cluster("tcp://127.0.0.1:9"))
    assert str(exc.value).startswith("no Dask scheduler answered at tcp://127.0.0.1:9") and "\n" not in str(exc.value)


def test_a_partition_whose_items_changed_is_refused(tmp_path):
    from engine.evaluate.dask_search import ids_digest, partition_topk
    from engine.sources import SourceError

    tabs = tables(embeddings())
    specs = write_all("parquet", tmp_path / "p", tabs)
    ids, vectors, _ = tabs["old_gallery"]
    q = tabs["old_queries"][1][:5]
    top = partition_topk(specs.old_gallery, "old gallery", 50, 120, ids_digest(ids[50:120]), q, k=3)
    want = np.argsort(-(q / np.linalg.norm(q, axis=1, keepdims=True)) @ (vectors[50:120] / np.linalg.norm(
        vectors[50:120], axis=1, keepdims=True)).T, axis=1, kind="stable")[:, :3] + 50
    assert np.array_equal(top.ids, want) and top.n_gallery == 70
    with pytest.raises(SourceError, match="changed while it was read"):
        partition_topk(specs.old_gallery, "old gallery", 50, 120, ids_digest(ids[51:121]), q, k=3)


@pytest.mark.parametrize("after", [0, 1])
def test_a_cancelled_job_cancels_the_sharded_search(tmp_path, after):
    """The job's cancel event, set before the search or after its first finished task, ends the wait with Cancelled
    and cancels every task on the cluster (an in-process threads cluster: the same client calls, no processes)."""
    distributed = pytest.importorskip("distributed")
    import threading
    import time

    from engine.core.signals import Cancelled, cancel_scope
    from engine.evaluate.dask_search import sharded_topk

    tabs = tables(embeddings())
    specs = write_all("parquet", tmp_path / "p", tabs)
    ids, _, _ = tabs["old_gallery"]
    queries = tabs["old_queries"][1]
    event = threading.Event()
    seen: list[int] = []

    def progress(done, total):
        seen.append(done)
        if len(seen) >= after:
            event.set()

    if after == 0:
        event.set()
    with (distributed.Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client,
          cancel_scope(event)):
        with pytest.raises(Cancelled, match=r"cancelled during the sharded search \(\d+ of 25 tasks done\)"):
            sharded_topk(client, specs.old_gallery, "old gallery", ids, queries, k=3,
                         fan_out=FanOut(block_rows=10, shard_rows=50), progress=progress)
        assert len(seen) == after  # it stopped at the first look after the event
        deadline = time.monotonic() + 60  # the scheduler releases cancelled keys asynchronously: wait for it
        while client.who_has() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not client.who_has()  # nothing of the search is kept on the cluster
