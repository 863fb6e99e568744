"""Builders shared by the checkpoint tests: real small checkpoints and a tiny ImageFolder of PNGs.

Imported by ``test_checkpoints_loading.py`` and ``test_checkpoints_compare.py``; the one test here
checks that the image folder is what the others assume.
"""
from __future__ import annotations



from engine.data.disk import load_imagefolder
from support.checkpoints_factory import write_image_folder























def test_image_folder_has_the_classes_and_sizes_the_tests_assume(tmp_path):
    images = load_imagefolder(write_image_folder(tmp_path / "imgs", classes=3, per_class=2), image_size=16)
    assert images.class_names == ("class_0", "class_1", "class_2")
    assert tuple(images.images.shape) == (6, 3, 16, 16)
