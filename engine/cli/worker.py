"""``python -m engine worker`` (run queued jobs, or with ``--tasks`` the tasks of fanned-out jobs) and
``extract-tasks`` (queue one checkpoint's embedding of an image set as tasks for many workers)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from engine.checkpoints.files import add_ceiling_argument
from engine.cli.options import add_db
from engine.core.contract import JOB_KINDS, SHORT_JOB_KINDS


def add_worker_arguments(w: argparse.ArgumentParser) -> None:
    """The options of ``worker``."""
    w.add_argument("--once", action="store_true", help="exit when the queue is empty")
    w.add_argument("--checkpoints", type=Path, help="checkpoint folder (default: the database's own)")
    w.add_argument("--kinds", nargs="+", choices=JOB_KINDS, metavar="KIND",
                   help=f"run only jobs of these kinds ({', '.join(JOB_KINDS)}; default: every kind); run_app.py "
                        f"starts a second worker with --kinds {' '.join(SHORT_JOB_KINDS)}")
    w.add_argument("--tasks", action="store_true",
                   help="run tasks of fanned-out jobs (matrix cells, extractions) instead of jobs (any number of "
                        "machines, one database)")
    w.add_argument("--threads", type=int, metavar="N",
                   help="torch / BLAS / numba threads (default: $COMPATLAB_THREADS, else the libraries' own defaults, "
                        "every core; run_app.py has its workers share the cores: --share-cores)")
    w.add_argument("--share-cores", action="store_true",
                   help="as each job starts, use cores // the jobs running on this machine (this one included), "
                        "unless --threads or $COMPATLAB_THREADS gives a count (run_app.py starts its workers so)")
    add_db(w, torchscript=True)
    add_ceiling_argument(w)


def add_extract_arguments(ex: argparse.ArgumentParser) -> None:
    """The options of ``extract-tasks``."""
    ex.add_argument("--model-version", type=int, required=True, metavar="ID", help="the model version the features belong to")
    ex.add_argument("--checkpoint", required=True, metavar="FILE", help="checkpoint file (or pretrained:NAME)")
    ex.add_argument("--arch", help="architecture of a plain state_dict (see compare-checkpoints)")
    ex.add_argument("--num-classes", type=int, metavar="N")
    ex.add_argument("--input-size", type=int, metavar="PX", help="image size the model takes (default: its own)")
    ex.add_argument("--images", required=True, metavar="TEXT", help="NAME[:ROOT], e.g. imagefolder:/data/gallery")
    ex.add_argument("--split", required=True, help="query, gallery or train")
    ex.add_argument("--rows-per-task", type=int, default=10_000, metavar="N")
    ex.add_argument("--batch-size", type=int, default=64)
    ex.add_argument("--needs-gpu", action="store_true", help="only workers with a GPU take the extract tasks")
    add_db(ex)


def cmd_worker(args: argparse.Namespace) -> int:
    """``worker``: run queued jobs (``--tasks``: tasks) until interrupted (``--once``: until none is queued)."""
    from engine.core import threads
    from engine.models import thread_pools
    from engine.jobs.worker import serve
    from storage import get_engine

    count = threads.requested(args.threads)
    share = args.share_cores and count is None
    if count is None and not share:  # on its own: the libraries' defaults (every core) stay as they are
        import torch

        print(f"worker {os.getpid()}: torch's default {torch.get_num_threads()} compute thread(s) (--threads N or "
              f"${threads.THREADS_ENV} to choose)", flush=True)
    else:
        count = count or threads.available_cores()  # sharing: every core until a job beside it starts
        used = thread_pools.apply(count)
        print(f"worker {os.getpid()}: {count} compute thread(s) "
              f"({', '.join(f'{lib} {n}' for lib, n in used.items())})"
              f"{'; each job: cores // the jobs running on this machine' if share else ''}", flush=True)
    try:
        if args.tasks:
            from engine.jobs.task_handlers import serve_tasks

            serve_tasks(get_engine(args.db), once=args.once)
            return 0
        serve(get_engine(args.db), once=args.once, checkpoint_dir=args.checkpoints, kinds=args.kinds,
              share_cores=share)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_extract_tasks(args: argparse.Namespace) -> int:
    """``extract-tasks``: queue the extraction as tasks and print the job's id."""
    from engine.checkpoints.extract_tasks import fan_out_extract
    from storage import get_engine, init_db

    db = get_engine(args.db)
    init_db(db)
    model = {"path": args.checkpoint, "arch": args.arch, "num_classes": args.num_classes,
             "preprocessing": {"input_size": args.input_size}}
    print(fan_out_extract(db, model_version_id=args.model_version, model=model, images=args.images, split=args.split,
                          rows_per_task=args.rows_per_task, batch_size=args.batch_size, needs_gpu=args.needs_gpu))
    return 0
