"""Small files that declare huge contents cost little: a 144-megapixel PNG is refused from its header, a huge JPEG is
decoded reduced, a CIFAR batch whose members are not what a batch holds (or that is too large) is refused before
anything converts it, and a feature set's rows file is read only up to what its rows can take. Peak memory is
measured in a child process (tests/peak_memory.py); nothing here asserts a duration."""
from __future__ import annotations

import os
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import engine.data.cifar_files as cifar_files
from engine.data.cifar_files import batch_rows, read_batch
from engine.data.image_decode import MAX_DECODE_PIXELS, ImageTooLargeError, decode_rgb, open_lazily
from peak_memory import MB, measure

HEADROOM = 300 * MB  # each hostile file below would take over 400 MB once decoded or read


def constant_png(path: Path, width: int, height: int) -> None:
    """A black RGB PNG written row by row (the test never holds its pixels): ~1 kB per 1 MB of pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer, row = zlib.compressobj(9), bytes(1 + 3 * width)  # filter byte 0, then the row's pixels
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def test_a_144_megapixel_png_thumbnail_is_refused_from_its_header(tmp_path):
    constant_png(tmp_path / "big.png", 12_000, 12_000)  # 432 MB of RGB once decoded
    assert (tmp_path / "big.png").stat().st_size < 1 * MB
    with open_lazily(tmp_path / "big.png") as image:
        assert image.size == (12_000, 12_000)  # a valid PNG: Pillow reads its header
    with pytest.raises(ImageTooLargeError, match=r"^12000x12000 pixels, over the 50,000,000-pixel budget for one image$"):
        decode_rgb(tmp_path / "big.png", min_side=64)
    got = measure("from engine.data.thumbnails import thumbnails",
                  f"thumbnails({{'root': {str(tmp_path)!r}, 'files': ['big.png']}}, [0], "
                  f"cache_dir={str(tmp_path / 'cache')!r})", headroom=HEADROOM)
    assert got["error"] is None and got["result"] == [None], got  # no image, and no error for the whole page
    assert got["grew"] < HEADROOM, got


def test_a_huge_jpeg_is_decoded_reduced_and_a_small_one_exactly_as_before(tmp_path):
    Image.new("L", (12_000, 12_000), 128).save(tmp_path / "huge.jpg", quality=50)  # 144 megapixels, a small file
    got = measure("from engine.data.image_decode import decode_rgb",
                  f"decode_rgb({str(tmp_path / 'huge.jpg')!r}, min_side=32).size", headroom=HEADROOM)
    assert got["error"] is None and got["result"] == [1500, 1500], got  # decoded at 1/8 scale: 1500 >= 32
    assert got["grew"] < HEADROOM, got
    assert decode_rgb(tmp_path / "huge.jpg", min_side=512).getpixel((700, 700)) == (128, 128, 128)

    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)).save(tmp_path / "small.jpg")
    with Image.open(tmp_path / "small.jpg") as image:
        plain = np.asarray(image.convert("RGB"))
    assert np.array_equal(np.asarray(decode_rgb(tmp_path / "small.jpg", min_side=32)), plain)  # under the budget
    drafted = decode_rgb(tmp_path / "small.jpg", min_side=64, always_draft=True)  # a thumbnail's decode
    assert drafted.size == (100, 75)  # 1/4 scale: the largest reduction keeping both sides >= 64
    assert 300 * 400 <= MAX_DECODE_PIXELS


def _dag_batch(path: Path, rows: int) -> None:
    """A CIFAR-like batch whose ``data`` is one 3,072-value row referenced ``rows`` times: ~2 bytes per row on disk,
    3,072 once converted to an array."""
    row = [0] * 3072
    path.write_bytes(pickle.dumps({"data": [row] * rows, "labels": [0] * rows}, protocol=2))


def test_a_cifar_batch_with_an_oversized_member_is_refused_before_it_is_converted(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    _dag_batch(folder / "test_batch", 1_000_000)  # 3.1 GB once np.asarray walks it
    assert (folder / "test_batch").stat().st_size < 5 * MB
    got = measure("from engine.data.thumbnails import thumbnails",
                  f"thumbnails({{'dataset': 'cifar10', 'split': 'test', 'root': {str(tmp_path)!r}}}, [0], "
                  f"cache_dir={str(tmp_path / 'cache')!r})", headroom=HEADROOM)
    assert got["error"] == (f"ValueError: cifar10 file {folder / 'test_batch'} holds data of list, not rows of 3072 "
                            "uint8 values (3x32x32); extract the archive again"), got
    assert got["grew"] < HEADROOM, got


def test_cifar_labels_must_be_one_int_per_row(tmp_path):
    data = np.zeros((3, 3072), dtype=np.uint8)
    for labels in ([0, 1], [[0] * 10] * 3, "abc"):
        (tmp_path / "b").write_bytes(pickle.dumps({"data": data, "labels": labels}))
        with pytest.raises(ValueError, match=r"^CIFAR-10 file .*/b holds labels that are not one int per image"):
            batch_rows(read_batch(tmp_path / "b", "CIFAR-10"), tmp_path / "b", "CIFAR-10")
    (tmp_path / "b").write_bytes(pickle.dumps({"data": data, "labels": [4, 5, 6]}))
    pixels, labels = batch_rows(read_batch(tmp_path / "b", "CIFAR-10"), tmp_path / "b", "CIFAR-10")
    assert pixels.shape == (3, 3072) and labels == [4, 5, 6]


def test_a_cifar_batch_is_read_no_further_than_the_bound(tmp_path, monkeypatch):
    data = np.zeros((20, 3072), dtype=np.uint8)  # 61 kB
    (tmp_path / "b").write_bytes(pickle.dumps({"data": data, "labels": [0] * 20}))
    assert batch_rows(read_batch(tmp_path / "b", "CIFAR-10"), tmp_path / "b", "CIFAR-10")[0].shape == (20, 3072)
    monkeypatch.setattr(cifar_files, "MAX_BATCH_BYTES", 10_000)
    with pytest.raises(ValueError, match=r"^CIFAR-10 file .*/b could not be read \(it is over 10,000 bytes, larger "
                                         r"than any CIFAR batch\); delete it"):
        read_batch(tmp_path / "b", "CIFAR-10")


def test_a_feature_sets_rows_file_is_read_only_up_to_what_its_rows_take(tmp_path):
    from sqlalchemy import select

    from storage import (
        FeatureSet,
        add_model_version,
        create_experiment,
        get_engine,
        init_db,
        load_feature_set,
        save_feature_set,
        session_scope,
    )

    url = f"sqlite:///{tmp_path / 'compatlab.db'}"
    engine = get_engine(url)
    init_db(engine)
    with session_scope(engine) as s:
        exp = create_experiment(s, name="e", method="bct", config={}, config_hash="h").id
        version = add_model_version(s, exp, 1, architecture="a", method="bct", classes=[0], num_outputs=1,
                                    feature_dim=3).id
        save_feature_set(s, version, "gallery", "encoder", np.ones((6, 3), np.float32), np.arange(6), np.arange(6))
    with session_scope(engine) as s:
        key, layout = s.execute(select(FeatureSet.store_key, FeatureSet.store_layout)).one()
        assert load_feature_set(s, version, "gallery", "encoder")[1].tolist() == list(range(6))
    rows = tmp_path / "features" / key / layout.get("rows_file", "rows.parquet")
    assert rows.is_file()
    os.truncate(rows, 8_000_000_000)  # sparse: 8 GB that a reader would pull into memory
    got = measure(f"from storage import get_engine, load_feature_set, session_scope\nengine = get_engine({url!r})",
                  f"load_feature_set(session_scope(engine).__enter__(), {version}, 'gallery', 'encoder') and None",
                  headroom=HEADROOM)
    assert got["error"] is not None and got["error"].startswith("ValueError: feature rows ") and \
        "are larger than the 1,000,288 bytes 6 rows can take: the file was changed; it was not read" in got["error"], got
    assert got["grew"] < HEADROOM, got
