"""Stationarity vs a learnable classifier: a 2-D feature space trained on digits, 5 classes then 10.

The papers' toy (paper 001 Fig. 3, paper 002 Figs. 3 and 10, paper 004 Fig. 3) is LeNet++ on MNIST
with 2-D features; here ``small_cnn`` on scikit-learn's 8x8 ``digits`` (``engine.data.builtin.make_digits``)
with a bias-free projection to 2 features, trained in two cumulative steps: classes 0-4, then 0-9.

Two classifiers:

* ``learnable``: a linear head (``engine.models.LinearHead``) with 5 outputs, grown to 10 at step 2;
  plain cross-entropy (``engine.methods`` "independent").
* ``fixed``: 10 fixed unit prototypes evenly spaced on the circle, w_y = (cos 36 y deg, sin 36 y deg),
  all pre-allocated from step 1 (``engine.models.FixedHead``); cross-entropy over all 10 outputs
  (``engine.methods`` "cores"). A true d-Simplex with K = 10 classes needs K - 1 = 9 feature
  dimensions (``dsimplex_prototypes``); in 2-D the regular polygon is the fixed classifier CoReS draws
  in its Fig. 4(c). It is not equiangular in the simplex sense (neighbours are 36 degrees apart, not
  arccos(-1/9)), but it is fixed, so the old classes keep their directions when new ones arrive.

Step 2 either fine-tunes the step-1 network (``step2_init="finetune"``) or trains a fresh one from
the same seed (``"scratch"``, the CoReS protocol). Features of the test images are recorded after
every epoch so the page can step through training.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from engine.core.config import TrainingConfig
from engine.data.builtin import make_digits
from engine.models.extract import extract_outputs
from engine.learn.runtime import one_thread
from engine.methods import StepContext, build_method
from engine.metrics import ecc_pass
from engine.metrics.retrieval import retrieval_metrics
from engine.models import FixedHead, Net, build_model
from engine.methods.training import Hooks, train_step

HEADS = ("learnable", "fixed")
STEP2_INITS = ("finetune", "scratch")
FIRST_CLASSES = 5
ALL_CLASSES = 10
METHOD_OF_HEAD = {"learnable": "independent", "fixed": "cores"}


def polygon_prototypes(num_classes: int = ALL_CLASSES) -> torch.Tensor:
    """``num_classes`` unit vectors evenly spaced on the circle, class y at angle 360 y / K degrees: (K, 2)."""
    if num_classes < 2:
        raise ValueError(f"need at least 2 prototypes, got {num_classes}")
    angle = torch.arange(num_classes, dtype=torch.float64) * (2 * math.pi / num_classes)
    return torch.stack([torch.cos(angle), torch.sin(angle)], dim=1).float()


def build_net(head: str, *, num_outputs: int, width: int, seed: int) -> Net:
    """``small_cnn`` -> 2 features -> the chosen head; seeded. The fixed head always has 10 outputs."""
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {head!r}")
    net = build_model(backbone="small_cnn", head="linear", num_classes=num_outputs, feature_dim=2, in_channels=1,
                      width=width, seed=seed)
    if head == "fixed":
        net.head = FixedHead(polygon_prototypes(ALL_CLASSES))
    return net


@dataclass(frozen=True)
class StationarityRun:
    """What the page draws, for both heads.

    * ``features``: ``head``, ``step``, ``epoch`` (0 = before training), ``label``, ``x``, ``y``: the 2-D
      features of every test image after each epoch.
    * ``prototypes``: ``head``, ``step``, ``epoch``, ``label``, ``x``, ``y``: the classifier row of
      each class present in the head at that moment.
    * ``drift``: ``head``, ``label``, the mean test feature direction of each old class (0-4) after
      step 1 and after step 2 (``angle_1``, ``angle_2`` in degrees) and the ``drift_deg`` between them.
    * ``summary``: one row per head: test accuracy after step 1 (digits 0-4, argmax over their five
      outputs) and after step 2 (all ten), mean |drift| of the old digits, Recall@1 self-test of the
      step-1 model and cross-test (step-2 queries vs step-1 gallery) on the old digits' test images
      (cosine, leave-one-out), and whether ECC passes (strict).
    """

    features: pd.DataFrame
    prototypes: pd.DataFrame
    drift: pd.DataFrame
    summary: pd.DataFrame


def _angle_deg(xy: np.ndarray) -> np.ndarray:
    return np.degrees(np.arctan2(xy[..., 1], xy[..., 0]))


def _wrap(deg: np.ndarray | float) -> np.ndarray | float:
    """An angle difference in (-180, 180]."""
    return (np.asarray(deg) + 180.0) % 360.0 - 180.0


def run_stationarity(
    *, epochs: int = 20, lr: float = 0.05, step2_init: str = "finetune", width: int = 32, seed: int = 0,
) -> StationarityRun:
    """Train both heads through the two steps and record features, prototypes, drift and ECC (seeded)."""
    if step2_init not in STEP2_INITS:
        raise ValueError(f"step2_init must be one of {STEP2_INITS}, got {step2_init!r}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    with one_thread():
        return _run(epochs, lr, step2_init, width, seed)


def _run(epochs: int, lr: float, step2_init: str, width: int, seed: int) -> StationarityRun:
    train, test = make_digits(split="train", seed=seed), make_digits(split="test", seed=seed)
    cfg = TrainingConfig(epochs=epochs, batch_size=64, optimizer="sgd", lr=lr, momentum=0.9, weight_decay=5e-4,
                         lr_schedule="cosine", amp=False)
    device = torch.device("cpu")
    test_labels = test.labels.numpy()
    feature_rows, prototype_rows, finals = [], [], {}
    for head in HEADS:
        method = build_method(METHOD_OF_HEAD[head])
        net = build_net(head, num_outputs=FIRST_CLASSES, width=width, seed=seed)
        for step, classes in ((1, range(FIRST_CLASSES)), (2, range(ALL_CLASSES))):
            if step == 2:
                if step2_init == "scratch":
                    net = build_net(head, num_outputs=ALL_CLASSES, width=width, seed=seed)
                elif head == "learnable":
                    net.head.expand(ALL_CLASSES - FIRST_CLASSES, seed=seed)
            mask = train.labels < len(classes)
            seen = tuple(classes)
            ctx = StepContext(step=step, seen_classes=seen, new_classes=seen if step == 1 else seen[FIRST_CLASSES:])

            def record(epoch: int, *_: object, head: str = head, step: int = step, net: Net = net) -> None:
                feats = extract_outputs(net, test.images, device="cpu")["encoder"]
                feature_rows.append(pd.DataFrame({"head": head, "step": step, "epoch": epoch, "label": test_labels,
                                                  "x": feats[:, 0], "y": feats[:, 1]}))
                weight = net.head.weight.detach().cpu().numpy()[: len(seen)]
                prototype_rows.append(pd.DataFrame({"head": head, "step": step, "epoch": epoch,
                                                    "label": np.arange(len(seen)), "x": weight[:, 0], "y": weight[:, 1]}))

            record(0)
            train_step(net, method, train.images[mask], train.labels[mask], ctx, cfg, device=device, seed=seed + step,
                       augment_images=False, hooks=Hooks(on_epoch=lambda epoch, *_: record(epoch)))
            outputs = extract_outputs(net, test.images, device="cpu")
            finals[head, step] = outputs
    features = pd.concat(feature_rows, ignore_index=True)
    prototypes = pd.concat(prototype_rows, ignore_index=True)
    drift, summary = _drift_and_summary(finals, test_labels)
    return StationarityRun(features, prototypes, drift, summary)


def _drift_and_summary(finals: dict, labels: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
    old = labels < FIRST_CLASSES
    drift_rows, summary_rows = [], []
    for head in HEADS:
        f1, f2 = finals[head, 1]["encoder"], finals[head, 2]["encoder"]
        for y in range(FIRST_CLASSES):
            a1 = float(_angle_deg(f1[labels == y].mean(0)))
            a2 = float(_angle_deg(f2[labels == y].mean(0)))
            drift_rows.append({"head": head, "label": y, "angle_1": a1, "angle_2": a2, "drift_deg": float(_wrap(a2 - a1))})
        acc1 = float((finals[head, 1]["logits"][old, :FIRST_CLASSES].argmax(1) == labels[old]).mean())
        acc2 = float((finals[head, 2]["logits"][:, :ALL_CLASSES].argmax(1) == labels).mean())
        self_test = float(retrieval_metrics(f1[old], labels[old], f1[old], labels[old], ks=(1,), same_set=True,
                                            compute_map=False)["recall@1"])
        cross = float(retrieval_metrics(f2[old], labels[old], f1[old], labels[old], ks=(1,), same_set=True,
                                        compute_map=False)["recall@1"])
        passes = bool(ecc_pass(np.array([[self_test, np.nan], [cross, np.nan]]))[1, 0] == 1.0)
        mean_drift = float(np.mean([abs(r["drift_deg"]) for r in drift_rows if r["head"] == head]))
        summary_rows.append({"head": head, "accuracy_step1": acc1, "accuracy_step2": acc2, "mean_abs_drift_deg": mean_drift,
                             "self_test": self_test, "cross_test": cross, "ecc_passes": passes})
    return pd.DataFrame(drift_rows), pd.DataFrame(summary_rows)
