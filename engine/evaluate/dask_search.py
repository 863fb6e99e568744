"""Exact sharded top-k search on Dask: query blocks x gallery partitions, each task reading its own gallery rows.

:func:`dask_client` opens what :class:`engine.core.cluster.ClusterSpec` names (nothing in-process, a
``LocalCluster`` closed at the end, or a running scheduler) and says in one line when Dask is not installed.
:func:`sharded_topk` cuts a source's reading order into partitions of :attr:`FanOut.shard_rows` rows and the queries
into blocks of :attr:`FanOut.block_rows`; each task (:func:`partition_topk`) opens the source by its text, reads its
partition (:meth:`engine.sources.Source.rows`), checks that it holds the items the check numbered (a digest of their
ids) and returns its queries' partial top-k (:func:`engine.metrics.topk.stream_topk`, ids = gallery rows). Only the
query blocks (scattered once, to every worker: scattered data is not recomputed, so a worker that dies loses no
block another still holds) and the partial lists pass through the scheduler, never the gallery; a killed worker's
tasks are recomputed by Dask on the others (tests/test_dask_faults.py). The partial lists are merged exactly in
partition order (:func:`engine.metrics.topk.merge_topk`): ids, ties (lower row first) and ``tied_beyond`` are those
of one streamed pass; scores are float32 products, which BLAS may round differently for tiles of another shape (a
few ulps, so two items within that of each other may swap).
"""
from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import CancelledError
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from engine.core.cluster import LOCAL, ClusterSpec
from engine.core.fan_out import FanOut
from engine.core.signals import Cancelled, cancel_requested
from engine.core.threads import library_env, per_process
from engine.metrics.device import one_pass_at_a_time
from engine.metrics.topk import TopK, merge_topk, stream_topk
from engine.sources import open_source
from engine.sources.base import join_ids
from engine.sources.text import SourceError, first_line

CONNECT_TIMEOUT_S = 30
CANCEL_POLL_S = 0.5  # how often the wait for the tasks looks at the job's cancel event


def _distributed(spec: ClusterSpec) -> Any:
    """The ``distributed`` module, or one line saying how to install it."""
    try:
        import distributed
    except ImportError:
        raise ValueError(f"--cluster {spec} needs Dask: pip install -r requirements-dask.txt (or pip install -e "
                         ".[dask]); without it the check runs in this process") from None
    return distributed


@contextmanager
def dask_client(spec: ClusterSpec) -> Iterator[Any | None]:
    """A ``distributed.Client`` for ``spec`` while the block runs (None in-process); a ``local:N`` cluster is started
    here (N processes of one task each, their libraries' threads sharing the cores) and closed at the end."""
    if spec.in_process:
        yield None
        return
    distributed = _distributed(spec)
    if spec.kind == LOCAL:
        env = library_env(per_process(processes=spec.workers))
        with (distributed.LocalCluster(n_workers=spec.workers, threads_per_worker=1, processes=True,
                                       dashboard_address=None, silence_logs=logging.ERROR, env=env) as cluster,
              distributed.Client(cluster) as client):
            yield client
        return
    try:
        client = distributed.Client(spec.address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        raise ValueError(f"no Dask scheduler answered at {spec.address} within {CONNECT_TIMEOUT_S} s "
                         f"({first_line(exc)})") from None
    try:
        yield client
    finally:
        client.close()


def dashboard_link(client: Any) -> str | None:
    """The Dask dashboard's address of the client's cluster, or None when it serves none."""
    try:
        return client.dashboard_link or None
    except (AttributeError, KeyError, OSError, ValueError):
        return None


def ids_digest(ids: np.ndarray) -> str:
    """A digest of ids in order (integers or text): equal ids, equal digests."""
    ids = np.asarray(ids)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{len(ids)}:{ids.dtype.kind == 'U'}:".encode())
    if ids.dtype.kind == "U":
        h.update("\0".join(ids.tolist()).encode("utf-8", "surrogatepass"))
    else:
        h.update(np.ascontiguousarray(ids, np.int64).tobytes())
    return h.hexdigest()


def partition_topk(text: str, what: str, lo: int, hi: int, digest: str, queries: np.ndarray, *, k: int,
                   backend: str = "numpy", block_rows: int = 65536) -> TopK:
    """The queries' top-``k`` among rows ``lo`` to ``hi - 1`` of the source ``text`` (ids = row numbers); a
    :class:`SourceError` when those rows no longer hold the items whose ids gave ``digest``."""
    source = open_source(text, what=what)
    read: list[np.ndarray] = []

    def blocks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        at = lo
        for block in source.rows(lo, hi, block_rows):
            read.append(block.ids)
            yield np.arange(at, at + len(block), dtype=np.int64), np.require(block.vectors, requirements="W")
            at += len(block)
        if at != hi or ids_digest(join_ids(read, where=source.description)) != digest:
            raise SourceError(f"{source.description} changed while it was read (rows {lo} to {hi - 1} no longer "
                              "hold the items the check numbered)")

    try:
        with one_pass_at_a_time(numpy_products=False):  # a threaded worker: one compiled pass at a time (device.py)
            return stream_topk(queries, blocks(), k=k, backend=backend)
    finally:
        source.close()


def lost_line(client: Any, what: str, done: int, total: int) -> str:
    """One line for tasks the cluster dropped: the scheduler went away, or every copy of their input died."""
    scheduler = getattr(client.scheduler, "address", None) or "its address"
    if client.status != "running":
        return (f"the Dask scheduler at {scheduler} went away during {what} ({done} of {total} tasks done); nothing was "
                "written")
    return (f"the Dask cluster at {scheduler} lost the tasks of {what} ({done} of {total} done; every worker holding "
            "their input died); nothing was written")


def wait_for(futures: list[Any], *, what: str, progress: Callable[[int, int], None] | None = None,
             should_stop: Callable[[], bool] | None = None) -> None:
    """Wait until every future is finished, raising the first task error as it was raised there; ``progress(done,
    total)`` as they finish (at most once per :data:`CANCEL_POLL_S`, and at the end). A cancelled job
    (:func:`engine.core.signals.cancel_requested`, or ``should_stop``, asked at most once per poll: it may query the
    database) raises :class:`~engine.core.signals.Cancelled` naming ``what`` within :data:`CANCEL_POLL_S`; the caller
    cancels the futures on the cluster. Tasks the cluster drops (its scheduler went away, every worker holding their
    input died, or a task's workers died more often than Dask allows) raise a one-line ``ValueError``."""
    from distributed import KilledWorker, wait

    pending, done, told, asked = set(futures), 0, 0, -CANCEL_POLL_S
    try:
        while pending:
            now = time.monotonic()
            if cancel_requested() or (should_stop is not None and now - asked >= CANCEL_POLL_S and should_stop()):
                raise Cancelled(f"cancelled during {what} ({done} of {len(futures)} tasks done)")
            asked = now if now - asked >= CANCEL_POLL_S else asked
            try:
                finished, pending = wait(pending, timeout=CANCEL_POLL_S, return_when="FIRST_COMPLETED")
            except TimeoutError:  # none finished within the poll: look at the cancel event again
                continue
            for future in finished:
                future.result()  # a task's error, raised here as it was raised there
            done += len(finished)
            if progress is not None and finished and (not pending or time.monotonic() - told >= CANCEL_POLL_S):
                progress(done, len(futures))
                told = time.monotonic()
    except CancelledError:  # not the job's cancel (Cancelled is no CancelledError): the cluster dropped the tasks
        raise ValueError(lost_line(futures[0].client, what, done, len(futures))) from None
    except KilledWorker as exc:  # Dask gave up on a task after its allowed failures
        raise ValueError(f"every Dask worker that ran one task of {what} died ({done} of {len(futures)} tasks done; "
                         f"nothing was written): {first_line(exc)}") from None


def sharded_topk(client: Any, text: str, what: str, ids: np.ndarray, queries: np.ndarray, *, k: int,
                 backend: str = "numpy", block_rows: int = 65536, fan_out: FanOut = FanOut(),
                 progress: Callable[[int, int], None] | None = None) -> TopK:
    """Each query's top-``k`` rows of the source ``text`` whose ids in reading order are ``ids``, computed on the
    client's cluster as (query block x gallery partition) tasks and merged exactly (module docstring).
    ``progress(done, total)`` is called as tasks finish; a cancelled job (:func:`engine.core.signals.cancel_requested`)
    raises :class:`~engine.core.signals.Cancelled` within :data:`CANCEL_POLL_S` and its tasks are cancelled on the
    cluster; tasks the cluster drops (its scheduler went away, every worker holding a query block died, or a task's
    workers died more often than Dask allows) raise a one-line ``ValueError``."""
    n_g, n_q = len(ids), len(queries)
    if not n_g:
        raise ValueError("the gallery is empty: no block has an item")
    parts = [(lo, min(n_g, lo + fan_out.shard_rows)) for lo in range(0, n_g, fan_out.shard_rows)]
    digests = [ids_digest(ids[lo:hi]) for lo, hi in parts]
    # on every worker: scattered data is not recomputed, so a block held by one worker alone dies with it
    q_blocks = client.scatter([queries[lo: lo + fan_out.block_rows] for lo in range(0, n_q, fan_out.block_rows)],
                              broadcast=True)
    futures = [[client.submit(partition_topk, text, what, lo, hi, digest, block, k=k, backend=backend,
                              block_rows=block_rows, pure=False) for (lo, hi), digest in zip(parts, digests)]
               for block in q_blocks]
    flat = [f for row in futures for f in row]
    try:
        wait_for(flat, what="the sharded search", progress=progress)
        merged = [merge_topk(client.gather(row), k) for row in futures]
    except CancelledError:  # the scheduler went away between the wait and the gather
        raise ValueError(lost_line(client, "the sharded search", len(flat), len(flat))) from None
    finally:
        if client.status == "running":  # a client whose scheduler went away has nothing left to cancel
            client.cancel(flat + list(q_blocks))
    return TopK(np.concatenate([m.ids for m in merged]), np.concatenate([m.scores for m in merged]),
                np.concatenate([m.tied_beyond for m in merged]), n_g)


__all__ = ["CONNECT_TIMEOUT_S", "dashboard_link", "dask_client", "ids_digest", "partition_topk", "sharded_topk", "wait_for"]
