"""Open set on the training dataset itself (``scenario.held_out_classes``): which classes are held out, that no step
ever trains on them, that evaluation uses exactly them (queries = their train images, gallery = their test
images, paper 001 Sec. 5.1), and one-line refusals of contradictory configs."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from engine.core.config import config_from_dict
from engine.data import fashion_files
from engine.data.registry import load_dataset
from engine.data.scenario import build_scenario
from engine.run.data_setup import prepare_run_data

DIGITS = {
    "dataset": {"name": "digits"},
    "scenario": {"initial_classes": 4, "increment": 2, "num_steps": 3, "held_out_classes": 2},
    "eval": {"protocol": "open-set"},
    "model": {"backbone": "small_cnn", "width": 8},
    "training": {"epochs": 1, "batch_size": 64},
}


def _with(base: dict, **sections) -> dict:
    return {**base, **{k: {**base.get(k, {}), **v} for k, v in sections.items()}}


# --- the scenario -----------------------------------------------------------------------------------------------


def test_the_last_classes_of_the_seeded_order_are_held_out_and_never_trained():
    sc = build_scenario(num_classes=10, initial_classes=4, increment=2, class_order_seed=7, held_out_classes=2,
                        training="finetune", replay_per_class=5, replacement_steps=[3])
    order = tuple(np.random.default_rng(7).permutation(10).tolist())  # the order drawn without holding out
    assert sc.class_order == order and sc.held_out_classes == order[8:]
    assert sc.num_steps == 3 and [s.new_classes for s in sc.steps] == [order[:4], order[4:6], order[6:8]]
    for step in sc.steps:  # new, seen, trained and replayed classes alike
        used = set(step.new_classes) | set(step.seen_classes) | set(step.train_classes) | set(step.replay_classes)
        assert not used & set(sc.held_out_classes)
    assert sc.steps[-1].seen_classes == order[:8]
    # the same seed names the same held-out classes whatever the split of the rest
    other = build_scenario(num_classes=10, initial_classes=2, increment=2, class_order_seed=7, held_out_classes=2)
    assert other.held_out_classes == sc.held_out_classes and other.num_steps == 4
    assert build_scenario(num_classes=10, initial_classes=4, increment=2, class_order_seed=7).held_out_classes == ()


@pytest.mark.parametrize("held, kwargs, message", [
    (1, {}, "held_out_classes = 1 would evaluate a single class"),
    (10, {}, "held_out_classes = 10 leaves none of the 10 classes to train"),
    (-1, {}, "held_out_classes must be 0 or more"),
    (3, {}, "with 3 of the 10 classes held out, 7 are trained: 7 classes cannot be split into an initial 4 plus equal "
            "increments of 2"),
    (2, {"num_steps": 4}, "with 2 of the 10 classes held out, 8 are trained: num_steps=4 does not fit"),
])
def test_bad_held_out_counts_are_refused_in_one_line(held, kwargs, message):
    with pytest.raises(ValueError) as err:
        build_scenario(num_classes=10, initial_classes=4, increment=2, held_out_classes=held, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_without_held_out_classes_every_class_must_still_be_trained():
    with pytest.raises(ValueError, match="the 2 remaining classes are not a multiple of 4"):
        build_scenario(num_classes=10, initial_classes=8, increment=4)


# --- the config ------------------------------------------------------------------------------------------------


def test_a_held_out_config_reads_and_round_trips():
    cfg = config_from_dict(DIGITS)
    assert cfg.scenario.held_out_classes == 2 and config_from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="but there are 10, which take 4 steps"):  # 0 held out: all must be trained
        config_from_dict(_with(DIGITS, scenario={"held_out_classes": 0}))


@pytest.mark.parametrize("sections, message", [
    ({"eval": {"protocol": "closed-set"}}, "scenario.held_out_classes = 2 evaluates on the held-out classes, an open-set "
                                           "protocol; set eval.protocol = 'open-set'"),
    ({"eval": {"open_set_dataset": "cifar10"}}, "eval.open_set_dataset = 'cifar10' names another source"),
    ({"eval": {"eval_classes": "seen"}}, "contradicts eval.eval_classes = 'seen'"),
    ({"eval": {"open_set_classes": 5}}, "leave eval.open_set_classes out"),
    ({"scenario": {"held_out_classes": 1}}, "held_out_classes = 1 would evaluate a single class"),
    ({"scenario": {"held_out_classes": 3}}, "does not fit the 10 classes of dataset digits with 3 held out: "),
    ({"scenario": {"held_out_classes": -2}}, "config key scenario.held_out_classes"),
    ({"dataset": {"name": "fashion"}, "scenario": {"held_out_classes": 4}},
     "does not fit the 10 classes of dataset fashion with 4 held out"),
    ({"model": {"dsimplex_classes": 7}}, "model.dsimplex_classes = 7 is smaller than the 8 trained classes"),
])
def test_contradictory_configs_are_refused_in_one_line(sections, message):
    with pytest.raises(ValueError) as err:
        config_from_dict(_with(DIGITS, **sections))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_dsimplex_sized_for_the_trained_classes_is_enough():
    assert config_from_dict(_with(DIGITS, model={"dsimplex_classes": 8})).model.dsimplex_classes == 8


# --- the data of a run -----------------------------------------------------------------------------------------


def _check_open_set(data, cfg, train_full, test_full) -> None:
    """Independently of the code under test: the held-out ids are the last of the seeded order, no training
    step's labels (nor the adapter images) include them, and query / gallery hold exactly their train / test images."""
    s = cfg.scenario
    n = train_full.num_classes
    order = np.random.default_rng(s.class_order_seed).permutation(n)
    held = order[n - s.held_out_classes:]
    trained = n - s.held_out_classes
    assert data.total_classes == trained and data.class_names == tuple(train_full.class_names[c] for c in order[:trained])
    assert data.scenario.held_out_classes == tuple(range(trained, n))
    for step in data.scenario.steps:
        for replay in (False, True):
            _, labels = data.train_images(step, replay, seed=cfg.seed + step.index)
            assert len(labels) and int(labels.max()) < trained
    assert int(data.train.labels.max()) < trained and int(data.adapter_train.labels.max()) < trained
    assert len(data.train) == int(np.isin(train_full.labels.numpy(), order[:trained]).sum())
    for side, full in ((data.query, train_full), (data.gallery, test_full)):
        keep = np.flatnonzero(np.isin(full.labels.numpy(), held))
        positions = {int(c): trained + i for i, c in enumerate(held)}
        assert side.labels.tolist() == [positions[int(c)] for c in full.labels[keep]]
        assert np.array_equal(side.images.numpy(), full.images[keep].numpy())  # the same images, in file order
        assert {side.class_names[p] for p in positions.values()} == {full.class_names[c] for c in held}
    assert not data.same_set


def test_digits_evaluate_exactly_the_held_out_classes():
    cfg = config_from_dict(DIGITS)
    data = prepare_run_data(cfg)
    _check_open_set(data, cfg, load_dataset("digits", split="train"), load_dataset("digits", split="test"))


def test_shapes_generate_the_held_out_classes_beside_the_trained_ones():
    cfg = config_from_dict(_with(DIGITS, dataset={"name": "shapes", "train_per_class": 6, "test_per_class": 3}))
    data = prepare_run_data(cfg)
    options = {"num_classes": 10, "per_class": None}
    train = load_dataset("shapes", split="train", **{**options, "per_class": 6})
    test = load_dataset("shapes", split="test", **{**options, "per_class": 3})
    _check_open_set(data, cfg, train, test)


def _idx(array: np.ndarray) -> bytes:
    head = bytes([0, 0, 0x08, array.ndim])
    return head + np.asarray(array.shape, dtype=">u4").tobytes() + array.astype(np.uint8).tobytes()


def test_fashion_mnist_evaluates_exactly_the_held_out_classes(tmp_path, monkeypatch):
    monkeypatch.setattr(fashion_files, "DEBIAN_ROOT", tmp_path / "no-debian-here")
    rng = np.random.default_rng(0)
    for split, per_class in (("train", 6), ("test", 3)):
        labels = np.tile(np.arange(10), per_class)
        names = fashion_files.FILES[split]
        (tmp_path / names[0]).write_bytes(_idx(rng.integers(0, 256, size=(len(labels), 28, 28))))
        (tmp_path / names[1]).write_bytes(_idx(labels))
    cfg = config_from_dict(_with(DIGITS, dataset={"name": "fashion", "root": str(tmp_path)},
                                 scenario={"initial_classes": 2, "increment": 2, "num_steps": 3, "held_out_classes": 4,
                                           "class_order_seed": 5}))
    data = prepare_run_data(cfg)
    train = load_dataset("fashion", root=tmp_path, split="train", per_class=cfg.dataset.train_per_class)
    _check_open_set(data, cfg, train, load_dataset("fashion", root=tmp_path, split="test", per_class=20))
    assert len(data.query) == 4 * 6 and len(data.gallery) == 4 * 3


def test_an_image_folder_evaluates_exactly_the_held_out_classes(tmp_path):
    rng = np.random.default_rng(1)
    for split, count in (("train", 5), ("test", 2)):
        for c in range(6):
            folder = tmp_path / "imgs" / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    root = str(tmp_path / "imgs")
    cfg = config_from_dict(_with(DIGITS, dataset={"name": "imagefolder", "root": root, "image_size": 8, "augment": False},
                                 scenario={"initial_classes": 2, "increment": 2, "num_steps": 2, "held_out_classes": 2}))
    data = prepare_run_data(cfg)
    train = load_dataset("imagefolder", root=root, split="train", image_size=8)
    _check_open_set(data, cfg, train, load_dataset("imagefolder", root=root, split="test", image_size=8))
    # a folder whose classes do not divide after holding out is refused when the data is read, in one line
    bad = config_from_dict(_with(cfg.to_dict(), scenario={"held_out_classes": 3}))
    with pytest.raises(ValueError) as err:
        prepare_run_data(bad)
    assert "with 3 of the 6 classes held out, 3 are trained" in str(err.value) and "\n" not in str(err.value)


def test_a_run_stores_features_of_the_held_out_classes_only(tmp_path):
    from storage import get_engine, list_model_versions, load_feature_set, session_scope

    from engine.run.pipeline import RunContext, run_experiment

    cfg = config_from_dict(_with(DIGITS, dataset={"train_per_class": 20, "test_per_class": 10}))
    data = prepare_run_data(cfg)
    db = get_engine(f"sqlite:///{tmp_path / 'lab.db'}")
    exp_id = run_experiment(cfg, RunContext(db, tmp_path / "ckpt"), data=data)
    with session_scope(db) as s:
        versions = list_model_versions(s, exp_id)
        assert [v.step for v in versions] == [1, 2, 3]
        for v in versions:
            _, query_labels, _ = load_feature_set(s, v.id, "query", "encoder")
            _, gallery_labels, _ = load_feature_set(s, v.id, "gallery", "encoder")
            assert set(np.unique(query_labels)) == set(np.unique(gallery_labels)) == {8, 9}
            assert len(query_labels) == len(data.query) and len(gallery_labels) == len(data.gallery)
