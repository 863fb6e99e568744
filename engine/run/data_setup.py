"""Turning a RunConfig into the data of a run: training images, query/gallery split, scenario.

Protocols:
* ``closed-set``: the test split is both query and gallery; each query's own image is excluded
  from the gallery by index (``same_set``).
* ``open-set``: evaluation classes are disjoint from training classes. Built-in data: held-out
  classes (``shapes``: the next ``open_set_classes`` generator classes; query = their "train" draw,
  gallery = their "test" draw). Real data: ``open_set_dataset`` (e.g. CIFAR-100 -> CIFAR-10, with
  CIFAR-10 train as queries and test as gallery, as in the CL2R papers). Any dataset:
  ``scenario.held_out_classes = N`` holds out the last N classes of the class order (so the class-order seed
  names them): no step trains on them and they leave the training set, and their train/test images are the
  queries/gallery (``engine.data.protocols.held_out_split``). They keep their positions C - N .. C - 1, so their
  labels never coincide with a trained class's, and ``class_names`` lists only the trained classes.

Class ids of the training dataset are remapped to their position in the scenario's class order.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from engine.core.config import RunConfig
from engine.data.imageset import ImageSet
from engine.data.protocols import held_out_split, make_eval_split
from engine.data.registry import NORMALIZATION, load_dataset
from engine.data.scenario import Scenario, Step, build_scenario, select_replay


@dataclass(frozen=True)
class RunData:
    train: ImageSet  # labels = positions in the class order
    query: ImageSet
    gallery: ImageSet
    same_set: bool
    scenario: Scenario  # classes as positions: step t has learned 0 .. C^t - 1
    class_names: tuple[str, ...]  # in position order
    in_channels: int
    augment: bool
    replay_per_class: int
    adapter_train: ImageSet  # a fixed per-class subset of the training images that every model embeds

    @property
    def total_classes(self) -> int:
        return len(self.class_names)

    def train_images(self, step: Step, uses_replay: bool, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's training images: its train classes, plus replay memory of past classes if the method uses it."""
        labels = self.train.labels.numpy()
        idx = np.flatnonzero(np.isin(labels, step.train_classes))
        if uses_replay and step.replay_classes and self.replay_per_class:
            idx = np.concatenate([idx, select_replay(labels, step.replay_classes, self.replay_per_class, seed)])
        idx = np.sort(idx)
        return self.train.batch(idx), self.train.labels[idx]


def _remap(images: ImageSet, rank: np.ndarray, names: tuple[str, ...]) -> ImageSet:
    return ImageSet(images.images, torch.from_numpy(rank[images.labels.numpy()]), names, images.mean, images.std, images.refs)


def _options(cfg: RunConfig, split: str, per_class: int, **extra) -> dict:
    d = cfg.dataset
    return dict(root=d.root, split=split, seed=cfg.seed, per_class=per_class, download=d.download,
                image_size=d.image_size or 32, **extra)


def input_normalization(dataset: str) -> dict[str, tuple[float, ...]]:
    """``{"mean": ..., "std": ...}`` of the per-channel normalisation every image of a run on ``dataset`` gets, or ``{}``.

    CIFAR runs are normalised with their training set's statistics (papers 000-003 list "normalise" among their
    CIFAR transforms; the values are the IAM-CL2R code's), and so are their query and gallery images, the open-set
    CIFAR-10 ones included (the released code uses one transform). The built-in datasets and image folders stay in
    [0, 1], so their results are unchanged.
    """
    if dataset not in ("cifar10", "cifar100"):
        return {}
    mean, std = NORMALIZATION[dataset]
    return {"mean": mean, "std": std}


def scenario_classes(cfg: RunConfig) -> int | None:
    """Classes the scenario needs when the dataset's count is free (shapes): None when it cannot tell."""
    s = cfg.scenario
    return s.initial_classes + s.increment * (s.num_steps - 1) + s.held_out_classes if s.num_steps else None


def prepare_run_data(cfg: RunConfig) -> RunData:
    """Load (or generate) the data of ``cfg`` and build its scenario; errors are ValueErrors a person can act on."""
    d, e, s = cfg.dataset, cfg.eval, cfg.scenario
    extra = {}
    if d.name == "shapes":
        n = d.num_classes or scenario_classes(cfg)
        if n is None:
            raise ValueError("shapes needs dataset.num_classes or scenario.num_steps to know how many classes to generate")
        extra["num_classes"] = n
    norm = input_normalization(d.name)
    cap = {} if d.max_per_class is None else {"max_per_class": d.max_per_class}
    train = load_dataset(d.name, **_options(cfg, "train", d.train_per_class, **extra, **cap, **norm))
    split = make_eval_split("closed-set" if s.held_out_classes else e.protocol, dataset=d.name, root=d.root, seed=cfg.seed,
                            options={"download": d.download, "image_size": d.image_size or 32, **extra, **norm},
                            split_options={"train": {"per_class": d.train_per_class}, "test": {"per_class": d.test_per_class}},
                            open_set_dataset=e.open_set_dataset, open_set_classes=e.open_set_classes)
    num_classes = train.num_classes
    scenario = build_scenario(num_classes=num_classes, initial_classes=s.initial_classes, increment=s.increment,
                              num_steps=s.num_steps, class_order_seed=s.class_order_seed, training=s.training,
                              replay_per_class=s.replay_per_class, replacement_steps=s.replacement_steps,
                              held_out_classes=s.held_out_classes)
    if scenario.held_out_classes:  # open set on this dataset: before remapping, while the splits share class ids
        split = held_out_split(train, split.gallery, scenario.held_out_classes)
    trained = num_classes - len(scenario.held_out_classes)
    order = np.array(scenario.class_order)
    rank = np.empty(num_classes, np.int64)
    rank[order] = np.arange(num_classes)
    names = tuple(train.class_names[c] for c in order)
    positions = Scenario(tuple(range(num_classes)), tuple(
        Step(st.index, tuple(rank[list(st.new_classes)].tolist()), tuple(rank[list(st.seen_classes)].tolist()),
             tuple(rank[list(st.train_classes)].tolist()), tuple(rank[list(st.replay_classes)].tolist()), st.replaced)
        for st in scenario.steps), scenario.training, scenario.replay_per_class, tuple(range(trained, num_classes)))
    train = _remap(train, rank, names)
    if split.same_set:  # closed-set: the test images share the training classes, so they share the remapping
        query = gallery = _remap(split.gallery, rank, names)
    elif scenario.held_out_classes:  # positions trained .. C - 1; the training set keeps only the trained classes
        query, gallery = _remap(split.query, rank, names), _remap(split.gallery, rank, names)
        names = names[:trained]
        train = dataclasses.replace(train.select_classes(range(trained)), class_names=names)
    else:
        query, gallery = split.query, split.gallery
    same_set = split.same_set
    channels = train.images.shape[1]
    for side, images in (("query", query), ("gallery", gallery)):  # one model embeds them all: refused before training
        if images.images.shape[1] != channels:
            raise ValueError(f"the open-set {side} images have {images.images.shape[1]} channel(s) but the training images "
                             f"({d.name}) have {channels}; choose an open-set dataset with {channels}-channel images")
    per_class = e.train_features_per_class
    subset = select_replay(train.labels.numpy(), range(trained), per_class, cfg.seed) if per_class else np.zeros(0, np.int64)
    return RunData(train, query, gallery, same_set, positions, names, channels,
                   d.augment and channels == 3 and train.images.shape[-1] >= 32, s.replay_per_class, train.subset(subset))
