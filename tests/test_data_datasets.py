"""Built-in and on-disk datasets, generated or written inside the tests."""
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from engine.data import DatasetNotFoundError, load_dataset, make_digits, make_shapes


def test_digits_split_is_stratified_and_seeded():
    tr, te = make_digits(split="train"), make_digits(split="test")
    assert tr.images.shape[1:] == (1, 8, 8) and float(tr.images.max()) <= 1.0
    assert len(tr) + len(te) == 1797 and set(te.labels.tolist()) == set(range(10))
    assert torch.equal(make_digits(split="test", seed=0).labels, te.labels)


def test_shapes_are_deterministic_and_class_images_do_not_depend_on_the_class_count():
    a = make_shapes(num_classes=10, per_class=5, seed=2)
    b = make_shapes(num_classes=100, per_class=5, seed=2)
    assert a.images.shape == (50, 3, 32, 32)
    assert torch.equal(a.images, b.images[:50])
    assert torch.equal(a.images, make_shapes(num_classes=10, per_class=5, seed=2).images)
    assert not torch.equal(a.images, make_shapes(num_classes=10, per_class=5, split="test", seed=2).images)


def test_shapes_are_learnable_but_not_trivial():
    tr = make_shapes(num_classes=20, per_class=30)
    te = make_shapes(num_classes=20, per_class=10, split="test")
    x, xt = tr.images.flatten(1), te.images.flatten(1)
    means = torch.stack([x[tr.labels == c].mean(0) for c in range(20)])
    acc = (torch.cdist(xt, means).argmin(1) == te.labels).float().mean().item()
    assert 0.1 < acc < 0.9  # nearest class mean on raw pixels: well above chance (0.05), far from perfect


def _fake_cifar10(root, n=12):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": list(rng.integers(0, 10, n))}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    return folder


def test_cifar10_from_local_files(tmp_path, monkeypatch):
    _fake_cifar10(tmp_path)
    # the real archive is checked by md5; these hand-written batches cannot match it
    monkeypatch.setattr("torchvision.datasets.CIFAR10._check_integrity", lambda self: True)
    monkeypatch.setattr("torchvision.datasets.cifar.check_integrity", lambda *a, **k: True)
    train = load_dataset("cifar10", root=str(tmp_path), split="train")
    test = load_dataset("cifar10", root=str(tmp_path), split="test")
    assert train.images.shape == (60, 3, 32, 32) and len(test) == 12
    assert train.class_names[3] == "c3" and 0.0 <= float(train.images.min()) and float(train.images.max()) <= 1.0


def test_missing_cifar_says_where_to_put_it(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="cifar-100-python.*extract it into"):
        load_dataset("cifar100", root=str(tmp_path))


def test_imagefolder_tree(tmp_path):
    for cls, colour in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
        for split in ("train", "test"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (20, 14), colour).save(tmp_path / split / cls / f"{i}.png")
    tr = load_dataset("imagefolder", root=str(tmp_path), split="train", image_size=16)
    assert tr.images.shape == (6, 3, 16, 16) and tr.class_names == ("cat", "dog")
    assert float(tr.images[tr.labels == 0][:, 0].mean()) == pytest.approx(1.0)  # red cats
    with pytest.raises(DatasetNotFoundError, match="one sub-folder of images per class"):
        load_dataset("imagefolder", root=str(tmp_path / "nope"))


def test_unknown_dataset_lists_known_ones():
    with pytest.raises(ValueError, match="known datasets: digits, shapes"):
        load_dataset("mnist")
