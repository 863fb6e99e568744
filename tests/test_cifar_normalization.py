"""CIFAR runs are normalised per channel once (recorded on the ImageSet); built-in data stays in [0, 1]."""
import pickle

import numpy as np
import pytest
import torch

from engine.core.config import config_from_dict
from engine.run.data_setup import input_normalization, prepare_run_data


def write_uniform_cifar100(root, per_class=3):
    """cifar-100-python whose every image is red = 255, green = 51, blue = 0, ``per_class`` images of each class."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    labels = [c for _ in range(per_class) for c in range(100)]
    pixels = np.zeros((len(labels), 3072), dtype=np.uint8)
    pixels[:, :1024], pixels[:, 1024:2048] = 255, 51
    for name in ("train", "test"):
        (folder / name).write_bytes(pickle.dumps({"data": pixels, "fine_labels": labels, "coarse_labels": labels}))
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": [f"f{i}" for i in range(100)]}))


def test_cifar_run_data_is_normalised_with_the_cifar100_statistics(data_root):
    write_uniform_cifar100(data_root)
    cfg = config_from_dict({"dataset": {"name": "cifar100", "root": str(data_root), "max_per_class": 2},
                            "scenario": {"initial_classes": 50, "increment": 50, "num_steps": 2},
                            "eval": {"train_features_per_class": 1}})
    data = prepare_run_data(cfg)
    # by hand: (1 - 0.5071) / 0.2675, (0.2 - 0.4867) / 0.2565, (0 - 0.4408) / 0.2761
    expected = torch.tensor([1.84262, -1.11774, -1.59652])
    for images in (data.train, data.query, data.gallery):
        assert images.mean == (0.5071, 0.4867, 0.4408) and images.std == (0.2675, 0.2565, 0.2761)
        assert torch.allclose(images.images.mean(dim=(0, 2, 3)), expected, atol=1e-4)
    assert len(data.train) == 200 and len(data.gallery) == 300  # max_per_class caps the training images only
    assert data.adapter_train.mean == data.train.mean


def test_built_in_data_is_not_normalised():
    cfg = config_from_dict({"dataset": {"name": "shapes", "train_per_class": 4, "test_per_class": 2},
                            "scenario": {"initial_classes": 2, "increment": 2, "num_steps": 2}})
    data = prepare_run_data(cfg)
    assert data.train.mean is None and data.gallery.std is None
    assert 0.0 <= float(data.train.images.min()) and float(data.train.images.max()) <= 1.0
    assert input_normalization("digits") == input_normalization("imagefolder") == {}


def test_max_per_class_is_refused_for_shapes():
    with pytest.raises(ValueError, match="dataset.max_per_class does not apply to shapes"):
        config_from_dict({"dataset": {"name": "shapes", "max_per_class": 5}})
    with pytest.raises(ValueError, match="dataset.max_per_class must be a finite number"):
        config_from_dict({"dataset": {"name": "cifar100", "max_per_class": 0}})
