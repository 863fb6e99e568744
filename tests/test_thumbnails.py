"""Sample references and thumbnails: references written by the loaders, the pipeline and the checkpoint comparison;
thumbnails equal to independently decoded and resized images; the disk cache; old databases; the page shows images."""
from __future__ import annotations


import io
import re
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sqlalchemy import select
from streamlit.testing.v1 import AppTest
from support.app_synthetic import fill_study
from support.checkpoints_factory import TinyPair, save_torchscript, write_image_folder

import engine.data.thumbnails as thumbs
from engine.analysis.neighbours import images_note, row_thumbnail_uris, row_thumbnails
from engine.checkpoints.store import run_checkpoint_comparison
from engine.core.config import config_from_dict
from engine.data.disk import load_imagefolder_split
from engine.data.fashion_files import fashion_available
from engine.data.registry import load_dataset
from engine.data.samples import SampleRefs
from engine.results.record import NewVersion, record_version, start_experiment
from engine.run.pipeline import RunContext, run_experiment
from storage import FeatureSet, get_engine, init_db, list_model_versions, load_feature_set, load_image_refs, session_scope
from storage.migrate import add_missing_columns

MAIN = Path(__file__).resolve().parents[1] / "app" / "main.py"


def png_pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


def expected(pixels_01_chw: np.ndarray, size: int = 64) -> np.ndarray:
    """The thumbnail computed independently: [0, 1] CHW floats -> uint8 -> nearest-neighbour enlargement by index."""
    hwc = np.rint(np.asarray(pixels_01_chw, dtype=np.float64) * 255).astype(np.uint8).transpose(1, 2, 0)
    h = hwc.shape[0]
    pick = np.floor((np.arange(size) + 0.5) * h / size).astype(int)  # nearest neighbour: the source pixel under each centre
    out = hwc[pick][:, pick]
    return out[..., 0] if out.shape[-1] == 1 else out


def store(db, refs: dict[str, SampleRefs | None], n: int) -> int:
    """One model version with encoder features of ``n`` rows per split and the given references; its id."""
    init_db(db)
    outputs = {split: {"encoder": np.ones((n, 2), np.float32)} for split in refs}
    labels = {split: np.zeros(n, np.int64) for split in refs}
    with session_scope(db) as s:
        exp = start_experiment(s, name="refs", method="independent", config={"x": 1})
        return record_version(s, exp, 1, NewVersion(architecture="a", method="independent", classes=[0], num_outputs=1,
                                                 feature_dim=2, outputs=outputs, labels=labels, refs=refs))


@pytest.mark.parametrize("name", ["digits", "shapes", "fashion"])
def test_builtin_references_are_stored_and_render_the_loaded_pixels(name, engine, tmp_path):
    if name == "fashion" and not fashion_available():
        pytest.skip("Fashion-MNIST files absent (apt-get install dataset-fashion-mnist)")
    options = {"num_classes": 3, "per_class": 4} if name == "shapes" else {"max_per_class": 3} if name == "digits" else {}
    images = load_dataset(name, split="test", **options)
    chosen = images.select_classes([1, 2]).subset([4, 0, 2])  # a selection keeps the references aligned
    version_id = store(engine, {"gallery": chosen.refs}, len(chosen))
    with session_scope(engine) as s:
        source, ids = load_image_refs(s, version_id, "gallery")
    assert source["dataset"] == name and len(ids) == 3
    pngs = row_thumbnails(engine, version_id, "gallery", [0, 1, 2], cache_dir=tmp_path / "thumbs")
    for png, row in zip(pngs, range(3)):
        np.testing.assert_array_equal(png_pixels(png), expected(chosen.batch([row])[0].numpy()))


def test_cifar_references_render_the_loaded_pixels_and_name_torchvisions_files(engine, tmp_path):
    from torchvision.datasets import CIFAR10, CIFAR100

    from engine.data.cifar_files import FILES

    for name, kind in (("cifar10", CIFAR10), ("cifar100", CIFAR100)):
        assert FILES[name] == (kind.base_folder, {"train": tuple(f for f, _ in kind.train_list),
                                                  "test": tuple(f for f, _ in kind.test_list)})
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for file in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (6, 3072), dtype=np.uint8)
        (folder / file).write_bytes(pickle.dumps({"data": data, "labels": [0, 1, 2, 0, 1, 2]}))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    images = load_dataset("cifar10", root=tmp_path, split="train").subset([29, 3, 14])  # batches 5, 1, 3
    version_id = store(engine, {"gallery": images.refs}, len(images))
    pngs = row_thumbnails(engine, version_id, "gallery", [0, 1, 2], cache_dir=tmp_path / "thumbs")
    for row, png in enumerate(pngs):
        np.testing.assert_array_equal(png_pixels(png), expected(images.batch([row])[0].numpy()))


def test_image_folder_references_render_the_file_cropped_and_reduced(engine, tmp_path):
    root = write_image_folder(tmp_path / "imgs", classes=2, per_class=4, size=24)
    wide = Image.fromarray(np.random.default_rng(1).integers(0, 255, (100, 160, 3), dtype=np.uint8))
    wide.save(root / "class_1" / "9.png")
    images = load_imagefolder_split(root=root, split="test", image_size=16)
    version_id = store(engine, {"query": images.refs}, len(images))
    with session_scope(engine) as s:
        source, ids = load_image_refs(s, version_id, "query")
    assert len(source["files"]) == len(images) and ids.tolist() == list(range(len(images)))
    row = source["files"].index("class_1/9.png")
    png = row_thumbnails(engine, version_id, "query", [row], cache_dir=tmp_path / "t", size=50)[0]
    # independently: centre square 100x100 of the 160-wide image, then Lanczos to 50x50
    want = np.asarray(wide.crop((30, 0, 130, 100)).resize((50, 50), Image.Resampling.LANCZOS))
    np.testing.assert_array_equal(png_pixels(png), want)
    (root / "class_1" / "9.png").unlink()  # a moved file: no image, no error (it was cached: use another size)
    assert row_thumbnails(engine, version_id, "query", [row], cache_dir=tmp_path / "t", size=40) == [None]


def test_a_cache_hit_decodes_nothing(monkeypatch, tmp_path):
    calls = []
    real = thumbs.DECODERS["digits"]
    monkeypatch.setitem(thumbs.DECODERS, "digits", lambda source, ids: calls.append(list(ids)) or real(source, ids))
    source = {"dataset": "digits"}
    first = thumbs.thumbnails(source, [5, 7], cache_dir=tmp_path)
    again = thumbs.thumbnails(source, [7, 5, 9], cache_dir=tmp_path)
    assert calls == [[5, 7], [9]]  # the second call decodes only the item not yet cached
    assert again[:2] == first[::-1] and again[2] is not None


def test_pipeline_and_checkpoint_comparison_write_references(tmp_path):
    cfg = config_from_dict({"dataset": {"name": "digits", "max_per_class": 5}, "methods": ["independent"],
                            "scenario": {"initial_classes": 5, "increment": 5, "num_steps": 2},
                            "model": {"backbone": "small_cnn", "width": 4}, "training": {"epochs": 1, "batch_size": 64}})
    ctx = RunContext(get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), tmp_path / "ckpt")
    exp_id = run_experiment(cfg, ctx)
    with session_scope(ctx.db) as s:
        version = list_model_versions(s, exp_id)[-1]
        source, ids = load_image_refs(s, version.id, "gallery")
        labels = load_feature_set(s, version.id, "gallery", "encoder")[1]  # from the feature store
    assert source == {"dataset": "digits"}
    # the references point at images of the stored classes: digit = class name at the stored label's position
    from sklearn.datasets import load_digits

    names = version.class_names
    assert [str(d) for d in load_digits().target[ids]] == [names[label] for label in labels]

    root = write_image_folder(tmp_path / "imgs", classes=3, per_class=3)
    save_torchscript(tmp_path / "a.pt", TinyPair(num_classes=3))
    save_torchscript(tmp_path / "b.pt", TinyPair(num_classes=3, seed=1))
    spec = {"models": [{"path": str(tmp_path / "a.pt")}, {"path": str(tmp_path / "b.pt")}],
            "dataset": f"imagefolder:{root}", "views": ["encoder"], "metrics": ["recall@1"]}
    exp_id = run_checkpoint_comparison(ctx.db, spec)
    with session_scope(ctx.db) as s:
        source, ids = load_image_refs(s, list_model_versions(s, exp_id)[0].id, "query")
    assert source["files"][int(ids[4])] == "class_1/1.png"


def test_an_old_database_gains_the_column_and_says_why_it_has_no_images(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    db = get_engine(f"sqlite:///{path}")
    version_id = store(db, {"query": None}, 3)  # written without references
    db.dispose()
    with sqlite3.connect(path) as con:
        con.execute("ALTER TABLE feature_sets DROP COLUMN image_source")
    db = get_engine(f"sqlite:///{path}")
    assert add_missing_columns(db) == ["feature_sets.image_source"]
    assert row_thumbnail_uris(db, version_id, "query", [0, 2], cache_dir=tmp_path / "t") == [None, None]
    assert "stored before sample references existed" in images_note(db, version_id, "query")


def test_the_renderer_and_the_analysis_functions_load_no_torch():
    import subprocess

    code = ("import sys, engine.analysis.neighbours, engine.data.thumbnails, engine.data.samples; "
            "print(sorted(m for m in ('torch', 'torchvision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]"


def test_geometry_page_shows_the_query_and_both_galleries_with_images(app_db):
    fill_study(app_db, steps=3, analyses=False)
    with session_scope(get_engine(app_db)) as s:  # give every stored row a digits image
        for fs in s.scalars(select(FeatureSet)):
            fs.image_source, fs.image_ids = {"dataset": "digits"}, np.arange(fs.count, dtype=np.int64)
    at = AppTest.from_file(str(MAIN), default_timeout=120).run()
    at.switch_page("app_pages/geometry.py").run()
    at.session_state["geometry_query"] = 37  # what a click on the map sets
    at.run()
    assert not at.exception
    assert at.selectbox(key="nn_sample").value == 37
    images = [e.proto for e in at.get("image")]
    assert [len(p.imgs) for p in images] == [1, 5, 5]  # the query, then 5 neighbours per gallery
    captions = [i.caption for p in images[1:] for i in p.imgs]
    assert all(c.startswith(("✓ hit", "✗ miss")) and " · d=" in c for c in captions)
    shown = re.sub(r"\\(.)", r"\1", " ".join(str(e.value) for e in at.markdown))  # as rendered: plain() escapes
    assert "old gallery (step 2)" in shown and "new gallery (step 3)" in shown
    assert (Path(app_db.removeprefix("sqlite:///")).parent / "thumbnails").is_dir()  # cached beside the database
