"""Digits, the registry and its options, ImageSet helpers and the seeded loader."""
import numpy as np
import pytest
import torch

from engine.data.builtin import make_digits
from engine.data.imageset import ImageSet, stratified_split
from engine.data.loaders import AUGMENTATIONS, make_loader
from engine.data.registry import DATASETS, load_dataset
from engine.data.shapes import make_shapes
from engine.data.imageset import first_per_class
from engine.data.loaders import crop_flip


def test_digits_split_is_stratified_seeded_and_disjoint():
    train, test = make_digits(split="train"), make_digits(split="test")
    assert train.images.shape[1:] == (1, 8, 8) and float(train.images.max()) == 1.0 and float(train.images.min()) == 0.0
    assert len(train) + len(test) == 1797
    # 30% of each class (rounded) is test: class 0 has 178 images -> 53 test
    assert int((test.labels == 0).sum()) == 53 and int((train.labels == 0).sum()) == 125
    assert torch.equal(make_digits(split="test").images, test.images)
    assert not torch.equal(make_digits(split="test", seed=1).images, test.images)
    assert len(make_digits(split="train", max_per_class=5)) == 50


def test_stratified_split_and_first_per_class_by_hand():
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    train, test = stratified_split(labels, 0.5, seed=0)
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(10))
    assert labels[test].tolist().count(0) == 2 and labels[test].tolist().count(1) == 3
    assert first_per_class(labels, 2).tolist() == [0, 1, 4, 5]
    with pytest.raises(ValueError, match="between 0 and 1"):
        stratified_split(labels, 1.0, seed=0)


def test_registry_names_and_unknown_dataset_lists_them():
    assert list(DATASETS) == ["digits", "shapes", "cifar10", "cifar100", "fashion", "imagefolder"]
    assert DATASETS["digits"].train_augment == "none" and DATASETS["shapes"].train_augment == "crop_flip"
    with pytest.raises(ValueError, match="unknown dataset 'mnist'; known datasets: digits, shapes, cifar10, cifar100, fashion, imagefolder"):
        load_dataset("mnist")


def test_options_are_strict_except_the_shared_ones():
    with pytest.raises(ValueError, match="dataset 'digits' has no option 'num_classes'; its options are test_fraction, max_per_class"):
        load_dataset("digits", num_classes=5)
    # per_class / image_size / download go only to the loaders that have them
    shapes = load_dataset("shapes", split="test", num_classes=2, per_class=3, image_size=32, download=False)
    assert torch.equal(shapes.images, make_shapes(num_classes=2, per_class=3, split="test").images)
    assert len(load_dataset("digits", per_class=3, image_size=32)) == len(make_digits())


def test_normalisation_is_applied_and_recorded():
    raw = load_dataset("shapes", num_classes=1, per_class=2)
    norm = load_dataset("shapes", num_classes=1, per_class=2, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    assert torch.allclose(norm.images, (raw.images - 0.5) / 0.25) and norm.mean == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="already normalised"):
        norm.normalized((0.5,) * 3, (0.25,) * 3)
    with pytest.raises(ValueError, match="mean and std together"):
        load_dataset("shapes", num_classes=1, mean=(0.5, 0.5, 0.5))


def test_imageset_validates_and_selects_classes_without_relabelling():
    s = ImageSet(torch.zeros(4, 1, 2, 2), torch.tensor([0, 2, 1, 2]), ["a", "b", "c"])
    assert s.select_classes([2]).labels.tolist() == [2, 2] and s.select_classes([2]).class_names == ("a", "b", "c")
    assert s.subset([3, 0]).labels.tolist() == [2, 0] and len(s.as_dataset()) == 4
    with pytest.raises(ValueError, match="labels must lie in 0..1"):
        ImageSet(torch.zeros(1, 1, 2, 2), torch.tensor([2]), ["a", "b"])
    with pytest.raises(ValueError, match="float32"):
        ImageSet(torch.zeros(1, 1, 2, 2, dtype=torch.float64), torch.tensor([0]), ["a"])


def test_crop_flip_is_a_shifted_window_of_the_padded_image_maybe_flipped():
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).view(2, 3, 32, 32)
    out = crop_flip(x, torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(2):
        windows = [padded[i, :, dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)]
        assert any(torch.equal(out[i], w) or torch.equal(out[i], w.flip(2)) for w in windows)


def test_loader_is_seeded_and_checks_its_augmentation():
    s = make_shapes(num_classes=2, per_class=5)
    first = [b for b in make_loader(s, batch_size=4, augment="crop_flip", seed=7)]
    again = [b for b in make_loader(s, batch_size=4, augment="crop_flip", seed=7)]
    assert [tuple(x.shape) for x, _ in first] == [(4, 3, 32, 32), (4, 3, 32, 32), (2, 3, 32, 32)]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    plain = next(iter(make_loader(make_digits(), batch_size=8, shuffle=False)))
    assert torch.equal(plain[0], make_digits().images[:8])
    assert AUGMENTATIONS == ("none", "crop_flip")
    with pytest.raises(ValueError, match="unknown augmentation 'cutout'"):
        make_loader(s, augment="cutout")
    with pytest.raises(ValueError, match="use augment='none'"):
        make_loader(make_digits(), augment="crop_flip")
