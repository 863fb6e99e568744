"""storage.safe_open and its users: regular files inside the roots only, checked after opening (issue 24, item 7).

A swapping symlink reads nothing outside the roots in 3,000 thumbnail renders; a FIFO (in an image folder, as a
thumbnail's image, as a feature file or a store shard) is refused at once instead of hanging; /dev/zero is refused;
symlinked image files or folders that lead out of the roots are refused with one line or not walked. Every call that
could hang runs in a thread that the test waits on with a generous limit, so a hang fails the test instead of
blocking it.
"""
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.checkpoints.evaluate_folder import FolderError, load_feature_folder
from engine.data import thumbnails
from engine.data.folder import list_image_folder
from storage.safe_open import UnsafeFileError, open_regular, read_regular

HANG = 120  # seconds a call may take before the test calls it a hang (it returns in milliseconds)


def within(call, limit: float = HANG):
    """``call()``'s result, or the exception it raised; fails the test when it has not returned within ``limit``."""
    box: dict = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"the call did not return within {limit} s (it hangs)"
    if "error" in box:
        raise box["error"]
    return box["value"]


def png(path: Path, colour: tuple[int, int, int]) -> Path:
    Image.new("RGB", (4, 4), colour).save(path, format="PNG")
    return path


@pytest.fixture
def roots(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """``(data root, a folder outside every data root)``."""
    inside, outside = tmp_path / "root", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    monkeypatch.setenv("COMPATLAB_DATA_ROOTS", str(inside))
    return inside, outside


def test_the_helper_reads_a_regular_file_and_refuses_the_rest(roots):
    inside, outside = roots
    (inside / "a.bin").write_bytes(b"hello")
    (outside / "secret.txt").write_text("root:x:0:0")
    (inside / "out").symlink_to(outside / "secret.txt")
    (inside / "ok").symlink_to(inside / "a.bin")
    os.mkfifo(inside / "fifo")
    assert read_regular(inside / "a.bin", roots=[inside]) == b"hello"
    assert read_regular(inside / "ok", roots=[inside]) == b"hello"  # a link that stays inside is fine
    refusals = {"out": "leads outside", "fifo": "is a FIFO", ".": "is a folder"}
    for name, words in refusals.items():
        with pytest.raises(UnsafeFileError, match=words) as info:
            within(lambda: read_regular(inside / name, roots=[inside]))
        assert "\n" not in str(info.value) and "root:x" not in str(info.value)
    with pytest.raises(UnsafeFileError, match="is a character device"):
        within(lambda: read_regular("/dev/zero", roots=None))
    with pytest.raises(UnsafeFileError, match="above the 4-byte limit"):
        read_regular(inside / "a.bin", roots=[inside], max_bytes=4)


def test_reads_stop_at_the_size_the_file_had_when_opened(roots):
    inside, _ = roots
    path = inside / "growing.bin"
    path.write_bytes(b"12345")
    with open_regular(path, roots=[inside]) as handle:
        with open(path, "ab") as writer:
            writer.write(b"67890")
        assert handle.read() == b"12345"
        assert handle.seek(0, 2) == 5


def test_a_swapping_symlink_reads_nothing_outside_the_roots_in_3000_renders(roots):
    inside, outside = roots
    good, bad = png(inside / "good.png", (255, 0, 0)), png(outside / "bad.png", (0, 0, 255))
    link = inside / "image.png"
    link.symlink_to(good)
    stop = threading.Event()

    def flip():  # as an attacker would: remove and re-create the link, pointing in and out by turns
        targets = (bad, good)
        n = 0
        while not stop.is_set():
            n += 1
            try:
                os.unlink(link)
            except FileNotFoundError:
                pass
            os.symlink(targets[n % 2], link)

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    source = {"root": str(inside), "files": ["image.png"]}
    seen = {"inside": 0, "outside": 0, "none": 0}
    try:
        for _ in range(3000):
            pixels = thumbnails._files(source, np.array([0]))[0]
            if pixels is None:
                seen["none"] += 1
            else:
                seen["outside" if tuple(pixels[0, 0]) == (0, 0, 255) else "inside"] += 1
    finally:
        stop.set()
        flipper.join(HANG)
    assert seen["outside"] == 0, seen
    assert sum(seen.values()) == 3000


def test_a_fifo_as_a_thumbnail_image_or_in_the_cache_is_refused_at_once(roots, tmp_path):
    inside, _ = roots
    os.mkfifo(inside / "fifo.png")
    png(inside / "ok.png", (0, 255, 0))
    source = {"root": str(inside), "files": ["fifo.png", "ok.png"]}
    cache = inside / "thumbs"
    got = within(lambda: thumbnails.thumbnails(source, [0, 1], cache_dir=cache))
    assert got[0] is None and got[1] is not None
    cached = next(cache.rglob("*.png"))
    cached.unlink()
    os.mkfifo(cached)  # a FIFO planted where the cached PNG was: rendered again instead of waited on
    again = within(lambda: thumbnails.thumbnails(source, [1], cache_dir=cache))
    assert again[0] == got[1]


def test_dev_zero_as_an_image_is_refused(roots):
    inside, _ = roots
    (inside / "zero.png").symlink_to("/dev/zero")
    assert within(lambda: thumbnails._files({"root": str(inside), "files": ["zero.png"]}, np.array([0]))) == [None]


def class_tree(inside: Path) -> Path:
    tree = inside / "tree"
    for name in ("a", "b"):
        (tree / name).mkdir(parents=True)
        png(tree / name / "1.png", (10, 20, 30))
    return tree


def test_a_fifo_in_an_image_folder_is_refused_at_once_with_one_line(roots):
    inside, _ = roots
    tree = class_tree(inside)
    os.mkfifo(tree / "b" / "2.png")
    images = list_image_folder(tree, layout="one folder per class")
    index = images.paths.index(os.path.join("b", "2.png"))
    assert images.pixels([0], 8).shape == (1, 3, 8, 8)
    with pytest.raises(ValueError, match="is a FIFO") as info:
        within(lambda: images.pixels([index], 8))
    assert "\n" not in str(info.value)


def test_dev_zero_and_a_file_symlinked_out_of_the_roots_are_refused_in_an_image_folder(roots):
    inside, outside = roots
    tree = class_tree(inside)
    png(outside / "secret.png", (1, 2, 3))
    (tree / "a" / "2.png").symlink_to(outside / "secret.png")
    (tree / "b" / "2.png").symlink_to("/dev/zero")
    images = list_image_folder(tree, layout="one folder per class")
    for name, words in ((os.path.join("a", "2.png"), "leads outside"), (os.path.join("b", "2.png"), "is a character")):
        with pytest.raises(ValueError, match=words) as info:
            within(lambda: images.pixels([images.paths.index(name)], 8))
        assert "\n" not in str(info.value)


def test_a_class_folder_symlinked_out_of_the_roots_is_not_walked(roots):
    inside, outside = roots
    tree = class_tree(inside)
    (outside / "more").mkdir()
    png(outside / "more" / "x.png", (1, 1, 1))
    (tree / "a" / "more").symlink_to(outside / "more", target_is_directory=True)
    (tree / "b" / "same").symlink_to(tree / "a", target_is_directory=True)  # a link that stays inside is walked
    images = list_image_folder(tree, layout="one folder per class")
    assert sorted(images.paths) == sorted([os.path.join("a", "1.png"), os.path.join("b", "1.png"),
                                           os.path.join("b", "same", "1.png")])


def test_a_fifo_or_a_device_as_a_feature_file_is_refused_at_once(roots, tmp_path):
    folder = tmp_path / "steps"
    folder.mkdir()
    rng = np.random.default_rng(0)
    np.savez(folder / "step_1.npz", query_features=rng.standard_normal((4, 3)).astype(np.float32),
             query_labels=np.arange(4), gallery_features=rng.standard_normal((4, 3)).astype(np.float32),
             gallery_labels=np.arange(4))
    os.mkfifo(folder / "step_2.npz")
    with pytest.raises(FolderError, match="step_2.npz is a FIFO") as info:
        within(lambda: load_feature_folder(folder))
    assert "\n" not in str(info.value)
    os.unlink(folder / "step_2.npz")
    (folder / "step_2.npz").symlink_to("/dev/zero")
    with pytest.raises(FolderError, match="step_2.npz is a character device"):
        within(lambda: load_feature_folder(folder))


def test_a_fifo_or_dev_zero_as_a_store_shard_is_refused_at_once(engine, tmp_path):
    from storage import load_feature_set, save_feature_set, session_scope
    from support.featurestore import arrays, new_version

    version = new_version(engine)
    with session_scope(engine) as s:
        save_feature_set(s, version, "gallery", "encoder", *arrays(5))
    shard = next((tmp_path / "features").rglob("shard-00000.npy"))
    shard.unlink()
    os.mkfifo(shard)
    with session_scope(engine) as s:
        with pytest.raises(ValueError, match="is a FIFO"):
            within(lambda: load_feature_set(s, version, "gallery", "encoder"))
    shard.unlink()
    shard.symlink_to("/dev/zero")
    with session_scope(engine) as s:
        with pytest.raises(ValueError, match="leads outside|character device"):
            within(lambda: load_feature_set(s, version, "gallery", "encoder"))
