"""The job handlers: one per job kind of ``engine.core.contract.JOB_KINDS``, in :data:`JOB_HANDLERS`, which the worker
(:mod:`engine.jobs.worker`) dispatches through.

Every handler is ``handler(db, payload, job) -> message``: the payload as the dashboard queued it (built by
``engine.core.contract``'s ``*_payload`` functions), the :class:`JobContext` the worker gives it, and the one-line
message the finished job shows. A handler reads its payload and calls a stage's plain function; the stages
(``engine.run``, ``engine.checkpoints``, ``engine.analysis``, ``engine.upgrade``) know nothing about jobs. The worker,
not the handler, marks the job done, failed or cancelled.

Payloads, by kind:

* ``run``: ``{"config": RunConfig dict}`` or ``{"preset": NAME}``, optionally ``"tasks": {"block_rows": N,
  "shard_rows": N}`` (evaluate through tasks, ``engine.evaluate.matrix``): train/evaluate a study.
* ``analysis``: ``{"experiment_id": id, "kind": ..., "params": {...}}``: see :mod:`engine.jobs.analysis`.
* ``adapters``: the fields of :class:`engine.analysis.adapted.AdapterJob` (old/new model version ids, kind, view, ...).
* ``sources_check``: ``engine.core.contract.sources_check_payload``: the upgrade check on embeddings read from sources
  (``engine.upgrade.from_sources``); the source texts are read as the worker's data roots allow.
* ``checkpoints``: ``{"spec": {...}}``: a comparison spec (``engine.checkpoints.request.comparison_spec``) of
  bring-your-own models, compared with ``server_trust()``: paths confined to the data roots, TorchScript refused
  unless the worker was started with ``--allow-torchscript``.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from engine.checkpoints.files import server_trust  # torch-free
from engine.core.signals import Progress


@dataclass(frozen=True)
class JobContext:
    """What the worker gives every handler: progress and cancel checks under its claim, the checkpoint folder, and
    ``on_study`` (told a run's study id once it exists, so the job links to it)."""

    progress: Progress
    should_stop: Callable[[], bool]
    checkpoint_dir: Path | None  # None: the database's own folder (storage.checkpoint_folders)
    on_study: Callable[[int], None] | None = None


JobHandler = Callable[[Engine, Mapping[str, Any], JobContext], str]


def run_job(db: Engine, payload: Mapping[str, Any], job: JobContext) -> str:
    """A ``run`` job: train and evaluate the study of a config or a preset."""
    from engine.core.config import config_from_dict
    from engine.core.cluster import requested_cluster
    from engine.core.fan_out import FanOut
    from engine.evaluate.dask_search import dask_client
    from engine.run.pipeline import RunContext, run_study
    from engine.core.presets import preset_config
    from engine.data.fashion_files import fashion_available

    cfg = preset_config(payload["preset"], fashion_present=fashion_available) if "preset" in payload else config_from_dict(payload["config"])
    fan_out = FanOut(**payload.get("fan_out") or payload.get("tasks") or {})  # "tasks": a job queued before Dask
    with dask_client(requested_cluster(None)) as client:  # the worker's $COMPATLAB_DASK_SCHEDULER: where, not what
        study_id, ids = run_study(cfg, RunContext(db, job.checkpoint_dir, job.progress, job.should_stop,
                                                  on_study=job.on_study, client=client, fan_out=fan_out))
    return f"study {study_id}: experiments {', '.join(map(str, ids))}"


def analysis_job(db: Engine, payload: Mapping[str, Any], job: JobContext) -> str:
    """An ``analysis`` job: compute one analysis of an experiment and store it."""
    from engine.jobs.analysis import run_analysis

    job.progress(0.1, f"computing {payload['kind']} for experiment {payload['experiment_id']}")
    run_analysis(db, int(payload["experiment_id"]), payload["kind"], payload.get("params", {}), progress=job.progress)
    return f"{payload['kind']} ready"


def adapters_job(db: Engine, payload: Mapping[str, Any], job: JobContext) -> str:
    """An ``adapters`` job: fit a pair of adapters between two stored model versions and store what they give."""
    from engine.analysis.adapted import AdapterJob, run_adapters

    adapters = AdapterJob(**{**payload, "orderings": tuple(payload.get("orderings", AdapterJob.orderings))})
    job.progress(0.1, f"fitting {adapters.kind} adapters {adapters.key}")
    result = run_adapters(db, adapters)
    best = next(r for r in result["table"] if r["row"] == "B(new)/F(old)" or r["row"] == "B(new)/old")
    return f"adapters {adapters.key} ready: {best['row']} Recall@1 {100 * best['recall@1']:.1f}%"


def checkpoints_job(db: Engine, payload: Mapping[str, Any], job: JobContext) -> str:
    """A ``checkpoints`` job: compare the spec's checkpoints as the dashboard may (``server_trust()``) and store. A
    text comparison then queues its ``text_upgrade`` summary (the contract's defaults), which the Checkpoints page
    shows, so the dashboard's text entry gives its verdicts without another click."""
    from engine.checkpoints.request import text_corpus
    from engine.checkpoints.store import run_checkpoint_comparison
    from engine.core.contract import analysis_payload
    from storage import enqueue_job, session_scope

    experiment_id = run_checkpoint_comparison(db, payload["spec"], progress=job.progress, should_stop=job.should_stop,
                                              trust=server_trust())
    if text_corpus(payload["spec"]) is not None:  # the spec passed the checks: a text corpus means text models
        with session_scope(db) as s:
            summary = enqueue_job(s, "analysis", analysis_payload(experiment_id, "text_upgrade", {}),
                                  experiment_id=experiment_id)
        return f"experiment {experiment_id}; its text-upgrade summary is job #{summary}"
    return f"experiment {experiment_id}"


def sources_check_job(db: Engine, payload: Mapping[str, Any], job: JobContext) -> str:
    """A ``sources_check`` job: the upgrade check on embeddings read from sources, its report stored under the job's
    payload hash (``storage.save_source_check``) with its migration plan, where the Upgrade check page reads it: with
    the new gallery the default adapters fitted on its pairs and the threshold (``engine.upgrade.source_remedies``, as
    ``check-upgrade --old-gallery ... --new-gallery ... --plan``), else from the verdicts alone. Beside the report, in
    the same transaction, the zip of the TREC files ``--export trec`` writes
    (``engine.upgrade.from_sources.trec_zip``)."""
    from engine.core.cluster import requested_cluster
    from engine.core.contract import sources_check_args
    from engine.upgrade.from_sources import SourceSpecs, check_sources, trec_zip
    from engine.upgrade.migration import or_verdicts, plan_from_verdicts
    from engine.upgrade.source_remedies import plan_from_sources
    from storage import payload_hash, save_source_check, session_scope

    args = sources_check_args(payload)  # read strictly: a stored payload is data, and the allow-list may change
    specs = SourceSpecs(**args.pop("sources"))
    check = check_sources(specs, **args, progress=lambda f, m: job.progress(0.8 * f, m),
                          cluster=requested_cluster(None))  # the worker's $COMPATLAB_DASK_SCHEDULER: where, not what
    if specs.new_gallery is None:
        plan = plan_from_verdicts(check.report)
    else:  # a gallery too small to fit an adapter on: the verdicts alone, saying why (as the in-memory plan)
        plan = or_verdicts(lambda: plan_from_sources(check, specs, progress=lambda f, m: job.progress(0.8 + 0.2 * f, m)),
                           check.report, asked=False)
    trec, files = trec_zip(check, plan.adapted_lists)
    with session_scope(db) as s:
        save_source_check(s, payload_hash("sources_check", dict(payload)),
                          {**check.to_json(), "plan": plan.to_json(), "trec": trec}, files)
    return check.report.sentence().split(":", 1)[0]  # "v2 is compatible with v1"


JOB_HANDLERS: dict[str, JobHandler] = {"run": run_job, "analysis": analysis_job, "adapters": adapters_job,
                                       "checkpoints": checkpoints_job, "sources_check": sources_check_job}
