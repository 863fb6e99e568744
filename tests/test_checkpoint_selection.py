"""training.select: "last" keeps the last epoch's weights, "best_val" the first epoch of best accuracy on a seeded
held-out share of the step's training images (paper 002's released code, cores-compatibility src/cores/main.py)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from engine.core.config import TrainingConfig
from engine.methods.base import StepContext
from engine.methods.plain import Independent
from engine.models import build_model
from engine.methods.training import VAL_SEED_OFFSET, Hooks, train_step, validation_split

_EPOCHS_DONE = [0]  # set by the test's on_epoch hook; read by the unlearning method


@dataclasses.dataclass(frozen=True)
class _Unlearning(Independent):
    """Cross-entropy towards the true class in epoch 1, towards the other class (of two) afterwards."""

    def loss(self, out, targets, ctx, old_out):
        goal = 1 - targets if _EPOCHS_DONE[0] >= 1 else targets
        loss = F.cross_entropy(out.logits, goal)
        return loss, {"loss": float(loss.detach())}


def _two_classes(per_class: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    """Dark images (class 0) and bright ones (class 1), 1 x 8 x 8, interleaved."""
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(2 * per_class) % 2
    images = labels.float().view(-1, 1, 1, 1) * 2 - 1 + 0.3 * torch.randn(2 * per_class, 1, 8, 8, generator=gen)
    return images, labels


def test_validation_split_holds_out_the_floor_of_each_class_share_seeded():
    labels = torch.tensor([0] * 10 + [1] * 25 + [2] * 3)
    train, val = validation_split(labels, 0.2, seed=5)
    # floor(0.2 * 10) = 2, floor(0.2 * 25) = 5, floor(0.2 * 3) = 0
    assert np.bincount(labels[val].numpy(), minlength=3).tolist() == [2, 5, 0]
    assert sorted(train.tolist() + val.tolist()) == list(range(38))
    assert torch.equal(val, torch.sort(val).values)
    again = validation_split(labels, 0.2, seed=5)
    assert torch.equal(again[0], train) and torch.equal(again[1], val)
    others = [validation_split(labels, 0.2, seed=s)[1] for s in range(6, 12)]
    assert any(not torch.equal(o, val) for o in others)  # the seed draws which images
    with pytest.raises(ValueError, match=r"validation fraction must be in \(0, 0.5\]"):
        validation_split(labels, 0.6, seed=0)


def _train(select: str) -> tuple[list[dict[str, float]], list[dict[str, torch.Tensor]], torch.nn.Module, torch.Tensor]:
    images, labels = _two_classes()
    net = build_model(backbone="small_cnn", head="linear", num_classes=2, in_channels=1, width=8, seed=0)
    cfg = TrainingConfig(epochs=3, batch_size=10, lr=0.1, lr_schedule="constant", select=select,
                         val_fraction=0.25 if select == "best_val" else None)
    snapshots = []

    def on_epoch(epoch, epochs, parts):
        _EPOCHS_DONE[0] = epoch
        snapshots.append({k: v.detach().clone() for k, v in net.state_dict().items()})

    _EPOCHS_DONE[0] = 0
    ctx = StepContext(step=1, seen_classes=(0, 1), new_classes=(0, 1))
    history = train_step(net, _Unlearning(), images, labels, ctx, cfg, device=torch.device("cpu"), seed=3,
                         augment_images=False, hooks=Hooks(on_epoch=on_epoch))
    return history, snapshots, net, labels


def test_best_val_keeps_the_best_epoch_even_when_it_is_not_the_last():
    history, snapshots, net, labels = _train("best_val")
    images, _ = _two_classes()
    _, val = validation_split(labels, 0.25, seed=3 + VAL_SEED_OFFSET)
    assert len(val) == 20  # floor(0.25 * 40) of each class
    by_hand = []
    for state in snapshots:  # every epoch's weights, scored independently of the loop
        probe = build_model(backbone="small_cnn", head="linear", num_classes=2, in_channels=1, width=8, seed=0)
        probe.load_state_dict(state)
        probe.eval()
        with torch.no_grad():
            logits = probe(images[val]).logits.numpy()
        by_hand.append(float(np.mean(logits.argmax(axis=1) == labels[val].numpy())))
    assert [h["val_accuracy"] for h in history] == pytest.approx(by_hand)
    best = int(np.argmax(by_hand))  # the first epoch of highest accuracy
    assert best == 0 and by_hand[0] > by_hand[-1]  # learned in epoch 1, unlearned after: the best is not the last
    for k, v in net.state_dict().items():
        assert torch.equal(v, snapshots[best][k]), k


def test_last_keeps_the_last_epoch_and_trains_on_every_image():
    history, snapshots, net, _ = _train("last")
    assert all("val_accuracy" not in h for h in history)
    for k, v in net.state_dict().items():
        assert torch.equal(v, snapshots[-1][k]), k


def test_best_val_refuses_a_share_that_holds_out_nothing():
    images, labels = _two_classes(per_class=5)
    net = build_model(backbone="small_cnn", head="linear", num_classes=2, in_channels=1, width=8, seed=0)
    cfg = TrainingConfig(epochs=1, batch_size=4, select="best_val", val_fraction=0.1)
    ctx = StepContext(step=1, seen_classes=(0, 1), new_classes=(0, 1))
    with pytest.raises(ValueError, match="holds out no image of its classes \\(fewer than 10 per class\\)"):
        train_step(net, Independent(), images, labels, ctx, cfg, device=torch.device("cpu"), seed=0, augment_images=False)


@pytest.mark.parametrize("training, message", [
    ({"select": "best"}, "config key training.select must be one of last, best_val, got 'best'"),
    ({"val_fraction": 0.2}, "training.val_fraction = 0.2 applies only to training.select = 'best_val', got 'last'"),
    ({"select": "best_val", "val_fraction": 0.6}, r"training.val_fraction must be a finite number in \(0, 0.5\], got 0.6"),
    ({"select": "best_val", "val_fraction": 0}, r"training.val_fraction must be a finite number in \(0, 0.5\], got 0"),
])
def test_the_config_refuses_bad_selections_in_one_line(training, message):
    from engine.core.config import config_from_dict

    with pytest.raises(ValueError, match=message) as info:
        config_from_dict({"training": training})
    assert "\n" not in str(info.value)
    assert config_from_dict({}).training.select == "last"  # the default is unchanged
    assert config_from_dict({"training": {"select": "best_val", "val_fraction": 0.5}}).training.val_fraction == 0.5
