"""``python -m engine worker`` (run queued jobs) and ``extract`` (one checkpoint's embedding of an image set, in
this process or fanned out over a Dask cluster with ``--cluster``)."""
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
    w.add_argument("--threads", type=int, metavar="N",
                   help="torch / BLAS / numba threads (default: $COMPATLAB_THREADS, else the libraries' own defaults, "
                        "every core; run_app.py has its workers share the cores: --share-cores)")
    w.add_argument("--share-cores", action="store_true",
                   help="as each job starts, use cores // the jobs running on this machine (this one included), "
                        "unless --threads or $COMPATLAB_THREADS gives a count (run_app.py starts its workers so)")
    add_db(w, torchscript=True)
    add_ceiling_argument(w)


def add_extract_arguments(ex: argparse.ArgumentParser) -> None:
    """The options of ``extract``."""
    ex.add_argument("--model-version", type=int, required=True, metavar="ID", help="the model version the features belong to")
    ex.add_argument("--checkpoint", required=True, metavar="FILE", help="checkpoint file (or pretrained:NAME)")
    ex.add_argument("--arch", help="architecture of a plain state_dict (see compare-checkpoints)")
    ex.add_argument("--num-classes", type=int, metavar="N")
    ex.add_argument("--input-size", type=int, metavar="PX", help="image size the model takes (default: its own)")
    ex.add_argument("--images", required=True, metavar="TEXT", help="NAME[:ROOT], e.g. imagefolder:/data/gallery")
    ex.add_argument("--split", required=True, help="query, gallery or train")
    ex.add_argument("--rows-per-part", type=int, default=10_000, metavar="N",
                    help="images per Dask task and per feature-store part (default 10000)")
    ex.add_argument("--batch-size", type=int, default=64)
    ex.add_argument("--cluster", metavar="SPEC",
                    help="where the parts are embedded: in-process (the default), local:N (a Dask LocalCluster of N "
                         "worker processes) or tcp://HOST:PORT (a running Dask scheduler whose workers reach the "
                         "images and the feature store); default $COMPATLAB_DASK_SCHEDULER, else in-process")
    add_db(ex)


def cmd_worker(args: argparse.Namespace) -> int:
    """``worker``: run queued jobs until interrupted (``--once``: until none is queued)."""
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
        serve(get_engine(args.db), once=args.once, checkpoint_dir=args.checkpoints, kinds=args.kinds,
              share_cores=share)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    """``extract``: embed the image set into feature-store parts (on Dask with ``--cluster``), commit it as one
    feature set per raw view, and print a line saying so."""
    from engine.checkpoints.extract_dask import extract_on_dask
    from engine.core.cluster import requested_cluster
    from engine.evaluate.dask_search import dask_client
    from storage import get_engine, init_db

    db = get_engine(args.db)
    init_db(db)
    model = {"path": args.checkpoint, "arch": args.arch, "num_classes": args.num_classes,
             "preprocessing": {"input_size": args.input_size}}
    cluster = requested_cluster(args.cluster)
    with dask_client(cluster) as client:
        done = extract_on_dask(db, client, model_version_id=args.model_version, model=model, images=args.images,
                               split=args.split, rows_per_part=args.rows_per_part, batch_size=args.batch_size)
    print(f"{done['count']} images embedded in {done['parts']} part(s) ({cluster}): {', '.join(done['views'])} of "
          f"model version {args.model_version} ({args.split})")
    return 0
