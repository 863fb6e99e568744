"""One image set embedded by one checkpoint, fanned out over many workers: :func:`fan_out_extract`.

The job's tasks:

1. ``extract`` per row range ``(lo, hi)``: load the model (on the worker's GPU when it has one), decode only those
   images a batch at a time, embed them (the raw views ``encoder``, ``logits``, ``softmax``, as
   :func:`engine.checkpoints.embedding.extract` gives them) and write each view's part to the feature store under the
   job's key for that view (``featurestore.write_part``: a fresh file name per attempt). The task's result is only the
   parts' shard entries.
2. ``commit`` (waits for every extract task): in the transaction in which the task loop marks it done under its lease
   (the handler returns these writes, :class:`engine.tasks.loop.Done`), one ``FeatureSet`` per view whose pointer
   lists the parts in row order, with the rows Parquet (labels and image ids of the whole set). Until then no row points at any part, so a killed or retried attempt's file is never read;
   the commit sweeps the parts it did not take, and a job that fails or is cancelled loses all of them
   (``part_folders`` in its payload, :func:`storage.featurestore.sweep_parts`).

The stored sets are what the single-process path (``record_experiment`` after ``extract``) stores for the same
images and model, up to float tolerance (batches are cut at other rows). Workers run these tasks with
``python -m engine worker --tasks``; the store must be one every worker reaches (``$COMPATLAB_FEATURE_STORE``).
"""
from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator, Mapping
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
from engine.models.device import pick_device
from engine.results.record import fingerprint_name
from engine.tasks.loop import Done
from storage import SPLITS, Task, featurestore, get_model_version, save_stored_feature_set, session_scope
from storage.rows import require_choice
from storage.tasks import DEFAULT_MAX_ATTEMPTS, NewTask, create_task_job, job_payload, task_results

DEFAULT_ROWS_PER_TASK = 10_000


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


def fan_out_extract(db: Engine, *, model_version_id: int, model: Mapping[str, Any] | ModelSource, images: str,
                    split: str, rows_per_task: int = DEFAULT_ROWS_PER_TASK, batch_size: int = 64,
                    needs_gpu: bool = False, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                    max_file_bytes: int = DEFAULT_MAX_BYTES, trust: Trust = LOCAL) -> int:
    """Queue the embedding of ``images`` (``"NAME[:ROOT]"``, e.g. ``"fashion:/data"`` or ``"imagefolder:/path"``) by
    ``model`` (a checkpoint as :func:`engine.checkpoints.request.model_source` takes it) as the raw-view feature
    sets of (``model_version_id``, ``split``); one extract task per ``rows_per_task`` images, then a commit task.
    Return the job id.

    The model is loaded and run on one image, the images are listed and every number checked first: any refusal is
    a one-line ``ValueError`` before anything is written. The tasks run with ``trust`` (recorded in the job).
    """
    require_choice("split", split, SPLITS)
    batch_size = check_batch_size(batch_size)
    if isinstance(rows_per_task, bool) or not isinstance(rows_per_task, int) or rows_per_task < 1:
        raise ValueError(f"rows_per_task must be a positive integer, got {rows_per_task!r}")
    source = model if isinstance(model, ModelSource) else model_source(model, trust=trust)
    with session_scope(db) as s:
        if get_model_version(s, model_version_id) is None:
            raise ValueError(f"no model version {model_version_id} in the database")
        uri = featurestore.store_uri(s)
    if uri is None:
        raise ValueError(f"extract tasks write to a feature store every worker reaches; set ${featurestore.STORE_ENV} "
                         "(a shared folder or an s3:// URL)")
    spec = {"kind": "extract", "model_version_id": model_version_id, "model": source.to_dict(), "images": images,
            "split": split, "batch_size": batch_size, "max_file_bytes": max_file_bytes, "trust": asdict(trust),
            "store_uri": uri, "key": f"mv{model_version_id}/{split}/{uuid.uuid4().hex}"}
    spec["part_folders"] = [_view_key(spec, view) for view in RAW_VIEWS]  # swept if the job fails or is cancelled
    with _opened(spec) as (loaded, src, image_source):
        _, _, _, spec["fingerprint"] = _rows(image_source)
        count = spec["count"] = len(image_source.images)
        if count == 0:
            raise ValueError(f"{images!r} holds no images")
        size = src.input_size or loaded.input_size
        check_batch_bytes(batch_size, [size])
        probe(loaded, src, next(_batches(loaded, src, image_source, 0, 1, 1)))
        _check_part_bytes(loaded, src, image_source, rows_per_task)
    ranges = [(lo, min(count, lo + rows_per_task)) for lo in range(0, count, rows_per_task)]
    tasks = [NewTask("extract", {"rows": [lo, hi]}, needs_gpu=needs_gpu) for lo, hi in ranges]
    tasks.append(NewTask("commit", {}, after=tuple(range(len(ranges)))))
    with session_scope(db) as s:
        return create_task_job(s, spec, tasks, max_attempts=max_attempts,
                               message=f"{count} images in {len(ranges)} extract tasks queued")


def _check_part_bytes(model: LoadedModel, source: ModelSource, images: ImageSource, rows_per_task: int) -> None:
    """A task's part of the widest view must fit one store shard (``featurestore.SHARD_BYTES``)."""
    with torch.inference_mode():
        out = model.net.eval()(next(_batches(model, source, images, 0, 1, 1)))
    width = max(int(out.features.shape[1]), int(out.logits.shape[1]))
    if rows_per_task * width * 4 > featurestore.SHARD_BYTES:
        limit = featurestore.SHARD_BYTES // (width * 4)
        raise ValueError(f"rows_per_task={rows_per_task} makes {rows_per_task * width * 4 / 2**20:.0f} MiB parts of "
                         f"the {width}-d outputs, over the store's {featurestore.SHARD_BYTES // 2**20} MiB shards; "
                         f"use rows_per_task <= {limit}")


def _spec(db: Engine, task: Task) -> dict[str, Any]:
    with session_scope(db) as s:
        return job_payload(s, task.job_id)


def extract_task(db: Engine, task: Task) -> tuple[dict[str, Any], None]:
    """Embed rows ``lo:hi`` and write each raw view's part; the result lists the parts (memory: those rows' outputs
    plus one input batch)."""
    spec = _spec(db, task)
    lo, hi = task.payload["rows"]
    with _opened(spec) as (model, source, images):
        _checked_rows(spec, images)
        probe(model, source, next(_batches(model, source, images, lo, lo + 1, 1)))
        raw = extract(model, _batches(model, source, images, lo, hi, spec["batch_size"]), pick_device("auto"))
    with session_scope(db) as s:
        parts = {view: featurestore.write_part(s, spec["store_uri"], _view_key(spec, view), f"part-{lo:012d}",
                                               raw[view])
                 for view in RAW_VIEWS if raw[view].shape[1]}  # a logits-only model has no encoder view
    unit = {view: normalisation_of(raw[view]) == "unit" for view in parts}  # for the sets' fingerprints
    return {"parts": parts, "weights_sha256": model.sha256, "unit": unit,
            "message": f"rows {lo}:{hi} embedded"}, None


def _fingerprints(s: Session, spec: Mapping[str, Any], results: list[dict[str, Any]],
                  widths: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Each view's fingerprint from the extract tasks' results (one weights hash, all parts of unit rows or not);
    one line when the tasks read different weights (the checkpoint changed while they ran)."""
    hashes = {r.get("weights_sha256") for r in results}
    if len(hashes) > 1:
        raise ValueError(f"the checkpoint {spec['model'].get('path', '')!r} changed while its extract tasks ran "
                         f"({len(hashes)} different weights); queue the extraction again")
    sha = hashes.pop() or None
    mv = get_model_version(s, spec["model_version_id"])
    name = fingerprint_name(mv.name, mv.architecture, mv.method, mv.experiment_id, mv.step)
    return {view: Fingerprint(width, sha256=sha, name=name,
                              normalisation="unit" if all(r.get("unit", {}).get(view) for r in results) else "raw"
                              ).to_json() for view, width in widths.items()}


def commit_task(db: Engine, task: Task) -> Done:
    """The feature sets of every view from the parts, written by the task loop in the transaction that marks this task
    done (nothing when the lease was lost or the job cancelled: another attempt commits, or none)."""
    spec = _spec(db, task)
    labels, image_source, ids = _checked_rows(spec, ImageSource(spec["images"]))
    with session_scope(db) as s:
        results = task_results(s, task.upstream)  # upstream: the extract tasks in row order
    parts = [r["parts"] for r in results]
    views = [v for v in RAW_VIEWS if v in parts[0]]
    message = f"{len(labels)} images embedded: {', '.join(views)} of model version {spec['model_version_id']}"

    def write(s: Session) -> None:
        for view in views:
            pointer = featurestore.commit_parts(s, spec["store_uri"], _view_key(spec, view), [p[view] for p in parts],
                                                labels, ids)
            fingerprint = _fingerprints(s, spec, results, {view: int(pointer.layout["shape"][1])})[view]
            save_stored_feature_set(s, spec["model_version_id"], spec["split"], view, pointer, image_source,
                                    fingerprint)
            kept = {shard["file"] for shard in pointer.layout["shards"]} | {pointer.layout["rows_file"]}
            featurestore.sweep_parts(s, spec["store_uri"], _view_key(spec, view), kept)  # other attempts' parts

    return Done({"views": views, "count": len(labels), "message": message}, None, write)


__all__ = ["DEFAULT_ROWS_PER_TASK", "commit_task", "extract_task", "fan_out_extract"]
