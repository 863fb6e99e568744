"""CIFAR and ImageFolder loaders on small files written by the tests (torchvision's on-disk layouts)."""
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from engine.data.disk import load_cifar, load_imagefolder
from engine.data.imageset import DatasetNotFoundError
from engine.data.protocols import make_eval_split
from engine.data.registry import load_dataset


def write_cifar10(root, per_batch=4):
    """cifar-10-batches-py with 5 train batches + test batch; image j of a batch has every pixel = its label."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = [j % 10 for j in range(per_batch)]
        data = np.repeat(np.array(labels, dtype=np.uint8)[:, None], 3072, axis=1)
        (folder / name).write_bytes(pickle.dumps({"data": data, "labels": labels}))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))


def write_cifar100(root):
    """cifar-100-python with 'train' (6 images of classes 0,1,0,1,0,2) and 'test'; fine labels only."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    labels = [0, 1, 0, 1, 0, 2]
    pixels = np.zeros((6, 3072), dtype=np.uint8)
    pixels[:, :1024] = 255  # red channel full: the layout is 1024 R, 1024 G, 1024 B values per row
    pixels[:, 1024 + 33] = 51  # green channel, row 1, column 1
    for name in ("train", "test"):
        (folder / name).write_bytes(pickle.dumps({"data": pixels, "fine_labels": labels, "coarse_labels": [0] * 6}))
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": [f"f{i}" for i in range(100)]}))


def test_cifar10_reads_every_train_batch_in_order(tmp_path):
    write_cifar10(tmp_path)
    train = load_dataset("cifar10", root=tmp_path)
    assert train.images.shape == (20, 3, 32, 32) and len(load_dataset("cifar10", root=tmp_path, split="test")) == 4
    assert train.labels.tolist() == [0, 1, 2, 3] * 5 and train.class_names[3] == "c3"
    assert float(train.images[3].max()) == pytest.approx(3 / 255)


def test_cifar100_pixel_layout_labels_and_max_per_class(tmp_path):
    write_cifar100(tmp_path)
    train = load_cifar("cifar100", root=tmp_path)
    assert len(train.class_names) == 100 and train.labels.tolist() == [0, 1, 0, 1, 0, 2]
    assert float(train.images[0, 0].min()) == 1.0 and float(train.images[0, 2].max()) == 0.0
    assert float(train.images[0, 1, 1, 1]) == pytest.approx(0.2) and float(train.images[0, 1].sum()) == pytest.approx(0.2)
    capped = load_dataset("cifar100", root=tmp_path, max_per_class=2)
    assert capped.labels.tolist() == [0, 1, 0, 1, 2]  # the first two of each class, in file order


def test_missing_cifar_says_what_is_missing_and_where_to_put_it(tmp_path):
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("cifar100", root=tmp_path, split="test")
    assert str(err.value) == (
        f"CIFAR-100 not found under {tmp_path} (missing cifar-100-python/test, cifar-100-python/meta): download "
        f"cifar-100-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and extract it into {tmp_path}, "
        f"or pass download=True")
    assert isinstance(err.value, ValueError)


def test_truncated_cifar_file_is_reported(tmp_path):
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"")
    with pytest.raises(ValueError, match="could not be read.*extract the archive again"):
        load_cifar("cifar10", root=tmp_path, split="test")


def test_open_set_cifar100_to_cifar10_uses_cifar10_train_as_queries_and_test_as_gallery(tmp_path):
    write_cifar10(tmp_path)
    split = make_eval_split("open-set", dataset="cifar100", root=tmp_path, options={"max_per_class": 1})
    assert not split.same_set and split.protocol == "open-set"
    assert len(split.query) == 4 and len(split.gallery) == 4 and split.query.class_names[0] == "c0"


def write_tree(root, classes, per_class=2, size=(20, 14)):
    for i, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for j in range(per_class):
            Image.new("RGB", size, (255 * (i % 2), 0, 255 * (1 - i % 2))).save(root / name / f"{j}.png")


def test_imagefolder_with_split_folders(tmp_path):
    write_tree(tmp_path / "train", ["cat", "dog"], per_class=3)
    write_tree(tmp_path / "val", ["cat", "dog"], per_class=1)
    train = load_dataset("imagefolder", root=tmp_path, image_size=16)
    assert train.images.shape == (6, 3, 16, 16) and train.class_names == ("cat", "dog")
    assert float(train.batch(train.labels == 1)[:, 0].mean()) == pytest.approx(1.0)  # dogs are red
    assert len(load_dataset("imagefolder", root=tmp_path, split="test")) == 2  # val/ serves as test
    assert load_dataset("imagefolder", root=tmp_path).images.shape[-1] == 32  # image_size None means 32


def test_imagefolder_without_split_folders_is_split_by_class(tmp_path):
    write_tree(tmp_path, ["a", "b", "c"], per_class=10)
    train = load_dataset("imagefolder", root=tmp_path, split="train", seed=1)
    test = load_dataset("imagefolder", root=tmp_path, split="test", seed=1)
    assert torch.bincount(test.labels).tolist() == [3, 3, 3] and torch.bincount(train.labels).tolist() == [7, 7, 7]
    assert len(load_dataset("imagefolder", root=tmp_path, max_per_class=2)) == 6
    assert load_imagefolder(tmp_path, image_size=8).images.shape == (30, 3, 8, 8)


def test_imagefolder_problems_are_explained(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="not found: put one sub-folder of images per class there"):
        load_dataset("imagefolder", root=tmp_path / "nope")
    write_tree(tmp_path / "train", ["cat", "dog"])
    with pytest.raises(DatasetNotFoundError, match="has a train/ folder but no test/ or val/ folder"):
        load_dataset("imagefolder", root=tmp_path)
    write_tree(tmp_path / "test", ["cat", "cow"])
    with pytest.raises(ValueError, match=r"different class folders \(2 and 2, 2 in only one of them\)") as caught:
        load_dataset("imagefolder", root=tmp_path, split="test")
    assert "dog" not in str(caught.value) and "cow" not in str(caught.value)  # folder contents are never listed
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(DatasetNotFoundError, match="has no usable images"):
        load_imagefolder(tmp_path / "empty")
