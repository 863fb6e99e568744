"""Fashion-MNIST: the IDX reader on small files written here, the real Debian files, the presets, and
``export-images`` (PNG class folders that ``load_imagefolder`` reads back pixel for pixel)."""
from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest
import torch

from engine.cli import main
from engine.data.disk import load_imagefolder
from engine.data.imageset import DatasetNotFoundError
from engine.data.registry import load_dataset
from engine.data.scenario import build_scenario
from engine.data.fashion import CLASS_NAMES, load_fashion
from engine.data.export_images import export_images, folder_name
from engine.data import fashion_files

LABELS = [3, 0, 3, 9, 0, 3]  # Dress, T-shirt/top, Dress, Ankle boot, T-shirt/top, Dress


def idx_bytes(array: np.ndarray, *, ndim_byte: int | None = None) -> bytes:
    """An IDX file of unsigned bytes: 0x00 0x00 0x08 ndim, big-endian uint32 dims, the data."""
    head = bytes([0, 0, 0x08, array.ndim if ndim_byte is None else ndim_byte])
    return head + np.asarray(array.shape, dtype=">u4").tobytes() + array.astype(np.uint8).tobytes()


def tiny_images(n: int = len(LABELS)) -> np.ndarray:
    """Image i is black except pixel (i, 2i) = 10 i + 5."""
    images = np.zeros((n, 28, 28), np.uint8)
    for i in range(n):
        images[i, i, 2 * i] = 10 * i + 5
    return images


def write_split(root, *, images: bytes, labels: bytes, split: str = "train", gz: bool = False) -> None:
    names = fashion_files.FILES[split]
    for name, data in zip(names, (images, labels)):
        if gz:
            with gzip.open(root / f"{name}.gz", "wb") as handle:
                handle.write(data)
        else:
            (root / name).write_bytes(data)


@pytest.fixture
def no_debian(monkeypatch, tmp_path):
    """Hide the system copy so only the test's own files are found."""
    monkeypatch.setattr(fashion_files, "DEBIAN_ROOT", tmp_path / "no-debian-here")


@pytest.mark.parametrize("gz", [False, True])
def test_tiny_files_give_the_pixels_and_labels_written(tmp_path, no_debian, gz):
    write_split(tmp_path, images=idx_bytes(tiny_images()), labels=idx_bytes(np.array(LABELS)), gz=gz)
    data = load_fashion(root=tmp_path, split="train")
    assert data.images.shape == (6, 1, 28, 28) and data.images.dtype == torch.uint8  # float per batch
    assert data.labels.tolist() == LABELS
    assert data.class_names[0] == "T-shirt/top" and data.class_names[9] == "Ankle boot"
    for i in range(6):
        expected = torch.zeros(28, 28, dtype=torch.uint8)
        expected[i, 2 * i] = 10 * i + 5
        assert torch.equal(data.images[i, 0], expected)
        assert torch.equal(data.batch([i])[0, 0], expected.float() / 255)


def test_per_class_caps_keep_the_first_images_of_each_class_in_file_order(tmp_path, no_debian):
    write_split(tmp_path, images=idx_bytes(tiny_images()), labels=idx_bytes(np.array(LABELS)))
    two = load_fashion(root=tmp_path, max_per_class=2)  # class 3: images 0, 2 (not 5); class 0: 1, 4; class 9: 3
    assert two.labels.tolist() == [3, 0, 3, 9, 0]
    assert two.images[4, 0, 4, 8] == 45
    both = load_dataset("fashion", root=tmp_path, per_class=1, max_per_class=2)  # the smaller cap wins
    assert both.labels.tolist() == [3, 0, 9]
    assert both.images[2, 0, 3, 6] == 35


def test_files_under_root_are_found_and_missing_files_say_how_to_get_them(tmp_path, no_debian):
    with pytest.raises(DatasetNotFoundError) as err:
        load_fashion(root=tmp_path, split="test")
    message = str(err.value)
    assert "\n" not in message and "apt-get install dataset-fashion-mnist" in message
    assert str(tmp_path) in message and "t10k-images-idx3-ubyte" in message
    raw = tmp_path / "FashionMNIST" / "raw"  # torchvision's download folder
    raw.mkdir(parents=True)
    write_split(raw, images=idx_bytes(tiny_images(2)), labels=idx_bytes(np.array([1, 2])), split="test")
    assert load_fashion(root=tmp_path, split="test").labels.tolist() == [1, 2]
    assert not fashion_files.fashion_available(tmp_path)  # the train split is still missing


@pytest.mark.parametrize("case, fragment", [
    ("bad magic", "not an IDX file"),
    ("truncated images", "declares dimensions (6, 28, 28)"),
    ("truncated gzip", "could not be read"),
    ("wrong counts", "(5, 28, 28), but (6, 28, 28) were expected"),
    ("label out of range", "label 10"),
])
def test_bad_files_are_refused_in_one_line(tmp_path, no_debian, case, fragment):
    images, labels = idx_bytes(tiny_images()), idx_bytes(np.array(LABELS))
    if case == "bad magic":
        labels = idx_bytes(np.array(LABELS), ndim_byte=3)
    elif case == "truncated images":
        images = images[:-100]
    elif case == "wrong counts":
        images = idx_bytes(tiny_images(5))
    elif case == "label out of range":
        labels = idx_bytes(np.array([*LABELS[:-1], 10]))
    write_split(tmp_path, images=images, labels=labels, gz=case == "truncated gzip")
    if case == "truncated gzip":
        path = tmp_path / "train-images-idx3-ubyte.gz"
        path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(ValueError) as err:
        load_fashion(root=tmp_path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_huge_declared_size_is_refused_before_reading(tmp_path, no_debian):
    head = bytes([0, 0, 8, 3]) + np.array([4_000_000_000, 28, 28], dtype=">u4").tobytes()
    write_split(tmp_path, images=head + bytes(100), labels=idx_bytes(np.array(LABELS)))
    with pytest.raises(ValueError, match="declares dimensions"):
        load_fashion(root=tmp_path)


debian = pytest.mark.skipif(fashion_files.find_split(fashion_files.DEBIAN_ROOT, "test") is None,
                            reason="Debian's dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)")


@debian
def test_the_debian_test_split_matches_torchvisions_reader(tmp_path):
    from torchvision.datasets.mnist import read_image_file, read_label_file

    data = load_fashion(root=tmp_path / "empty", split="test")
    assert len(data) == 10_000 and data.labels.bincount().tolist() == [1000] * 10
    assert data.class_names == ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                                "Bag", "Ankle boot")
    plain = {}
    for name in fashion_files.FILES["test"]:
        with gzip.open(fashion_files.DEBIAN_ROOT / f"{name}.gz", "rb") as src, open(tmp_path / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
        plain[name] = tmp_path / name
    expected = read_image_file(str(plain["t10k-images-idx3-ubyte"]))  # torchvision's own IDX parser
    assert torch.equal(data.labels, read_label_file(str(plain["t10k-labels-idx1-ubyte"])).long())
    assert torch.equal(data.images[:, 0], expected)
    first = load_fashion(root=tmp_path / "empty", split="train", per_class=3)
    assert first.labels.bincount().tolist() == [3] * 10 and first.labels[0] == 9  # the first train image is an ankle boot


def test_fashion_presets_split_the_ten_classes_as_named():
    from engine.core.presets import preset_config

    for name, sizes in {"fashion-2x5": [2, 2, 2, 2, 2], "fashion-4-3-3": [4, 3, 3], "fashion-5-5": [5, 5]}.items():
        s = preset_config(name).scenario
        scenario = build_scenario(num_classes=10, initial_classes=s.initial_classes, increment=s.increment,
                                  num_steps=s.num_steps)
        assert [len(step.new_classes) for step in scenario.steps] == sizes, name
        assert sorted(scenario.steps[-1].seen_classes) == list(range(10))
        assert preset_config(name).dataset.name == "fashion"


def test_quick_demo_uses_fashion_when_present_and_says_so_when_it_falls_back(monkeypatch):
    import engine.core.presets as presets

    assert presets.preset_config("quick-demo", fashion_present=lambda root: True).dataset.name == "fashion"
    assert presets.preset_config("quick-demo", fashion_present=lambda root: True).name == "quick-demo"
    assert presets.preset_config("quick-demo").dataset.name == "fashion"  # no probe: the preset as written
    fallback = presets.preset_config("quick-demo", fashion_present=lambda root: False)
    assert fallback.dataset.name == "shapes" and fallback.scenario.num_steps == 3
    assert "Fashion-MNIST absent" in fallback.name and "apt-get install dataset-fashion-mnist" in fallback.name
    assert fallback.methods == presets.preset_config("fashion-4-3-3").methods
    assert len(CLASS_NAMES) == 10


# --- export-images ---------------------------------------------------------------------------


@pytest.fixture
def tiny_root(tmp_path, monkeypatch):
    """Six 28x28 images with random pixels (seeded) under tmp_path/fm, and no system copy."""
    monkeypatch.setattr(fashion_files, "DEBIAN_ROOT", tmp_path / "no-debian-here")
    root = tmp_path / "fm"
    root.mkdir()
    pixels = np.random.default_rng(0).integers(0, 256, size=(6, 28, 28))
    write_split(root, images=idx_bytes(pixels), labels=idx_bytes(np.array(LABELS)))
    return root


def test_folder_names_are_safe():
    assert folder_name("T-shirt/top") == "T-shirt_top"
    assert folder_name("Ankle boot") == "Ankle boot"
    assert folder_name("..") == "_" and folder_name("a\\b") == "a_b"


def test_export_round_trips_through_load_imagefolder(tiny_root, tmp_path):
    out = tmp_path / "png"
    counts = export_images("fashion", out, split="train", max_per_class=2, root=tiny_root)
    assert counts == {"Dress": 2, "T-shirt_top": 2, "Ankle boot": 1}
    assert sorted(p.name for p in (out / "Dress").iterdir()) == ["0.png", "2.png"]  # positions 0 and 2 of the split
    original = load_fashion(root=tiny_root, max_per_class=2)
    back = load_imagefolder(out, image_size=28)
    assert back.class_names == ("Ankle boot", "Dress", "T-shirt_top")
    # ImageFolder walks folders in name order and files in name order: Ankle boot (3), Dress (0, 2), T-shirt_top (1, 4)
    order = [3, 0, 2, 1, 4]
    for k, i in enumerate(order):
        assert back.class_names[int(back.labels[k])] == folder_name(original.class_names[int(original.labels[i])])
        for channel in range(3):  # grayscale PNGs come back as RGB with three equal channels
            assert torch.equal(back.images[k, channel], original.images[i, 0])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".png")] == []  # no temporary folder left


def test_a_non_empty_out_is_refused_and_left_alone(tiny_root, tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code = main(["export-images", "--dataset", "fashion", "--split", "train", "--out", str(out), "--root", str(tiny_root)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "not an empty folder" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export-images", "--dataset", "fashion", "--split", "train", "--out", str(empty),
                 "--root", str(tiny_root), "--max-per-class", "1"]) == 0
    assert sorted(p.name for p in empty.iterdir()) == ["Ankle boot", "Dress", "T-shirt_top"]


def test_a_failed_export_leaves_nothing(tiny_root, tmp_path, monkeypatch):
    from PIL import Image

    saved = []

    def save_then_fail(image, path, *args, **kwargs):
        if saved:
            raise OSError("disk full")
        saved.append(path)
        original_save(image, path, *args, **kwargs)

    original_save = Image.Image.save
    monkeypatch.setattr(Image.Image, "save", save_then_fail)
    with pytest.raises(OSError, match="disk full"):
        export_images("fashion", tmp_path / "out", split="train", root=tiny_root)
    assert len(saved) == 1  # one PNG was written, into the temporary folder, then removed with it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fm"]


def test_a_fashion_root_outside_the_data_roots_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from engine.data.fashion import load_fashion
    from engine.data.roots import OutsideRootsError

    monkeypatch.setenv("COMPATLAB_DATA_ROOTS", str(tmp_path / "allowed"))
    with pytest.raises(OutsideRootsError, match="outside the data roots"):
        load_fashion(root="/etc", split="test", max_per_class=1)
