"""The text-embedding cache cannot lie (issue 44): a changed config.json is another key, and a cached file whose
bytes changed since it was written (its rows reordered, still a valid float32 array) is computed again."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="pip install -r requirements-text.txt")
from support.text_encoders import write_tiny_folder

from engine.checkpoints.text_cache import (TextEmbeddingCache, cached_encode, embedding_key,
                                           encoder_identity)
from engine.data.text_model_files import ModelFolder
from engine.models.text_encoder import load_bert_folder

TEXTS = ["the cat sat on the mat", "dog", "the dog sat"]


@pytest.mark.parametrize("change", [{"layer_norm_eps": 0.5}, {"num_attention_heads": 1}])
def test_the_same_weights_under_another_config_are_another_key(tmp_path, change):
    write_tiny_folder(tmp_path / "m")
    first = load_bert_folder(ModelFolder(tmp_path / "m"))
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, **change}))
    second = load_bert_folder(ModelFolder(tmp_path / "m"))
    assert first.sha256 == second.sha256  # the weights' bytes did not change
    a, b = (encoder_identity(e, batch_size=8) for e in (first, second))
    assert embedding_key(a, TEXTS) != embedding_key(b, TEXTS)
    cache = TextEmbeddingCache()
    cached_encode(first, TEXTS, cache=cache, batch_size=8)
    got, hit = cached_encode(second, TEXTS, cache=cache, batch_size=8)
    assert not hit and np.allclose(got, second.encode(TEXTS), atol=1e-6)


def test_a_cached_file_whose_rows_were_reordered_is_computed_again(tmp_path):
    write_tiny_folder(tmp_path / "m")
    encoder = load_bert_folder(ModelFolder(tmp_path / "m"))
    cache = TextEmbeddingCache()
    fresh, hit = cached_encode(encoder, TEXTS, cache=cache, batch_size=8)
    assert not hit
    path = cache.path(embedding_key(encoder_identity(encoder, batch_size=8), TEXTS))
    np.save(path, fresh[::-1].copy())  # a valid float32 (3, 8) array, finite: only the checksum tells
    got, hit = cached_encode(encoder, TEXTS, cache=cache, batch_size=8)
    assert not hit and np.allclose(got, fresh, atol=1e-6)
    again, hit = cached_encode(encoder, TEXTS, cache=cache, batch_size=8)
    assert hit and np.array_equal(again, got)  # written again, with its checksum
