"""One image set embedded by one checkpoint, fanned out over a Dask cluster: :func:`extract_on_dask`.

1. :func:`extract_part` per row range ``(lo, hi)`` (a Dask task, or in this process without a cluster): load the model
   (on the worker's GPU when it has one), decode only those images a batch at a time, embed them (the raw views
   ``encoder``, ``logits``, ``softmax``, as :func:`engine.checkpoints.embedding.extract` gives them) and write each
   view's part to the feature store under the run's key for that view (``featurestore.write_part``: a fresh file
   name per attempt, so a part Dask recomputes after a lost worker never overwrites one). It returns only the parts'
   shard entries.
2. One commit in this process, one transaction: a ``FeatureSet`` per view whose pointer lists the parts in row order,
   with the rows Parquet (labels and image ids of the whole set); the parts it did not take are swept. Until then no
   row points at any part, so nothing is visible; a failed or cancelled run cancels its futures, waits until no
   worker still runs one of its tasks and deletes the run's folders, so no part file is left.

The stored sets are what the single-process path (``record_experiment`` after ``extract``) stores for the same
images and model, up to float tolerance (batches are cut at other rows). The workers must reach the database's
feature store (``$COMPATLAB_FEATURE_STORE``: a shared folder or an s3:// URL) and the images.
"""
from __future__ import annotations

import hashlib
import json
import uuid
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from engine.checkpoints.embedding import ImageSource, check_batch_bytes, extract, model_batch, probe
from engine.checkpoints.files import DEFAULT_MAX_BYTES, LOCAL, Trust
from engine.checkpoints.loading import LoadedModel, load_model
from engine.checkpoints.request import ModelSource, model_source
from engine.data.bounds import check_batch_size
from engine.core.cell import RAW_VIEWS
from engine.core.fingerprint import Fingerprint, normalisation_of
from engine.core.signals import check_stop
from engine.evaluate.dask_search import wait_for
from engine.models.device import pick_device
from engine.results.record import fingerprint_name
from storage import SPLITS, featurestore, get_engine, get_model_version, save_stored_feature_set, session_scope
from storage.rows import require_choice

DEFAULT_ROWS_PER_PART = 10_000
DRAIN_S = 600  # how long a failed run waits for its running tasks to end before it deletes their parts


@contextmanager
def _opened(spec: Mapping[str, Any]) -> Iterator[tuple[LoadedModel, ModelSource, ImageSource]]:
    """The spec's model (closed on exit: a TorchScript model's process stops) and its image source."""
    trust = Trust(**spec["trust"])
    source = model_source(spec["model"], trust=trust)
    model = load_model(source.path, arch=source.arch, num_classes=source.num_classes,
                       max_bytes=spec["max_file_bytes"], trust=source.load_trust(trust))
    try:
        yield model, source, ImageSource(spec["images"])
    finally:
        if hasattr(model.net, "close"):
            model.net.close()


def _batches(model: LoadedModel, source: ModelSource, images: ImageSource, lo: int, hi: int,
             batch_size: int) -> Iterator[torch.Tensor]:
    """The model's input batches of rows ``lo:hi``, decoded one batch at a time."""
    size = source.input_size or model.input_size
    for start in range(lo, hi, batch_size):
        yield model_batch(images.batch(slice(start, min(start + batch_size, hi)), size), model, source)


def _rows(images: ImageSource) -> tuple[np.ndarray, dict[str, Any] | None, np.ndarray | None, str]:
    """The set's labels, image source and ids (as the single-process path stores them) and their fingerprint."""
    labels = images.images.labels.numpy().astype(np.int64)
    refs = images.images.refs
    refs = None if refs is None else refs.compact()
    digest = hashlib.sha256(labels.tobytes())
    if refs is not None:
        digest.update(json.dumps(refs.source, sort_keys=True).encode())
        digest.update(refs.ids.tobytes())
    return labels, None if refs is None else refs.source, None if refs is None else refs.ids, digest.hexdigest()


def _checked_rows(spec: Mapping[str, Any], images: ImageSource) -> tuple[np.ndarray, dict[str, Any] | None,
                                                                         np.ndarray | None]:
    labels, image_source, ids, fingerprint = _rows(images)
    if fingerprint != spec["fingerprint"]:
        raise ValueError(f"the images of {spec['images']!r} changed since the job was queued ({len(labels)} images, "
                         f"{spec['count']} then); queue the extraction again")
    return labels, image_source, ids


def _view_key(spec: Mapping[str, Any], view: str) -> str:
    return f"{spec['key']}-{view}"


def _prepared(db: Engine, *, model_version_id: int, model: Mapping[str, Any] | ModelSource, images: str, split: str,
              rows_per_part: int, batch_size: int, max_file_bytes: int, trust: Trust) -> dict[str, Any]:
    """The run's spec (model, images, store, key, fingerprint), every input checked: one-line ``ValueError``."""
    require_choice("split", split, SPLITS)
    batch_size = check_batch_size(batch_size)
    if isinstance(rows_per_part, bool) or not isinstance(rows_per_part, int) or rows_per_part < 1:
        raise ValueError(f"rows_per_part must be a positive integer, got {rows_per_part!r}")
    source = model if isinstance(model, ModelSource) else model_source(model, trust=trust)
    with session_scope(db) as s:
        if get_model_version(s, model_version_id) is None:
            raise ValueError(f"no model version {model_version_id} in the database")
        uri = featurestore.store_uri(s)
    if uri is None:
        raise ValueError(f"a fanned-out extraction writes to a feature store every worker reaches; set "
                         f"${featurestore.STORE_ENV} (a shared folder or an s3:// URL)")
    spec = {"model_version_id": model_version_id, "model": source.to_dict(), "images": images, "split": split,
            "batch_size": batch_size, "max_file_bytes": max_file_bytes, "trust": asdict(trust), "store_uri": uri,
            "key": f"mv{model_version_id}/{split}/{uuid.uuid4().hex}"}
    with _opened(spec) as (loaded, src, image_source):
        _, _, _, spec["fingerprint"] = _rows(image_source)
        count = spec["count"] = len(image_source.images)
        if count == 0:
            raise ValueError(f"{images!r} holds no images")
        size = src.input_size or loaded.input_size
        check_batch_bytes(batch_size, [size])
        probe(loaded, src, next(_batches(loaded, src, image_source, 0, 1, 1)))
        _check_part_bytes(loaded, src, image_source, rows_per_part)
    return spec


def _check_part_bytes(model: LoadedModel, source: ModelSource, images: ImageSource, rows_per_part: int) -> None:
    """A task's part of the widest view must fit one store shard (``featurestore.SHARD_BYTES``)."""
    with torch.inference_mode():
        out = model.net.eval()(next(_batches(model, source, images, 0, 1, 1)))
    width = max(int(out.features.shape[1]), int(out.logits.shape[1]))
    if rows_per_part * width * 4 > featurestore.SHARD_BYTES:
        limit = featurestore.SHARD_BYTES // (width * 4)
        raise ValueError(f"rows_per_part={rows_per_part} makes {rows_per_part * width * 4 / 2**20:.0f} MiB parts of "
                         f"the {width}-d outputs, over the store's {featurestore.SHARD_BYTES // 2**20} MiB shards; "
                         f"use rows_per_part <= {limit}")


def extract_part(url: str, spec: Mapping[str, Any], lo: int, hi: int) -> dict[str, Any]:
    """Embed rows ``lo:hi`` and write each raw view's part; return ``{"parts": {view: entry}, "weights_sha256",
    "unit": {view: bool}}`` (the hash of the weights this worker read and whether its rows are unit vectors: the sets'
    fingerprints); memory: those rows' outputs plus one input batch."""
    with _opened(spec) as (model, source, images):
        _checked_rows(spec, images)
        probe(model, source, next(_batches(model, source, images, lo, lo + 1, 1)))
        raw = extract(model, _batches(model, source, images, lo, hi, spec["batch_size"]), pick_device("auto"))
    views = [view for view in RAW_VIEWS if raw[view].shape[1]]  # a logits-only model has no encoder view
    with session_scope(get_engine(url)) as s:
        parts = {view: featurestore.write_part(s, spec["store_uri"], _view_key(spec, view), f"part-{lo:012d}", raw[view])
                 for view in views}
    return {"parts": parts, "weights_sha256": model.sha256,
            "unit": {view: normalisation_of(raw[view]) == "unit" for view in views}}


def _fingerprints(s: Session, spec: Mapping[str, Any], results: list[dict[str, Any]],
                  widths: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Each view's fingerprint from the parts' results (one weights hash; unit when every part's rows are); one line
    when the workers read different weights (the checkpoint changed while they ran)."""
    hashes = {r.get("weights_sha256") for r in results}
    if len(hashes) > 1:
        raise ValueError(f"the checkpoint {spec['model'].get('path', '')!r} changed while the extraction ran "
                         f"({len(hashes)} different weights); run the extraction again")
    sha = hashes.pop() or None
    mv = get_model_version(s, spec["model_version_id"])
    name = fingerprint_name(mv.name, mv.architecture, mv.method, mv.experiment_id, mv.step)
    return {view: Fingerprint(width, sha256=sha, name=name,
                              normalisation="unit" if all(r["unit"].get(view) for r in results) else "raw").to_json()
            for view, width in widths.items()}


def _commit(db: Engine, spec: Mapping[str, Any], results: list[dict[str, Any]]) -> list[str]:
    """The feature sets of every view from the parts' results (:func:`extract_part`, in row order), with their
    fingerprints, in one transaction; return the views."""
    labels, image_source, ids = _checked_rows(spec, ImageSource(spec["images"]))
    parts = [r["parts"] for r in results]
    views = [v for v in RAW_VIEWS if v in parts[0]]
    with session_scope(db) as s:
        for view in views:
            pointer = featurestore.commit_parts(s, spec["store_uri"], _view_key(spec, view), [p[view] for p in parts],
                                                labels, ids)
            fingerprint = _fingerprints(s, spec, results, {view: int(pointer.layout["shape"][1])})[view]
            save_stored_feature_set(s, spec["model_version_id"], spec["split"], view, pointer, image_source,
                                    fingerprint)
            kept = {shard["file"] for shard in pointer.layout["shards"]} | {pointer.layout["rows_file"]}
            featurestore.sweep_parts(s, spec["store_uri"], _view_key(spec, view), kept)  # other attempts' parts
    return views


def _executing(dask_worker: Any) -> list[str]:
    """The keys of the tasks a Dask worker is running now (``Client.run``)."""
    return [str(ts.key) for ts in dask_worker.state.executing]


def _drain(client: Any, keys: set[str]) -> None:
    """Wait (at most :data:`DRAIN_S`) until no worker runs one of ``keys``: a cancelled task already running finishes
    its write, which must land before the run's folders are deleted."""
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline:
        try:
            running = {key for keys_of in client.run(_executing).values() for key in keys_of}
        except (OSError, TimeoutError):  # the cluster went away: its workers write no more
            return
        if not running & keys:
            return
        time.sleep(0.2)


def _discard(db: Engine, spec: Mapping[str, Any]) -> None:
    """Delete every part the run wrote (its folders under the store)."""
    with session_scope(db) as s:
        for view in RAW_VIEWS:
            featurestore.sweep_parts(s, spec["store_uri"], _view_key(spec, view))


def extract_on_dask(db: Engine, client: Any, *, model_version_id: int, model: Mapping[str, Any] | ModelSource,
                    images: str, split: str, rows_per_part: int = DEFAULT_ROWS_PER_PART, batch_size: int = 64,
                    max_file_bytes: int = DEFAULT_MAX_BYTES, trust: Trust = LOCAL,
                    progress: Callable[[int, int], None] | None = None,
                    should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Embed ``images`` (``"NAME[:ROOT]"``, e.g. ``"imagefolder:/path"``) by ``model`` (a checkpoint as
    :func:`engine.checkpoints.request.model_source` takes it) as the raw-view feature sets of (``model_version_id``,
    ``split``): one :func:`extract_part` per ``rows_per_part`` images on the client's cluster (``client`` None: one
    after another in this process), then one commit. Return ``{"views", "count", "parts"}``.

    The model is loaded and run on one image, the images are listed and every number checked first: any refusal is a
    one-line ``ValueError`` before anything is written. ``progress(done, total)`` as parts finish; a cancelled job
    (``should_stop`` or its cancel event) raises :class:`~engine.core.signals.Cancelled`. A failed or cancelled run
    leaves no part file and no row (module docstring).
    """
    spec = _prepared(db, model_version_id=model_version_id, model=model, images=images, split=split,
                     rows_per_part=rows_per_part, batch_size=batch_size, max_file_bytes=max_file_bytes, trust=trust)
    count = spec["count"]
    ranges = [(lo, min(count, lo + rows_per_part)) for lo in range(0, count, rows_per_part)]
    url = db.url.render_as_string(hide_password=False)  # each task opens the database (for its store) itself
    futures: list[Any] = []
    try:
        if client is None:
            parts = []
            for lo, hi in ranges:
                check_stop(should_stop, f"cancelled during the extraction ({len(parts)} of {len(ranges)} parts done)")
                parts.append(extract_part(url, spec, lo, hi))
                if progress is not None:
                    progress(len(parts), len(ranges))
        else:
            futures = [client.submit(extract_part, url, spec, lo, hi, pure=False) for lo, hi in ranges]
            wait_for(futures, what="the extraction", progress=progress, should_stop=should_stop)
            parts = client.gather(futures)
        views = _commit(db, spec, parts)
    except BaseException:
        if futures:
            client.cancel(futures)
            _drain(client, {str(f.key) for f in futures})
        _discard(db, spec)
        raise
    return {"views": views, "count": count, "parts": len(ranges)}


__all__ = ["DEFAULT_ROWS_PER_PART", "extract_on_dask", "extract_part"]
