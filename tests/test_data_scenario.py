"""Class-incremental scenarios: exact class lists, and every bad split explained."""
import numpy as np
import pytest

from engine.data import build_scenario, select_replay


def test_ten_plus_six_times_fifteen_covers_every_class_once():
    sc = build_scenario(num_classes=100, initial_classes=10, increment=15, class_order=list(range(100)))
    assert sc.num_steps == 7
    assert [len(s.new_classes) for s in sc.steps] == [10] + [15] * 6
    assert sc.steps[0].new_classes == tuple(range(10)) and sc.steps[1].new_classes == tuple(range(10, 25))
    assert sc.steps[-1].seen_classes == tuple(range(100))
    flat = [c for s in sc.steps for c in s.new_classes]
    assert sorted(flat) == list(range(100))  # no class dropped, none twice


def test_seeded_order_is_a_permutation_and_reproducible():
    a = build_scenario(num_classes=30, initial_classes=10, increment=10, class_order_seed=3)
    b = build_scenario(num_classes=30, initial_classes=10, increment=10, class_order_seed=3)
    c = build_scenario(num_classes=30, initial_classes=10, increment=10, class_order_seed=4)
    assert a == b and a.class_order != c.class_order and sorted(a.class_order) == list(range(30))
    assert a.steps[1].new_classes == a.class_order[10:20]


def test_cumulative_and_finetune_training_sets():
    cum = build_scenario(num_classes=6, initial_classes=2, increment=2, class_order=[5, 4, 3, 2, 1, 0])
    assert cum.steps[2].train_classes == (5, 4, 3, 2, 1, 0) and cum.steps[2].replay_classes == ()
    ft = build_scenario(num_classes=6, initial_classes=2, increment=2, class_order=[5, 4, 3, 2, 1, 0],
                        training="finetune", replay_per_class=3, replacement_steps=[3])
    assert ft.steps[1].train_classes == (3, 2) and ft.steps[1].replay_classes == (5, 4)
    assert ft.steps[2].replaced and ft.steps[2].train_classes == (5, 4, 3, 2, 1, 0)  # a replacement model sees all


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_classes=100, initial_classes=10, increment=20), "90 remaining classes are not a multiple of 20"),
        (dict(num_classes=100, initial_classes=10, increment=10, num_steps=3), "10 \\+ 2 x 10 = 30 classes, but the dataset has 100"),
        (dict(num_classes=10, initial_classes=20, increment=5), "more than the 10 classes"),
        (dict(num_classes=4, initial_classes=2, increment=1, class_order=[0, 1, 1, 2]), "more than once"),
        (dict(num_classes=4, initial_classes=2, increment=1, class_order=[0, 1, 2, 7]), "outside 0..3"),
        (dict(num_classes=4, initial_classes=2, increment=1, class_order=[0, 1, 2]), "misses classes \\[3\\]"),
        (dict(num_classes=4, initial_classes=2, increment=2, replay_per_class=5), "only applies to training='finetune'"),
        (dict(num_classes=4, initial_classes=2, increment=2, replacement_steps=[1]), "must lie in 2..2"),
        (dict(num_classes=4, initial_classes=2, increment=2, training="online"), "unknown training mode"),
    ],
)
def test_bad_splits_are_explained(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_scenario(**kwargs)


def test_replay_memory_is_seeded_per_class_and_capped():
    labels = np.array([0] * 5 + [1] * 2 + [2] * 4)
    idx = select_replay(labels, [0, 1], 3, seed=1)
    assert list(labels[idx]).count(0) == 3 and list(labels[idx]).count(1) == 2 and 2 not in labels[idx]
    assert np.array_equal(idx, select_replay(labels, [0, 1], 3, seed=1))
