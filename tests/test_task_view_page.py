"""The Overview shows where a task job's tasks are: its label counts them, a caption lists queued / running on
which worker / done / failed with the first error. Hand-made task rows (storage functions), read under AppTest."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from app.widgets import task_board_items
from storage import get_engine, session_scope
from storage.tasks import NewTask, TaskBoard, TaskLine, claim_task, complete_task, create_task_job, fail_task
from support.app_pages import MAIN, TIMEOUT, texts


def _task_job(engine, payload: dict, count: int, **kw) -> int:
    with session_scope(engine) as s:
        return create_task_job(s, payload, [NewTask("search", {"n": n}) for n in range(count)], **kw)


def test_board_items_add_kinds_up_per_state_and_worker():
    board = TaskBoard({"queued": 3, "running": 3, "done": 4, "failed": 1}, [
        TaskLine("running", "search", "b:2", 1), TaskLine("running", "search", "a:1", 1),
        TaskLine("running", "reduce", "a:1", 1), TaskLine("queued", "search", None, 2),
        TaskLine("queued", "reduce", None, 1), TaskLine("failed", "search", "a:1", 1, error="KeyError: 'x'\n  at y"),
        TaskLine("done", "search", "a:1", 3), TaskLine("done", "search", "b:2", 1)])
    assert task_board_items(board) == ["queued 3", "running on a:1 2", "running on b:2 1", "done 4",
                                       "failed 1 (KeyError: 'x')"]


def test_overview_shows_where_a_task_jobs_tasks_are(app_db):
    engine = get_engine(app_db)
    failing = _task_job(engine, {"query": 7, "gallery": 7, "same_set": True}, 2, max_attempts=1)
    task = claim_task(engine, "host-c:33", has_gpu=False, lease_s=600)
    with session_scope(engine) as s:
        assert fail_task(s, task.id, task.lease, "ValueError: shard 3 is missing\nTraceback ...") == "failed"
    running = _task_job(engine, {"query": 4, "gallery": 5}, 6)
    claims = [claim_task(engine, worker, has_gpu=False, lease_s=600) for worker in ("host-a:11", "host-a:11", "host-b:22")]
    with session_scope(engine) as s:
        assert complete_task(s, claims[0].id, claims[0].lease, result={})

    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    page = texts(at)
    assert f"#{running} · cell: query set #4 x gallery set #5, 6 tasks" in page
    assert "Tasks: queued 3 · running on host-a:11 1 · running on host-b:22 1 · done 1" in page
    assert f"#{failing} · cell: query set #7 x gallery set #7 (same set), 2 tasks" in page
    assert "Tasks: failed 1 (ValueError: shard 3 is missing) · cancelled 1" in page
    assert "Traceback" not in page.split("Tasks: failed")[1].splitlines()[0]


def test_overview_shows_each_task_jobs_kinds_old_cell_rows_included(app_db):
    """Task jobs are listed by their own kind: a matrix's search and reduce tasks, an embedding's extract and commit
    tasks, and a job stored before as kind "cell" still reads the same way."""
    from sqlalchemy import update

    from storage import Job
    from storage.models import LEGACY_TASK_JOB_KIND

    engine = get_engine(app_db)
    with session_scope(engine) as s:
        cells = create_task_job(s, {"cells": [{"query": 1, "gallery": 2}] * 2, "label": "experiment 4, psp"},
                                [NewTask("search", {}), NewTask("search", {}), NewTask("search", {}),
                                 NewTask("reduce", {}, after=(0,)), NewTask("reduce", {}, after=(1, 2))])
        extract = create_task_job(s, {"kind": "extract", "images": "imagefolder:/g", "model_version_id": 3,
                                      "split": "gallery"},
                                  [NewTask("extract", {}), NewTask("extract", {}), NewTask("commit", {}, after=(0, 1))])
        old = create_task_job(s, {"query": 8, "gallery": 9}, [NewTask("search", {}), NewTask("reduce", {}, after=(0,))])
        s.execute(update(Job).where(Job.id == old).values(kind=LEGACY_TASK_JOB_KIND))
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    page = texts(at)
    assert f"#{cells} · experiment 4, psp: 2 cells, 5 tasks (3 search, 2 reduce)" in page
    assert f"#{extract} · extract: imagefolder:/g by model version #3 (gallery), 3 tasks (2 extract, 1 commit)" in page
    assert f"#{old} · cell: query set #8 x gallery set #9, 2 tasks (1 search, 1 reduce)" in page
