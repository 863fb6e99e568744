"""Class-incremental scenarios: exact class lists, training sets per mode, replay memory, every bad split explained."""
import re

import numpy as np
import pytest

from engine.data.scenario import build_scenario, select_replay


def test_ten_plus_six_times_fifteen_covers_every_class_once():
    sc = build_scenario(num_classes=100, initial_classes=10, increment=15, class_order_seed=None)
    assert sc.num_steps == 7 and [s.index for s in sc.steps] == [1, 2, 3, 4, 5, 6, 7]
    assert [s.new_classes for s in sc.steps] == [tuple(range(10))] + [tuple(range(10 + 15 * k, 25 + 15 * k)) for k in range(6)]
    assert sc.step(3).seen_classes == tuple(range(40)) and sc.steps[-1].seen_classes == tuple(range(100))
    assert sorted(c for s in sc.steps for c in s.new_classes) == list(range(100))  # none dropped, none twice
    assert sc.num_steps == build_scenario(num_classes=100, initial_classes=10, increment=15, num_steps=7).num_steps


def test_seeded_order_is_a_reproducible_permutation():
    a = build_scenario(num_classes=30, initial_classes=10, increment=10, class_order_seed=3)
    assert a == build_scenario(num_classes=30, initial_classes=10, increment=10, class_order_seed=3)
    assert a.class_order != build_scenario(num_classes=30, initial_classes=10, increment=10, class_order_seed=4).class_order
    assert sorted(a.class_order) == list(range(30)) and a.steps[1].new_classes == a.class_order[10:20]
    assert a.class_order == tuple(np.random.default_rng(3).permutation(30).tolist())


def test_cumulative_training_uses_every_seen_class():
    sc = build_scenario(num_classes=6, initial_classes=2, increment=2, class_order=[5, 4, 3, 2, 1, 0])
    assert [s.train_classes for s in sc.steps] == [(5, 4), (5, 4, 3, 2), (5, 4, 3, 2, 1, 0)]
    assert all(s.replay_classes == () and not s.replaced for s in sc.steps)


def test_finetune_trains_on_new_classes_with_replay_and_replacements_train_on_all_seen():
    sc = build_scenario(num_classes=6, initial_classes=2, increment=2, class_order=[5, 4, 3, 2, 1, 0],
                        training="finetune", replay_per_class=3, replacement_steps=[3])
    assert sc.steps[0].train_classes == (5, 4) and sc.steps[0].replay_classes == ()
    assert sc.steps[1].train_classes == (3, 2) and sc.steps[1].replay_classes == (5, 4)
    assert sc.steps[2].replaced and sc.steps[2].train_classes == (5, 4, 3, 2, 1, 0) and sc.steps[2].replay_classes == ()
    no_replay = build_scenario(num_classes=6, initial_classes=2, increment=2, training="finetune")
    assert no_replay.steps[1].replay_classes == ()


def test_iam_cl2r_seven_steps_with_replacements_at_three_and_five():
    sc = build_scenario(num_classes=100, initial_classes=10, increment=15, training="finetune", replay_per_class=20,
                        replacement_steps=(3, 5))
    assert [s.replaced for s in sc.steps] == [False, False, True, False, True, False, False]
    assert [len(s.seen_classes) for s in sc.steps if s.replaced] == [40, 70]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_classes=100, initial_classes=10, increment=20), re.escape(
         "100 classes cannot be split into an initial 10 plus equal increments of 20: the 90 remaining classes are not a "
         "multiple of 20 (4 increments use 80 and leave 10 classes out); choose an increment that divides 90 "
         "(1, 2, 3, 5, 6, 9, 10, 15, 18, 30, 45, 90) or change initial_classes")),
        (dict(num_classes=100, initial_classes=10, increment=15, num_steps=5), re.escape(
         "num_steps=5 does not fit: 10 initial classes + 4 x 15 = 70 classes, but there are 100, which take 7 steps; "
         "set num_steps=7 (or leave it out) or change the split")),
        (dict(num_classes=10, initial_classes=20, increment=5), "initial_classes=20 is more than the 10 classes available"),
        (dict(num_classes=10, initial_classes=4, increment=0), "increment must be at least 1 to add the 6 classes left"),
        (dict(num_classes=4, initial_classes=2, increment=1, class_order=[0, 1, 1, 2]), r"lists classes \[1\] more than once"),
        (dict(num_classes=4, initial_classes=2, increment=1, class_order=[0, 1, 2, 7]), r"classes \[7\] outside 0..3"),
        (dict(num_classes=4, initial_classes=2, increment=1, class_order=[0, 1, 2]), r"misses classes \[3\]"),
        (dict(num_classes=4, initial_classes=2, increment=2, replay_per_class=5),
         "replay_per_class=5 only applies to training='finetune'"),
        (dict(num_classes=4, initial_classes=2, increment=2, training="finetune", replacement_steps=[1]),
         "a replacement at step 1 is not possible"),
        (dict(num_classes=4, initial_classes=2, increment=2, replacement_steps=[3]), r"replacement steps \[3\] are outside .* in 2..2"),
        (dict(num_classes=6, initial_classes=2, increment=2, replacement_steps=[2, 2]), "lists a step more than once"),
        (dict(num_classes=4, initial_classes=2, increment=2, training="online"), "unknown training mode 'online'"),
    ],
)
def test_bad_splits_are_explained(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_scenario(**kwargs)


def test_step_lookup_is_one_based():
    sc = build_scenario(num_classes=4, initial_classes=2, increment=2)
    assert sc.step(1) is sc.steps[0]
    with pytest.raises(ValueError, match="has steps 1..2"):
        sc.step(0)


def test_replay_memory_is_seeded_per_class_nested_and_capped():
    labels = np.array([0] * 5 + [1] * 2 + [2] * 4)
    idx = select_replay(labels, [0, 1], 3, seed=1)
    assert labels[idx].tolist().count(0) == 3 and labels[idx].tolist().count(1) == 2 and 2 not in labels[idx]
    assert np.array_equal(idx, np.sort(idx)) and np.array_equal(idx, select_replay(labels, [1, 0], 3, seed=1))
    assert set(select_replay(labels, [0], 2, seed=1)) <= set(idx)  # a smaller budget keeps a subset
    assert set(select_replay(labels, [0], 5, seed=1)) == set(range(5))
    with pytest.raises(ValueError, match="class 7 has no images"):
        select_replay(labels, [7], 3, seed=1)
