"""Running experiments: train (or resume) every step, extract features, evaluate, store.

Data flows one way: config -> data + scenario -> per step: train -> checkpoint -> raw outputs
(``encoder``, ``logits``, ``softmax``) -> storage; then compatibility matrices per view -> storage.

Class ids are remapped to their position in the scenario's class order, so the classes a model of
step k has learned are always ``0 .. C^k - 1``: the nesting PSP/LSP's "first C^k outputs" assume.
Each step is written in one transaction (model version + its feature sets), so a run killed at any
moment resumes from its last finished step, and a cancelled run leaves no partial rows.

In a study, methods whose training is identical (:meth:`engine.methods.base.Method.training_key`: ``psp``
and ``lsp`` at temperature 1 train exactly as ``independent``) are trained once per seed; the others copy
that experiment's checkpoints and raw outputs and are evaluated under their own views.
"""
from __future__ import annotations

import dataclasses
import functools
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sqlalchemy import Engine

from engine.core.config import RunConfig
from engine.run.data_setup import RunData, prepare_run_data
from engine.models.device import pick_device
from engine.core.cell import RAW_VIEWS, CellRecipe, apply_recipe, cell_recipe
from engine.core.contract import raw_view
from engine.models.extract import extract_outputs
from engine.core.fan_out import FanOut, check_fan_out_gallery
from engine.evaluate.matrix import CellSpec, matrix_on_dask
from engine.methods import build_method
from engine.methods.base import Method, StepContext, resolve_init_seed
from engine.metrics import PairedOptions
from engine.metrics.compatibility import CellFeatures, compatibility_matrices, stored_summary
from engine.models import build_model, load_checkpoint, save_checkpoint
from engine.models.net import Net
from engine.results.record import (
    Resumed,
    NewVersion,
    discard,
    experiment_cancelled,
    fail,
    finish,
    open_study,
    record_matrices,
    record_version,
    resume_experiment,
    set_status,
)
from engine.models.arithmetic import arithmetic_record, pinned_arithmetic
from engine.run.ddp import train_step_parallel
from engine.core.signals import Cancelled
from engine.methods.training import Hooks, train_step
from storage import (
    LeaseLost,
    ModelVersion,
    feature_set_ref,
    get_experiment,
    init_db,
    list_model_versions,
    load_feature_set,
    session_scope,
)
from storage.checkpoint_folders import experiment_checkpoints, stored_checkpoint

Progress = Callable[[float, str], None]


@dataclass
class RunContext:
    """Where a run reports to and how it learns that it should stop."""

    db: Engine
    checkpoint_dir: Path | None = None  # None: the database's own folder (storage.checkpoint_folders)
    progress: Progress | None = None
    should_stop: Callable[[], bool] | None = None
    study_id: int | None = None
    on_study: Callable[[int], None] | None = None  # told the study's id once it exists (the worker links its job)
    nproc: int = 1  # processes that train each step data-parallel (engine.run.ddp); this one alone writes
    client: Any = None  # a distributed.Client: evaluate each matrix on its Dask cluster (engine.evaluate.matrix)
    fan_out: FanOut = FanOut()  # with ``client``: query rows per block, gallery rows per partition


def views_for(method: Method, cfg: RunConfig) -> tuple[str, ...]:
    """Views evaluated for a method: the encoder baseline plus the method's own views, or the config's list."""
    if cfg.eval.views != ("auto",):
        return cfg.eval.views
    return tuple(dict.fromkeys(("encoder",) + tuple(method.default_views)))


def init_seed_for_step(method: Method, cfg: RunConfig, step: int) -> int:
    """The seed of a from-scratch model's initial weights at ``step``."""
    return cfg.seed if resolve_init_seed(method, cfg.model.init_seed) == "same" else cfg.seed + 1000 * step


def _new_model(method: Method, cfg: RunConfig, data: RunData, num_seen: int, step: int) -> Net:
    fixed = method.head != "linear"
    k_total = cfg.model.dsimplex_classes or data.total_classes
    if fixed and k_total < data.total_classes:
        raise ValueError(f"model.dsimplex_classes = {k_total} is smaller than the {data.total_classes} classes of the scenario")
    feature_dim = cfg.model.feature_dim
    if method.head == "dsimplex":
        feature_dim = None  # always K - 1
    elif method.head == "etf" and feature_dim is None:
        feature_dim = k_total - 1  # the smallest space a K-class simplex ETF fits in
    normalization = cfg.model.dsimplex_normalization if method.head == "dsimplex" else "row"
    return build_model(backbone=cfg.model.backbone, head=method.head, num_classes=k_total if fixed else num_seen,
                       feature_dim=feature_dim,
                       in_channels=data.in_channels, width=cfg.model.width,
                       seed=init_seed_for_step(method, cfg, step), dsimplex_normalization=normalization,
                       frame_seed=cfg.seed if method.head == "etf" else None)  # one fixed frame per run


def _next_model(method: Method, cfg: RunConfig, data: RunData, previous: Net | None, num_seen: int, step: int,
                replaced: bool) -> Net:
    """A fresh model, or the previous one grown to the classes seen so far (fine-tuning methods)."""
    if previous is None or method.init_from == "scratch" or replaced:
        return _new_model(method, cfg, data, num_seen, step)
    net = previous.frozen_copy()
    for p in net.parameters():
        p.requires_grad_(True)
    for name, buf in net.head.named_buffers():  # fixed prototypes stay fixed
        buf.requires_grad_(False)
    if method.head == "linear" and net.head.num_outputs < num_seen:
        net.head.expand(num_seen - net.head.num_outputs, seed=cfg.seed + 1000 * step + 1)
    return net


def _store_step(db: Engine, exp_id: int, step: int, net: Net, method: Method, cfg: RunConfig, data: RunData,
                seen: int, ckpt: Path, replaced: bool, device: torch.device) -> None:
    sets = {"query": data.query, "gallery": data.gallery}
    if len(data.adapter_train):
        sets["train"] = data.adapter_train
    by_object: dict[int, dict] = {}  # closed-set: query and gallery are the same images, embed them once
    for images in sets.values():
        if id(images) not in by_object:
            by_object[id(images)] = extract_outputs(net, images.images, batch_size=256, device=device,
                                                    softmax_temperature=method.softmax_temperature())
    outputs = {split: by_object[id(images)] for split, images in sets.items()}
    labels = {split: images.labels.numpy() for split, images in sets.items()}
    version = NewVersion(architecture=cfg.model.backbone, method=method.name, classes=range(seen),
                      num_outputs=net.head.num_outputs, feature_dim=net.feature_dim,
                      outputs={split: {v: out[v] for v in RAW_VIEWS} for split, out in outputs.items()}, labels=labels,
                      class_names=data.class_names[:seen], checkpoint_path=str(ckpt), replaced=replaced,
                      refs={split: images.refs for split, images in sets.items()})
    with session_scope(db) as s:  # the step's model version and its feature sets: one transaction
        record_version(s, exp_id, step, version)


def _view_recipes(versions: list[ModelVersion], view: str, cfg: RunConfig, same_set: bool,
                  eval_classes: str | None = None) -> Callable[[int, int], CellRecipe]:
    """Each cell's recipe (:func:`engine.core.cell.cell_recipe`): PSP/LSP keep gallery model k's first C^k outputs;
    the rows of ``eval_classes`` (None: ``cfg.eval.eval_classes``)."""
    classes = eval_classes or cfg.eval.eval_classes
    return lambda t, k: cell_recipe(view, len(versions[t].classes), len(versions[k].classes),
                                    eval_classes=classes, topk=cfg.eval.topk, same_set=same_set)


def _view_cells(db: Engine, versions: list[ModelVersion], recipes: Callable[[int, int], CellRecipe], view: str
                ) -> Callable[[int, int], CellFeatures]:
    """Cells of one view: each cell's recipe applied to the stored raw outputs (:func:`engine.core.cell.apply_recipe`)."""
    raw = raw_view(view)
    cache: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}

    def load(i: int, split: str) -> tuple[np.ndarray, np.ndarray]:
        if (i, split) not in cache:
            with session_scope(db) as s:
                feats, labels, _ = load_feature_set(s, versions[i].id, split, raw)
            cache[(i, split)] = (feats, labels)
        return cache[(i, split)]

    def cell(t: int, k: int) -> CellFeatures:
        # every model embedded the same query split: a position is one image
        q, ql, ids, g, gl = apply_recipe(recipes(t, k), *load(t, "query"), *load(k, "gallery"))
        return CellFeatures(q, ql, g, gl, query_ids=ids)

    return cell


def _view_cell_specs(db: Engine, versions: list[ModelVersion], recipes: Callable[[int, int], CellRecipe], view: str
                     ) -> Callable[[int, int], CellSpec | None]:
    """The cells of :func:`_view_cells` as Dask cells (stored set ids; rows selected and views derived by the tasks)."""
    raw = raw_view(view)
    with session_scope(db) as s:
        refs = {(i, split): feature_set_ref(s, v.id, split, raw) for i, v in enumerate(versions) for split in ("query", "gallery")}

    def cell(t: int, k: int) -> CellSpec | None:
        (query, dq), (gallery, dg) = refs[(t, "query")], refs[(k, "gallery")]
        recipe = recipes(t, k)
        if not recipe.derived and dq != dg:
            return None  # not comparable
        return CellSpec(query, gallery, recipe)

    return cell


def evaluate_experiment(db: Engine, exp_id: int, cfg: RunConfig, method: Method, *, same_set: bool,
                        client: Any = None, fan_out: FanOut = FanOut(),
                        should_stop: Callable[[], bool] | None = None, nproc: int = 1,
                        progress: Progress | None = None) -> dict[str, dict]:
    """Compute and store every (metric, view) matrix; return {view: {metric: summary}} under ``eval.eval_classes``.

    The matrices under each of ``eval.also_eval_classes`` are computed and stored too (same views and metrics).
    ``client``: on its Dask cluster, cut as ``fan_out`` (:func:`engine.evaluate.matrix.matrix_on_dask`, the same
    matrices), reporting the tasks done of the matrix's and the Dask dashboard to ``progress``.
    Each summary records the arithmetic the features were made with (``arithmetic``, :mod:`engine.models.arithmetic`;
    ``nproc``: the data-parallel ranks that trained them).
    """
    with session_scope(db) as s:
        versions = list_model_versions(s, exp_id)
    out: dict[str, dict] = {}
    for view in views_for(method, cfg):
        for eval_classes in (cfg.eval.eval_classes, *cfg.eval.also_eval_classes):
            recipes = _view_recipes(versions, view, cfg, same_set, eval_classes)
            also = "" if eval_classes == cfg.eval.eval_classes else f", {eval_classes} classes"
            if client is not None:
                specs = _view_cell_specs(db, versions, recipes, view)
                features = _view_cells(db, versions, recipes, view)  # read for verification only
                say = _dask_progress(progress, f"evaluating {view}{also} on Dask")
                result = matrix_on_dask(db, client, specs, len(versions), metrics=cfg.eval.metrics,
                                        paired=PairedOptions(), fan_out=fan_out, features=features, same_set=same_set,
                                        should_stop=should_stop, progress=say)
            else:
                cells = _view_cells(db, versions, recipes, view)
                result = compatibility_matrices(cells, num_models=len(versions), metrics=cfg.eval.metrics,
                                                gallery_kind=cfg.eval.gallery, same_set=same_set, paired=PairedOptions())
            with session_scope(db) as s:
                record_matrices(s, exp_id, result, gallery_kind=cfg.eval.gallery, view=view, eval_classes=eval_classes,
                                arithmetic=arithmetic_record(cfg.compute_threads, nproc=nproc,
                                                             device=pick_device(cfg.device)))
            if eval_classes == cfg.eval.eval_classes:
                out[view] = {m: {"matrix": result.values[m], **stored_summary(result, m)} for m in result.values}
    return out


def _dask_progress(progress: Progress | None, what: str) -> Callable[[int, int, str | None], None] | None:
    """A :func:`matrix_on_dask` progress callback that reports ``what``, the tasks done and the Dask dashboard."""
    if progress is None:
        return None
    return lambda done, total, link: progress(0.99, f"{what}: {done} of {total} tasks done"
                                                    + (f" (Dask dashboard {link})" if link else ""))


def _open_experiment(ctx: RunContext, cfg: RunConfig, method: str) -> tuple[Resumed, Callable[[float, str], None]]:
    """The config's experiment (created, resumed or already finished: then said so) and the progress callback."""
    init_db(ctx.db)
    resumed = _resume(ctx.db, cfg, method, ctx.study_id)
    report = ctx.progress or (lambda f, m: None)
    if resumed.finished:
        report(1.0, f"{method}: reusing finished experiment {resumed.experiment_id}")
    return resumed, report


def _resume(db: Engine, cfg: RunConfig, method: str, study_id: int | None) -> Resumed:
    """The experiment to continue (or reuse when finished) for this config (:func:`engine.results.record.resume_experiment`)."""
    return resume_experiment(db, name=f"{cfg.name}/{method}/seed {cfg.seed}", method=method, config=cfg.to_dict(),
                             study_id=study_id)


def run_experiment(cfg: RunConfig, ctx: RunContext, *, data: RunData | None = None) -> int:
    """Run (or resume, or reuse) the single-method config ``cfg``; return the experiment id."""
    if len(cfg.methods) != 1:
        raise ValueError("run_experiment takes a single-method config; use run_study for several methods")
    method = build_method(cfg.methods[0], **cfg.method_params.get(cfg.methods[0], {}))
    device = pick_device(cfg.device)
    data = data or prepare_run_data(cfg)
    resumed, report = _open_experiment(ctx, cfg, method.name)
    exp_id, done = resumed.experiment_id, resumed.done_steps
    if resumed.finished:
        return exp_id
    job_stop = ctx.should_stop
    # the whole job, or this one experiment (cancelled on its own from the Overview page), stops at the next check
    ctx = dataclasses.replace(ctx, should_stop=lambda: bool(job_stop and job_stop()) or experiment_cancelled(ctx.db, exp_id))
    steps = data.scenario.steps
    ckpt_dir = experiment_checkpoints(ctx.db.url, exp_id, ctx.checkpoint_dir).absolute()  # stored absolute
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    stored = _stored_checkpoints(ctx.db, exp_id) if done else {}
    total_work = sum(len(s.train_classes) for s in steps) * cfg.training.epochs or 1
    work_done = 0.0
    started = time.perf_counter()
    previous: Net | None = None
    try:
        set_status(ctx.db, exp_id, "running")
        for step in steps:
            seen = len(step.seen_classes)
            ckpt = ckpt_dir / f"step_{step.index}.safetensors"
            step_work = len(step.train_classes) * cfg.training.epochs
            if step.index in done:  # from the path its version recorded (a run from before may have used another folder)
                previous = load_checkpoint(stored[step.index], device="cpu")
                work_done += step_work
                report(work_done / total_work, f"{method.name}: step {step.index} already done")
                continue
            net = _next_model(method, cfg, data, previous, seen, step.index, step.replaced)
            old = previous.frozen_copy() if (previous is not None and method.needs_old_model and not step.replaced) else None
            images, labels = data.train_images(step, method.uses_replay, seed=cfg.seed + step.index)
            sctx = StepContext(step=step.index, seen_classes=tuple(range(seen)),
                               new_classes=tuple(range(seen - len(step.new_classes), seen)), old_model=old,
                               fine_tunes=previous is not None and method.init_from == "previous" and not step.replaced,
                               replay_classes=step.replay_classes if method.uses_replay and data.replay_per_class else ())

            def on_epoch(epoch: int, epochs: int, parts: dict[str, float], _step=step, _w=work_done, _sw=step_work) -> None:
                frac = (_w + _sw * epoch / epochs) / total_work
                elapsed = time.perf_counter() - started
                eta = elapsed / max(frac, 1e-9) * (1 - frac)
                report(min(frac, 0.99), f"{method.name}: step {_step.index}/{len(steps)}, epoch {epoch}/{epochs}, "
                                        f"loss {parts.get('loss', float('nan')):.3f}, ETA {eta:.0f} s")

            train = train_step if ctx.nproc == 1 else functools.partial(train_step_parallel, nproc=ctx.nproc)
            with pinned_arithmetic(cfg.compute_threads):  # the same numbers with any thread setting (engine.models.arithmetic)
                train(net, method, images, labels, sctx, cfg.training, device=device, seed=cfg.seed + step.index,
                      augment_images=data.augment, hooks=Hooks(on_epoch=on_epoch, should_stop=ctx.should_stop))
                net = net.cpu()
                save_checkpoint(net, ckpt, extra={"experiment": exp_id, "step": step.index, "method": method.name,
                                                  "arithmetic": arithmetic_record(cfg.compute_threads, nproc=ctx.nproc,
                                                                                 device=device)})
                _store_step(ctx.db, exp_id, step.index, net, method, cfg, data, seen, ckpt, step.replaced, device)
            previous = net
            work_done += step_work
        report(0.99, f"{method.name}: evaluating")
        return _finish(ctx, exp_id, cfg, method, data)
    except LeaseLost:
        raise  # the job was taken over: the experiment is the new worker's now, leave it as it is
    except Cancelled:
        discard_experiment(ctx.db, exp_id, ckpt_dir)
        raise
    except BaseException as exc:
        fail(ctx.db, exp_id, exc)
        raise


def _finish(ctx: RunContext, exp_id: int, cfg: RunConfig, method: Method, data: RunData) -> int:
    """Evaluate every view of a trained (or copied) experiment and mark it done."""
    evaluate_experiment(ctx.db, exp_id, cfg, method, same_set=data.same_set, client=ctx.client, fan_out=ctx.fan_out,
                        should_stop=ctx.should_stop, nproc=ctx.nproc, progress=ctx.progress)
    with session_scope(ctx.db) as s:
        finish(s, exp_id)
    (ctx.progress or (lambda f, m: None))(1.0, f"{method.name}: done")
    return exp_id


def reuse_experiment(cfg: RunConfig, ctx: RunContext, source_id: int, *, data: RunData) -> int:
    """Run the single-method config ``cfg`` on the models another experiment trained; return the experiment id.

    For methods whose training is identical (equal :meth:`Method.training_key`, e.g. ``psp``/``lsp`` and
    ``independent``): each finished step of experiment ``source_id`` is copied (checkpoint file and raw outputs)
    into this experiment in one transaction, then this method's views are evaluated, so its pages work on
    their own. ``source_id`` must be finished.
    """
    method = build_method(cfg.methods[0], **cfg.method_params.get(cfg.methods[0], {}))
    resumed, report = _open_experiment(ctx, cfg, method.name)
    exp_id, done = resumed.experiment_id, resumed.done_steps
    if resumed.finished:
        return exp_id
    ckpt_dir = experiment_checkpoints(ctx.db.url, exp_id, ctx.checkpoint_dir).absolute()
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    try:
        with session_scope(ctx.db) as s:
            source = get_experiment(s, source_id)
            if source is None or source.status != "done":
                raise ValueError(f"experiment {source_id} is not finished; its models cannot be reused")
            trainer = source.method
            for v in list_model_versions(s, source_id):
                if v.step in done:
                    continue
                ckpt: Path | None = ckpt_dir / f"step_{v.step}.safetensors"
                if (source_file := stored_checkpoint(v.checkpoint_path)) is not None:
                    shutil.copyfile(source_file, ckpt)
                else:
                    ckpt = None  # the source lost its file too; the outputs below are all evaluation needs
                record_version(s, exp_id, v.step, NewVersion(
                    architecture=v.architecture, method=method.name, classes=v.classes, num_outputs=v.num_outputs,
                    feature_dim=v.feature_dim, outputs={}, labels={}, class_names=v.class_names,
                    checkpoint_path=ckpt and str(ckpt), replaced=v.replaced, copied_from=v.id))
        report(0.5, f"{method.name}: models of experiment {source_id} ({trainer}, same training); evaluating")
        return _finish(ctx, exp_id, cfg, method, data)
    except LeaseLost:
        raise
    except Cancelled:
        discard_experiment(ctx.db, exp_id, ckpt_dir)
        raise
    except BaseException as exc:
        fail(ctx.db, exp_id, exc)
        raise


def _stored_checkpoints(db: Engine, exp_id: int) -> dict[int, Path]:
    """Step -> the existing checkpoint file each stored model version of the experiment recorded."""
    with session_scope(db) as s:
        files = {v.step: stored_checkpoint(v.checkpoint_path) for v in list_model_versions(s, exp_id)}
    return {step: f for step, f in files.items() if f is not None}


def discard_experiment(db: Engine, exp_id: int, ckpt_dir: Path) -> None:
    """After a cancel: remove everything the run wrote and mark the experiment cancelled."""
    discard(db, exp_id)
    for f in ckpt_dir.glob("*.safetensors"):
        f.unlink()


def study_seeds(cfg: RunConfig) -> tuple[int, ...]:
    """The seeds a study runs every method with: ``seeds``, or just ``seed``."""
    return cfg.seeds or (cfg.seed,)


def check_study(cfg: RunConfig) -> RunData:
    """Refuse, before any row is written, what would fail later: each method's hyper-parameters, the device,
    the data (dataset present, classes divide, open-set classes available) and each method's first model."""
    methods = [build_method(m, **cfg.method_params.get(m, {})) for m in cfg.methods]
    pick_device(cfg.device)
    data = prepare_run_data(cfg)
    for method in methods:
        _new_model(method, cfg, data, len(data.scenario.steps[0].seen_classes), 1)
    return data


def run_study(cfg: RunConfig, ctx: RunContext, *, data: RunData | None = None) -> tuple[int, list[int]]:
    """Run every method of ``cfg`` for every seed on the same scenario as one study; return (study id, experiment ids).

    Each seed draws its own data (per-class samples, batch order) and initialisation; the class order
    is ``scenario.class_order_seed``'s for every seed. Experiment ids are ordered seed by seed.
    ``data``: what :func:`check_study` returned for ``cfg`` (checked here when not given). An experiment cancelled
    on its own (its status set to cancelled while it runs) is discarded and left out of the ids; the others run.
    """
    if ctx.client is not None:
        check_fan_out_gallery(cfg.eval.gallery)
    checked = data or check_study(cfg)
    init_db(ctx.db)
    study_id = open_study(ctx.db, name=cfg.name, kind="compare", config=cfg.to_dict())
    if ctx.on_study is not None:
        ctx.on_study(study_id)
    ids = []
    outer = ctx.progress or (lambda f, m: None)
    runs = [(seed, method) for seed in study_seeds(cfg) for method in cfg.methods]
    keys = {m: build_method(m, **cfg.method_params.get(m, {})).training_key(cfg.model.init_seed) for m in cfg.methods}
    trained: dict[tuple, int] = {}  # training key -> experiment that trained it, for the current seed
    for i, (seed, method) in enumerate(runs):
        one = dataclasses.replace(cfg, seed=seed, seeds=())
        if i % len(cfg.methods) == 0:
            data = checked if seed == cfg.seed else prepare_run_data(one)
            trained = {}
        sub = dataclasses.replace(ctx, progress=lambda f, m, i=i: outer((i + f) / len(runs), m), study_id=study_id, on_study=None)
        if keys[method] in trained:
            ids.append(reuse_experiment(one.for_method(method), sub, trained[keys[method]], data=data))
            continue
        try:
            ids.append(run_experiment(one.for_method(method), sub, data=data))
        except Cancelled:
            if ctx.should_stop is not None and ctx.should_stop():
                raise  # the whole study was cancelled
            outer((i + 1) / len(runs), f"{method}: cancelled on its own (seed {seed}); the study goes on")
            continue  # only this experiment was: the next method or seed runs
        trained[keys[method]] = ids[-1]
    return study_id, ids
