"""``bench/bench_remedies.py``'s feature folders: the check-upgrade input is the embeddings, split as documented."""
from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench() -> dict:
    return runpy.run_path(str(ROOT / "bench" / "bench_remedies.py"))


def _text(out: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    arrays = {}
    for tag in ("old", "new"):
        for part, n in (("queries", 3), ("gallery", 5)):
            v = rng.normal(size=(n, 4)).astype(np.float32)
            labels = np.array([4, 0, 2]) if part == "queries" else np.arange(5)
            np.savez(out / f"text_{part}_{tag}.npz", ids=np.array([f"{i:08d}-n" for i in range(n)]), vectors=v, labels=labels)
            arrays[f"{part}_{tag}"] = v
    return arrays


def test_text_and_image_folders_hold_the_embeddings_split_by_the_seed(bench, tmp_path):
    text = _text(tmp_path)
    n = 1010
    old = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    new = -old
    labels = np.arange(n) % 7
    np.savez(tmp_path / "o.npz", ids=np.arange(n), vectors=old, labels=labels)
    np.savez(tmp_path / "n.npz", ids=np.arange(n), vectors=new, labels=labels)
    assert bench["write_features"](tmp_path, tmp_path / "o.npz", tmp_path / "n.npz", 5) == ["text", "image"]

    s1, s2 = np.load(tmp_path / "features_text" / "step_1.npz"), np.load(tmp_path / "features_text" / "step_2.npz")
    assert np.array_equal(s1["query_features"], text["queries_old"]) and np.array_equal(s2["gallery_features"], text["gallery_new"])
    assert s1["query_labels"].tolist() == [4, 0, 2] and s2["gallery_labels"].tolist() == [0, 1, 2, 3, 4]

    order = np.random.default_rng(5).permutation(n)
    i1, i2 = np.load(tmp_path / "features_image" / "step_1.npz"), np.load(tmp_path / "features_image" / "step_2.npz")
    assert np.array_equal(i1["query_features"][:, 0] / 2, order[:1000])  # row r of `old` starts with 2r
    assert np.array_equal(i1["gallery_features"][:, 0] / 2, np.sort(order[1000:]))
    assert np.array_equal(i2["query_features"], -i1["query_features"]) and np.array_equal(i2["gallery_labels"], i1["gallery_labels"])
    assert np.array_equal(i1["gallery_labels"], np.sort(order[1000:]) % 7)


def test_image_files_with_other_ids_are_refused(bench, tmp_path):
    _text(tmp_path)
    np.savez(tmp_path / "o.npz", ids=np.arange(1001), vectors=np.zeros((1001, 2), np.float32), labels=np.zeros(1001))
    np.savez(tmp_path / "n.npz", ids=np.arange(1001)[::-1], vectors=np.zeros((1001, 2), np.float32), labels=np.zeros(1001))
    with pytest.raises(SystemExit, match="different ids"):
        bench["write_features"](tmp_path, tmp_path / "o.npz", tmp_path / "n.npz", 0)
    assert not (tmp_path / "features_image").exists()
