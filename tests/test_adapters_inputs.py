"""Bad inputs to the adapter training give one-line errors a person can act on."""
import math

import numpy as np
import pytest

from engine.adapters.fit import fit_adapters

rng = np.random.default_rng(0)
OLD = rng.normal(size=(12, 4)).astype(np.float32)
NEW = rng.normal(size=(12, 5)).astype(np.float32)
LABELS = np.repeat([0, 1, 2], 4)


def with_value(array, row, value):
    out = array.copy()
    out[row, 1] = value
    return out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(new=NEW[:10], labels=LABELS),
            "old features has 12 rows but new features has 10; they must be the same samples",
        ),
        (dict(labels=LABELS[:11]), "labels has 11 entries but the features have 12 rows"),
        (dict(labels=LABELS.reshape(3, 4)), "labels must be 1-D"),
        (dict(old=OLD[:, :, None]), r"old features must be a 2-D array \(samples x dimensions\), got 3-D"),
        (dict(new=NEW[0]), "new features must be a 2-D array"),
        (dict(old=OLD[:0], new=NEW[:0], labels=LABELS[:0]), "old features is empty"),
        (dict(old=with_value(OLD, 3, np.nan)), "old features has NaN or inf in 1 row.*first at row 3"),
        (dict(new=with_value(NEW, 5, np.inf)), "new features has NaN or inf in 1 row.*first at row 5"),
        (dict(old=OLD.astype(str)), "old features must hold numbers"),
        (dict(labels=np.r_[LABELS[:-1], np.nan]), "labels contains NaN"),
        (
            dict(labels=np.r_[LABELS[:-1], 7]),
            r"needs at least 2 samples per class, but 1 class\(es\) have fewer: 7 \(1\); drop those classes",
        ),
        (
            dict(old_ids=list(range(12)), new_ids=list(range(12))[::-1]),
            "not in the same row order: 12 row.*first at row 0",
        ),
        (dict(old_ids=list(range(12))), "give image ids for both"),
        (dict(old_ids=list(range(11)), new_ids=list(range(11))), "one id per row"),
        (dict(kind="affine"), "kind must be one of"),
        (dict(epochs=0), "epochs must be a whole number >= 1"),
        (dict(batch_size=1), "use batch_size >= 2"),
        (dict(lr=0.0), "lr must be a positive finite number"),
        (dict(temperature=-0.1), "temperature must be"),
        (dict(kind="lambda", lam=-1.0), "lam must be >= 0"),
        (dict(kind="lambda", alpha=math.inf), "alpha must be a positive finite number"),
        (dict(loss_weights=(1.0, 1.0)), "loss_weights is"),
        (dict(loss_weights=(1.0, -1.0, 0.0)), "loss weights must be finite and >= 0"),
        (dict(loss_weights=(0.0, 0.0, 0.0)), "nothing would be trained"),
        (dict(with_forward=False, loss_weights=(1.0, 1.0, 0.0)), "set w1 = w3 = 0"),
        (dict(kind="fct", loss_weights=(1.0, 1.0, 1.0)), "loss_weights apply to 'perp' and 'lambda'"),
        (dict(kind="fct", with_forward=False), "leaves nothing to train"),
        (dict(dim_mismatch="crop"), "dim_mismatch must be one of"),
        (dict(mse_reduction="max"), "mse_reduction must be one of"),
        (dict(backward_init="uniform"), "B_perp always starts at the identity"),
    ],
)
def test_bad_inputs_raise_clear_errors(kwargs, message):
    args = dict(old=OLD, new=NEW, labels=LABELS) | kwargs
    old, new, labels = args.pop("old"), args.pop("new"), args.pop("labels")
    with pytest.raises(ValueError, match=message) as info:
        fit_adapters(old, new, labels, epochs=args.pop("epochs", 1), batch_size=args.pop("batch_size", 4), **args)
    assert "\n" not in str(info.value)


def test_singleton_classes_are_fine_without_the_contrastive_loss():
    labels = np.arange(12)
    pair = fit_adapters(OLD, NEW, labels, loss_weights=(1.0, 1.0, 0.0), epochs=1, batch_size=4)
    assert pair.describe()["n_classes"] == 12


def test_matching_image_ids_and_string_labels_are_accepted():
    ids = [f"img{i:03d}" for i in range(12)]
    labels = np.array(["cat", "dog", "owl"]).repeat(4)
    pair = fit_adapters(OLD, NEW, labels, old_ids=ids, new_ids=list(ids), epochs=1, batch_size=4)
    assert pair.describe()["n_classes"] == 3
