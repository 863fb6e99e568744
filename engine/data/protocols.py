"""Evaluation protocols: which images are the queries and which the gallery.

* ``"closed-set"``: the test split of the training dataset is both query and gallery
  (``same_set=True``); the caller excludes each query from the gallery by index.
* ``"open-set"``: classes disjoint from training, as in the CL2R papers (CIFAR-100 -> CIFAR-10):
  queries are the evaluation dataset's "train" split and the gallery its "test" split.
  ``shapes`` evaluates on held-out generator classes that come right after the trained ones
  (``first_class + num_classes`` onwards, ``open_set_classes`` of them); other datasets need an
  ``open_set_dataset`` (``OPEN_SET_DATASETS`` gives cifar100 -> cifar10 by default).

* held-out classes of the training dataset itself (``scenario.held_out_classes = N`` with ``"open-set"``,
  any dataset: Fashion-MNIST, digits, shapes, CIFAR, image folders): :func:`held_out_split`. The N
  classes no step trains on are the only evaluation classes; queries are their images of the "train"
  split (the same draw the training data comes from), the gallery their "test" split images, as paper
  001 (Sec. 5.1: "the training and test splits of the test datasets are used for query and gallery")
  and this module's other open-set protocols do. Pair verification draws its first image from the
  queries and the second from the gallery (paper 002 draws both from CIFAR-10's test split).

Class-incremental cells may be scored on all test classes or only on those the gallery model was
trained on (paper 000 leaves it open): option ``eval_classes`` = ``"all"`` | ``"seen"``, applied by
``restrict_eval_split`` (closed-set only: open-set classes are never trained on).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.data.imageset import ImageSet
from engine.data.registry import load_dataset
from engine.data.shapes import DEFAULT_NUM_CLASSES
from engine.core.vocab import EVAL_CLASSES
from engine.core.vocab import RUN_PROTOCOLS as PROTOCOLS

OPEN_SET_DATASETS = {"cifar100": "cifar10"}
OPEN_SET_CLASSES = 10


@dataclass(frozen=True, eq=False)
class EvalSplit:
    """Queries and gallery of one protocol; with ``same_set`` they are the same images, index for index."""

    query: ImageSet
    gallery: ImageSet
    same_set: bool
    protocol: str


def make_eval_split(protocol: str, *, dataset: str, root: str | Path = "data", seed: int = 0,
                    options: Mapping | None = None, split_options: Mapping[str, Mapping] | None = None,
                    open_set_dataset: str | None = None, open_set_classes: int = OPEN_SET_CLASSES) -> EvalSplit:
    """Load the query and gallery images of ``protocol`` for a model trained on ``dataset``.

    ``options`` go to every load this protocol makes (for open-set on real data those are loads of
    ``open_set_dataset``); ``split_options["train"]`` / ``["test"]`` are added for that split only,
    e.g. ``{"train": {"per_class": 60}, "test": {"per_class": 20}}``.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
    options, split_options = dict(options or {}), split_options or {}

    def load(name: str, split: str, extra: Mapping) -> ImageSet:
        return load_dataset(name, root=root, split=split, seed=seed, **{**options, **split_options.get(split, {}), **extra})

    if protocol == "closed-set":
        test = load(dataset, "test", {})
        return EvalSplit(test, test, True, protocol)
    if dataset == "shapes" and open_set_dataset in (None, "shapes"):
        if open_set_classes < 1:
            raise ValueError(f"open_set_classes must be at least 1, got {open_set_classes}")
        held_out = {"first_class": options.get("first_class", 0) + options.get("num_classes", DEFAULT_NUM_CLASSES),
                    "num_classes": open_set_classes}
        return EvalSplit(load("shapes", "train", held_out), load("shapes", "test", held_out), False, protocol)
    name = open_set_dataset or OPEN_SET_DATASETS.get(dataset)
    if name is None:
        raise ValueError(f"open-set evaluation of {dataset!r} needs an open_set_dataset with classes disjoint from "
                         f"its own (defaults exist for {', '.join(['shapes', *OPEN_SET_DATASETS])})")
    if name == dataset:
        raise ValueError(f"open-set evaluation on {dataset!r} itself would reuse the training classes; "
                         f"choose a different open_set_dataset or the closed-set protocol")
    return EvalSplit(load(name, "train", {}), load(name, "test", {}), False, protocol)


def restrict_eval_split(split: EvalSplit, *, eval_classes: str, seen_classes: Sequence[int]) -> EvalSplit:
    """The split to score a gallery model that was trained on ``seen_classes``.

    ``eval_classes="all"`` returns ``split`` unchanged; ``"seen"`` keeps only the images of
    ``seen_classes`` (labels unchanged), which needs a closed-set split.
    """
    if eval_classes not in EVAL_CLASSES:
        raise ValueError(f"eval_classes must be one of {', '.join(EVAL_CLASSES)}, got {eval_classes!r}")
    if eval_classes == "all":
        return split
    if split.protocol != "closed-set":
        raise ValueError("eval_classes='seen' needs the closed-set protocol: open-set evaluation classes are never trained on")
    kept = split.gallery.select_classes(seen_classes)
    return EvalSplit(kept, kept, True, split.protocol)


def held_out_split(train: ImageSet, test: ImageSet, held_out: Sequence[int]) -> EvalSplit:
    """The open-set split of ``held_out`` classes of the training dataset: their ``train`` images are the queries,
    their ``test`` images the gallery, no other class in either (labels unchanged). ValueError when the two splits
    name different classes or a held-out class has no image on one side."""
    if tuple(test.class_names) != tuple(train.class_names):
        raise ValueError(f"the train and test splits name different classes ({len(train.class_names)} vs "
                         f"{len(test.class_names)}), so held-out classes cannot be matched across them")
    classes = sorted(int(c) for c in held_out)
    query, gallery = train.select_classes(classes), test.select_classes(classes)
    for side, images in (("train (query)", query), ("test (gallery)", gallery)):
        empty = sorted(set(classes) - set(images.labels.unique().tolist()))
        if empty:
            raise ValueError(f"held-out class(es) {', '.join(train.class_names[c] for c in empty[:5])} have no "
                             f"{side} images; every held-out class needs both")
    return EvalSplit(query, gallery, False, "open-set")
