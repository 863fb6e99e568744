"""Issue 44: Cancel ends a hanging job within its lease. A job blocked in one SQL statement that never ends (an endless
recursive view) or in an ONNX graph never looked at its cancel flag; now the worker's heartbeat thread sets the job's
cancel event and the blocking call is ended from another thread (SQLite's progress handler, a PostgreSQL statement's
cancel, ONNX's RunOptions.terminate). Each test waits on the job's state with a deadline, never a fixed sleep."""
from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from engine.core.signals import Cancelled, cancel_scope
from engine.jobs import worker
from engine.jobs.job_handlers import JOB_HANDLERS
from engine.sources import open_source
from storage import enqueue_job, get_engine, init_db, request_cancel, session_scope
from storage.models import Job


def forever_db(path):
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE VIEW forever AS WITH RECURSIVE n(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n) "
                     "SELECT max(id) AS id, '[1.0, 2.0]' AS vector FROM n")
    conn.close()
    return path


def wait_for(condition, deadline_s: float, what: str):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if (got := condition()) is not None:
            return got
        time.sleep(0.05)  # polling interval for the condition, not a wait for it
    pytest.fail(f"{what} within {deadline_s} s")


def test_cancel_ends_a_job_blocked_in_an_endless_sql_statement_within_its_lease(tmp_path, monkeypatch):
    db = get_engine(f"sqlite:///{tmp_path / 'lab.db'}")
    init_db(db)
    source = f"sql:sqlite:///{forever_db(tmp_path / 'store.db')}#table=forever"
    entered = threading.Event()

    def handler(_db, _payload, _ctx):
        entered.set()
        open_source(source, what="old gallery")  # its first statement never returns by itself (600 s budget)
        return "never reached"

    monkeypatch.setitem(JOB_HANDLERS, "analysis", handler)
    monkeypatch.setattr(worker, "HEARTBEAT_S", 0.2)
    with session_scope(db) as s:
        job_id = enqueue_job(s, "analysis", {"n": 1})
    thread = threading.Thread(target=worker.run_one, args=(db,), daemon=True)
    thread.start()
    assert entered.wait(60)
    started = time.monotonic()
    with session_scope(db) as s:
        request_cancel(s, job_id)

    def ended():
        with session_scope(db) as s:
            job = s.get(Job, job_id)
            return (job.status, job.message) if job.status != "running" else None

    status, message = wait_for(ended, worker.STALE_AFTER_S, "the cancelled job did not end")
    assert status == "cancelled" and "cancelled while reading" in message
    assert time.monotonic() - started < worker.STALE_AFTER_S  # within the lease a stale sweep would give it
    thread.join(10)
    assert not thread.is_alive()


def test_outside_a_job_the_statement_keeps_its_own_time_limit(tmp_path):
    """No cancel event (a CLI run): the endless statement ends at its #timeout, with the time-limit line."""
    from engine.sources import SourceError

    source = f"sql:sqlite:///{forever_db(tmp_path / 'store.db')}#table=forever&timeout=1"
    with pytest.raises(SourceError, match="ran past its time limit of 1 s"):
        open_source(source, what="old gallery")


def endless_loop_model(path):
    """An ONNX graph whose Loop runs 2^62 iterations (a 'cond' that stays true): a run never ends by itself."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)], "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [helper.make_tensor("trips", TensorProto.INT64, [], [2 ** 62]), helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_cancel_terminates_an_onnx_run_under_way(tmp_path):
    """The ONNX text encoder's run (OnnxTextEncoder.states, on a graph whose Loop would run for ever) is terminated
    when the job's cancel event is set from another thread, and raises Cancelled naming the model."""
    ort = pytest.importorskip("onnxruntime")
    import numpy as np

    from engine.models.text_encoder import OnnxTextEncoder

    encoder = object.__new__(OnnxTextEncoder)  # the graph alone: no tokenizer is needed to run it
    encoder.session = ort.InferenceSession(str(endless_loop_model(tmp_path / "loop.onnx")),
                                           providers=["CPUExecutionProvider"])
    encoder.output, encoder.inputs, encoder.pooled, encoder.name = "y", ["x"], False, "loop.onnx"
    event = threading.Event()
    threading.Timer(0.5, event.set).start()  # the heartbeat's part: the job is cancelled while the graph runs
    started = time.monotonic()
    with cancel_scope(event), pytest.raises(Cancelled, match="cancelled while running loop.onnx"):
        encoder.states({"x": np.zeros(1, np.float32)})
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_cancel_ends_a_postgresql_statement_under_way(pg_server):
    """pg_sleep(100000) under the default 600 s statement budget: the job's cancel event cancels the statement on its
    connection (psycopg's cancel, from the watcher thread) and the read raises Cancelled."""
    url = pg_server.create_database()
    event = threading.Event()
    threading.Timer(1.0, event.set).start()
    started = time.monotonic()
    with cancel_scope(event), pytest.raises(Cancelled, match="cancelled while reading"):
        open_source(f"sql:{url}#query=SELECT 1 AS id, ARRAY[1.0] AS vector FROM pg_sleep(100000)", what="old gallery")
    assert time.monotonic() - started < 60
