"""A damaged or tampered image reference is one line, never an IndexError, a KeyError or a render of billions of
images (issue 39, regressions of earlier findings)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.data.thumbnails import check_reference, thumbnails


@pytest.mark.parametrize("source, ids, message", [
    ({"dataset": "digits"}, [5000], "the digits hold images 0..1796, not 5000"),
    ({"dataset": "digits"}, [-3], "image ids must be >= 0"),
    ({"dataset": "shapes", "per_class": 10 ** 9, "first_class": 0, "split": "train", "seed": 0}, [5],
     "per_class must be 1..100,000"),
    ({"dataset": "shapes", "per_class": "many", "first_class": 0, "split": "train", "seed": 0}, [5],
     "must be integers >= 0"),
    ({"dataset": "shapes", "per_class": 10}, [1], "lacks first_class, split, seed"),
    ({"root": "/data", "files": ["a.png"]}, [3], "lists 1 files, not an image 3"),
    ({"root": "/data", "files": {"0": "a.png"}}, [0], "file list is not a list of names"),
    ({"dataset": "fashion", "split": "train"}, [0], "lacks root")])
def test_a_damaged_reference_is_one_line(tmp_path, source, ids, message):
    with pytest.raises(ValueError, match=message) as exc:
        thumbnails(source, np.asarray(ids), cache_dir=tmp_path)
    assert "\n" not in str(exc.value)


def test_a_sound_reference_renders(tmp_path):
    check_reference({"dataset": "digits"}, np.array([0, 1796]))
    (png,) = thumbnails({"dataset": "digits"}, np.array([7]), cache_dir=tmp_path)
    assert png is not None and png.startswith(b"\x89PNG")
