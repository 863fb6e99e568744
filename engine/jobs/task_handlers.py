"""The task handlers the workers run: one registry, task kind -> handler (``storage.models.TASK_KINDS``).

The task mechanism (:mod:`engine.tasks.loop`) knows no kind; ``python -m engine worker --tasks`` passes this registry
to it (:func:`serve_tasks`). ``search`` and ``reduce``: a matrix's cells (:mod:`engine.evaluate.search_tasks`);
``extract`` and ``commit``: an image set embedded by one checkpoint (:mod:`engine.checkpoints.extract_tasks`).
"""
from __future__ import annotations

import threading

from sqlalchemy import Engine

from engine.checkpoints.extract_tasks import commit_task, extract_task
from engine.evaluate.search_tasks import reduce_task, search_task
from engine.tasks.loop import Handler, run_tasks, worker_name
from storage import init_db

TASK_HANDLERS: dict[str, Handler] = {"search": search_task, "reduce": reduce_task, "extract": extract_task,
                                      "commit": commit_task}


def serve_tasks(db: Engine, *, once: bool = False) -> int:
    """``python -m engine worker --tasks``: run tasks as ``host:pid`` (``once``: until none is left); return how many."""
    import torch

    init_db(db)
    return run_tasks(db, worker_name(), torch.cuda.is_available(), threading.Event(), handlers=TASK_HANDLERS,
                     until_idle=once)


__all__ = ["TASK_HANDLERS", "serve_tasks"]
