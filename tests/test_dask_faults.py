"""Faults during ``check-upgrade --old-gallery`` sharded on Dask (issue 41), each made deterministic by a gate the test
holds: every partition task blocks, once its worker process has said which it is, until the test releases it.

- A worker process killed with SIGKILL while it runs a partition: Dask recomputes its partitions on the surviving
  worker and on the one its nanny restarts; the check equals the in-process one (top-k ids and tie counts equal,
  scores to float32 rounding 1e-6, every JSON number to 1e-9) and the old queries' lists equal a float64 numpy
  brute force.
- A task whose workers die more often than Dask allows (``allowed-failures`` 0): one line, ``ValueError``.
- The scheduler killed while the tasks run: the CLI fails with one line (exit 2), writes nothing.
- A job cancelled during the fan-out: tests/test_dask_search.py (``test_a_cancelled_job_cancels_the_sharded_search``).

The gate wraps the source each task opens (:func:`engine.evaluate.dask_search.open_source`, patched in the worker
processes through ``client.run``; a restarted worker runs the production code unpatched); the production code has no
hook for it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.cli import main
from engine.core.cluster import parse_cluster
from engine.core.fan_out import FanOut
from support.upgrade_sources import close_json, embeddings, run, tables, write_all

distributed = pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 180  # a generous bound on every wait for a condition; none of them is a timing assertion
STARTED, RELEASE = "compatlab-test-started", "compatlab-test-release"


class GatedSource:
    """A source whose :meth:`rows` first puts its worker process's pid on the ``STARTED`` queue, then waits for the
    ``RELEASE`` event; everything else is the wrapped source's."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def rows(self, lo: int, hi: int, block_rows: int):
        distributed.Queue(STARTED).put(os.getpid())
        if not distributed.Event(RELEASE).wait(timeout=DEADLINE_S):
            raise TimeoutError("the test never released the gate")
        yield from self.inner.rows(lo, hi, block_rows)


def gate_partitions() -> int:
    """Run in each worker process: its partition tasks open gated sources. Returns the process's pid."""
    from engine.evaluate import dask_search

    opened = dask_search.open_source
    dask_search.open_source = lambda text, *, what: GatedSource(opened(text, what=what))
    return os.getpid()


def started_pid(client) -> int:
    """The pid of a worker process that is running a gated partition task (waits for one)."""
    return distributed.Queue(STARTED, client=client).get(timeout=DEADLINE_S)


def holder_of_most_blocks(client) -> str:
    """The address of the worker holding the most scattered query blocks (the first of the ties): the hardest one to
    lose, since a block held by it alone is not recomputed."""
    held: dict[str, int] = {}
    for key, workers in client.who_has().items():
        if str(key).startswith("ndarray-"):  # the scattered query blocks; the tasks' keys are partition_topk-...
            for worker in workers:
                held[worker] = held.get(worker, 0) + 1
    return sorted(held, key=lambda w: (-held[w], w))[0]


def check_with_a_worker_killed(specs, fan_out: FanOut) -> tuple[dict, list[str]]:
    """The check on a ``LocalCluster(2)`` whose worker holding the most query blocks is SIGKILLed while both workers
    are inside a partition task; returns ({"check": the check} or {"error": what it raised}, its progress lines)."""
    with (distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
          distributed.Client(cluster) as client):
        client.wait_for_workers(2)
        pids = set(client.run(gate_partitions).values())
        assert len(pids) == 2
        said: list[str] = []
        outcome: dict = {}

        def check() -> None:
            try:
                outcome["check"] = run(specs, cluster=parse_cluster(cluster.scheduler_address), fan_out=fan_out,
                                       progress=lambda f, m: said.append(m))
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
                outcome["error"] = exc

        thread = threading.Thread(target=check, daemon=True)
        thread.start()
        assert {started_pid(client), started_pid(client)} == pids  # both workers are inside a partition
        victim = client.run(os.getpid)[holder_of_most_blocks(client)]
        os.kill(victim, signal.SIGKILL)
        distributed.Event(RELEASE, client=client).set()
        thread.join(DEADLINE_S)
        assert not thread.is_alive(), "the check did not end after the kill"
        assert victim not in client.run(os.getpid).values()  # the killed process is gone
    return outcome, said


def test_a_worker_killed_mid_search_is_recomputed_and_the_check_is_unchanged(tmp_path):
    e = embeddings()
    tabs = tables(e, text=True)
    specs = write_all("parquet", tmp_path / "p", tabs)
    alone = run(specs)
    # 96 stacked queries x 240 items: 2 query blocks x 5 partitions
    outcome, said = check_with_a_worker_killed(specs, FanOut(block_rows=48, shard_rows=50))
    assert "error" not in outcome, outcome.get("error")
    sharded = outcome["check"]
    # every task done (the line ends with the Dask dashboard's address when the cluster serves one)
    assert any(line.startswith("searching the old gallery: 10 of 10 tasks") for line in said)
    a, b = alone.lists.old_old, sharded.lists.old_old
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.tied_beyond, b.tied_beyond)
    np.testing.assert_allclose(a.scores, b.scores, rtol=0, atol=1e-6)
    close_json(json.loads(json.dumps(alone.to_json())), json.loads(json.dumps(sharded.to_json())))
    # independently: old/old lists are the float64 brute-force top-k of the old queries on the old gallery
    g_ids, g_vec, _ = tabs["old_gallery"]
    q_ids, q_vec, _ = tabs["old_queries"]
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    want = np.argsort(-(unit(q_vec.astype(np.float64)) @ unit(g_vec.astype(np.float64)).T), axis=1, kind="stable")
    order = np.argsort(sharded.lists.queries.ids)  # the check's query order, by id, against the table's
    assert np.array_equal(b.ids[order], want[:, :b.k][np.argsort(q_ids)])


def test_a_task_whose_workers_die_more_often_than_dask_allows_fails_in_one_line(tmp_path):
    import dask

    specs = write_all("parquet", tmp_path / "p", tables(embeddings()))
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):  # the first death gives the task up
        outcome, _ = check_with_a_worker_killed(specs, FanOut(block_rows=48, shard_rows=50))
    error = outcome.get("error")
    assert isinstance(error, ValueError) and "\n" not in str(error), repr(error)
    assert str(error).startswith("every Dask worker that ran one task of the sharded search died"), str(error)


@pytest.fixture
def scheduler_and_workers(tmp_path):
    """A ``dask scheduler`` process and a ``dask worker`` process of 2 worker processes, each started here and
    killed at the end by its own pid; yields (scheduler process, its address)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    file = tmp_path / "scheduler.json"
    started: list[subprocess.Popen] = []
    try:
        started.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                         "--port", "0", "--no-dashboard", "--scheduler-file", str(file)],
                                        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        started.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                         str(file), "--nworkers", "2", "--nthreads", "1", "--no-dashboard"],
                                        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with distributed.Client(scheduler_file=str(file), timeout=DEADLINE_S) as client:
            client.wait_for_workers(2, timeout=DEADLINE_S)
            address = client.scheduler.address
        yield started[0], address
    finally:
        for process in started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
            process.wait(DEADLINE_S)


def test_a_scheduler_killed_mid_run_fails_the_check_in_one_line_and_writes_nothing(tmp_path, capsys,
                                                                                    scheduler_and_workers):
    scheduler, address = scheduler_and_workers
    specs = write_all("parquet", tmp_path / "p", tables(embeddings()))
    out = tmp_path / "out"
    out.mkdir()
    with distributed.Client(address, timeout=DEADLINE_S) as client:
        client.run(gate_partitions)
        code: list[int] = []
        thread = threading.Thread(target=lambda: code.append(main([
            "check-upgrade", "--old-gallery", specs.old_gallery, "--old-queries", specs.old_queries,
            "--new-queries", specs.new_queries, "--cluster", address, "--resamples", "50",
            "--json", str(out / "check.json"), "--report", str(out / "check.md")])), daemon=True)
        thread.start()
        started_pid(client)  # a partition task is running: the fan-out is under way
    os.kill(scheduler.pid, signal.SIGKILL)
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "the check did not end after the scheduler died"
    err = capsys.readouterr().err.strip()
    assert code == [2], err
    assert err.startswith(f"error: the Dask scheduler at {address} went away") and "\n" not in err, err
    assert list(out.iterdir()) == []  # no JSON, no report, no part file
