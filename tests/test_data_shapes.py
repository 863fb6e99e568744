"""The generated ``shapes`` dataset: layout, bit-for-bit determinism, per-class independence, difficulty."""
import pytest
import torch

from engine.data.shapes import make_shapes
from engine.data.shapes import SHAPES, TEXTURES, class_attributes, render_class


def test_layout_labels_and_names():
    s = make_shapes(num_classes=3, per_class=4)
    assert s.images.shape == (12, 3, 32, 32) and s.images.dtype == torch.float32
    assert 0.0 <= float(s.images.min()) and float(s.images.max()) <= 1.0
    assert s.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4  # class by class
    assert s.class_names == ("000-red-solid-circle", "001-blue-stripes-square", "002-yellow-checker-triangle")


def test_same_seed_gives_bit_identical_images_and_another_seed_does_not():
    a = make_shapes(num_classes=5, per_class=6, seed=3)
    assert torch.equal(a.images, make_shapes(num_classes=5, per_class=6, seed=3).images)
    assert not torch.equal(a.images, make_shapes(num_classes=5, per_class=6, seed=4).images)


def test_a_class_looks_the_same_whatever_the_number_of_classes_or_images():
    ten = make_shapes(num_classes=10, per_class=3, seed=1)
    hundred = make_shapes(num_classes=100, per_class=3, seed=1)
    assert torch.equal(ten.images, hundred.images[:30]) and ten.class_names == hundred.class_names[:10]
    more = make_shapes(num_classes=10, per_class=5, seed=1)
    assert torch.equal(more.images.view(10, 5, 3, 32, 32)[:, :3], ten.images.view(10, 3, 3, 32, 32))
    # held-out classes 7..9 generated on their own equal classes 7..9 of the full set
    held = make_shapes(num_classes=3, per_class=3, seed=1, first_class=7)
    assert torch.equal(held.images, ten.images[21:]) and held.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert held.class_names[0].startswith("007-")


def test_train_and_test_are_different_draws_of_the_same_classes():
    train = render_class(4, 3, "train")
    test = render_class(4, 3, "test")
    assert not torch.equal(torch.from_numpy(train), torch.from_numpy(test))
    with pytest.raises(ValueError, match="split must be one of"):
        render_class(4, 3, "val")


def test_classes_up_to_200_and_the_first_96_are_distinct_shape_texture_pairs():
    s = make_shapes(num_classes=200, per_class=1)
    assert len(s) == 200 and len(set(s.class_names)) == 200
    pairs = {(class_attributes(c)["shape"], class_attributes(c)["texture"]) for c in range(96)}
    assert len(pairs) == len(SHAPES) * len(TEXTURES) == 96


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="num_classes >= 1"):
        make_shapes(num_classes=0)


def test_learnable_but_not_trivial():
    """Nearest class mean on raw pixels of 20 classes: well above chance (0.05), far from 1 (measured 0.155)."""
    train = make_shapes(num_classes=20, per_class=30)
    test = make_shapes(num_classes=20, per_class=10, split="test")
    x, xt = train.images.flatten(1), test.images.flatten(1)
    means = torch.stack([x[train.labels == c].mean(0) for c in range(20)])
    accuracy = (torch.cdist(xt, means).argmin(1) == test.labels).float().mean().item()
    assert 0.1 < accuracy < 0.5
