"""The text embedding cache (engine.checkpoints.text_cache): a second comparison with the same model and corpus embeds
nothing (encoder calls counted by a spy) and gives the same matrices; a changed text list, another encoder or a corrupt
file misses; the files stay inside the first data root."""
from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="pip install -r requirements-text.txt")
pytest.importorskip("tokenizers", reason="pip install -r requirements-text.txt")

import engine.checkpoints.text_compare as text_compare
from engine.checkpoints.compare import compare_checkpoints
from engine.checkpoints.request import comparison_spec
from engine.checkpoints.text_cache import (
    TextEmbeddingCache,
    cached_encode,
    default_folder,
    embedding_key,
    encoder_identity,
    texts_digest,
)
from engine.cli import main
from engine.data.roots import OutsideRootsError, data_roots
from engine.data.wordnet import WORDNET_ROOT
from engine.models.text_models import load_text_model, missing_text_models

MISSING = missing_text_models(("minilm_l3", "minilm_l6_int8"))
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"the offline text models are not installed: {'; '.join(MISSING)}")
needs_wordnet = pytest.mark.skipif(not (WORDNET_ROOT / "data.noun").is_file(),
                                   reason="WordNet's files are absent: apt-get install wordnet-base")
SMALL = "wordnet:queries=30,gallery=90,seed=2"
TEXTS = ["the dog barked all night", "a member of the genus Canis", "breathe with great difficulty"]


@pytest.fixture(autouse=True)
def own_data_folder(tmp_path, monkeypatch):
    """Each test runs in its own folder: ./data, the first data root and so the cache's home, starts empty."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def encode_calls(monkeypatch) -> dict[str, int]:
    """Texts each model is asked to embed (``encode`` wrapped on every encoder the comparison loads)."""
    calls: dict[str, int] = {}
    real = text_compare.load_text_model

    def spied(name, **kwargs):
        encoder = real(name, **kwargs)
        inner = encoder.encode

        def encode(texts, **kw):
            calls[name] = calls.get(name, 0) + len(texts)
            return inner(texts, **kw)

        encoder.encode = encode
        return encoder

    monkeypatch.setattr(text_compare, "load_text_model", spied)
    return calls


def cache_files() -> list:
    return sorted(default_folder().rglob("*.npy"))


@needs_wordnet
def test_a_second_comparison_reads_the_cache_and_gives_the_same_matrices(encode_calls):
    models = [{"path": "pretrained:minilm_l3"}, {"path": "pretrained:minilm_l6_int8"}]
    first = compare_checkpoints({"models": models, "dataset": SMALL, "views": ["encoder"], "metrics": ["recall@1"]})
    assert encode_calls == {"minilm_l3": 120, "minilm_l6_int8": 120}  # 30 queries + 90 definitions each
    assert len(cache_files()) == 4  # (model, split)
    encode_calls.clear()
    messages = []
    again = compare_checkpoints({"models": models, "dataset": SMALL, "views": ["encoder"], "metrics": ["recall@1", "map"]},
                                progress=lambda f, m: messages.append(m))
    assert encode_calls == {}  # another metric: nothing embedded again
    assert sum(m.endswith("texts cached") for m in messages) == 4
    assert "embedding texts with minilm_l3 (1/2): 30 query texts cached" in messages
    assert np.array_equal(first.results["encoder"].values["recall@1"], again.results["encoder"].values["recall@1"],
                          equal_nan=True)
    for a, b in zip(first.outputs, again.outputs):
        assert np.array_equal(a["query"]["encoder"], b["query"]["encoder"])
    more = compare_checkpoints({"models": [*models, {"path": "pretrained:minilm_l3", "label": "l3 again"}],
                                "dataset": SMALL, "views": ["encoder"], "metrics": ["recall@1"]})
    assert encode_calls == {}  # one more model, already embedded under another label
    assert more.results["encoder"].values["recall@1"][2, 0] == first.results["encoder"].values["recall@1"][0, 0]
    other = compare_checkpoints({"models": models[:1], "dataset": SMALL.replace("seed=2", "seed=3"),
                                 "views": ["encoder"], "metrics": ["recall@1"]})
    assert encode_calls == {"minilm_l3": 120} and other.outputs[0]["query"]["encoder"].shape == (30, 384)  # new texts


@needs_wordnet
def test_no_cache_embeds_and_keeps_nothing(encode_calls, capsys):
    spec = {"models": [{"path": "pretrained:minilm_l3"}], "dataset": SMALL, "views": ["encoder"], "metrics": ["recall@1"]}
    compare_checkpoints(spec)
    encode_calls.clear()
    compare_checkpoints({**spec, "text_cache": False})
    assert encode_calls == {"minilm_l3": 120}  # the files are there, but not read
    encode_calls.clear()
    for file in cache_files():
        file.unlink()
    assert main(["compare-checkpoints", "--model", "pretrained:minilm_l3", "--dataset", SMALL, "--view", "encoder",
                 "--metric", "recall@1", "--no-store", "--no-cache"]) == 0
    assert encode_calls == {"minilm_l3": 120} and cache_files() == []
    capsys.readouterr()


def test_the_spec_keeps_text_cache_only_when_turned_off():
    spec = {"models": [{"path": "pretrained:minilm_l3"}], "dataset": SMALL}
    assert "text_cache" not in comparison_spec(spec).to_dict()  # stored configs as they were before the cache
    off = comparison_spec({**spec, "text_cache": False})
    assert off.text_cache is False and comparison_spec(off).text_cache is False and off.to_dict()["text_cache"] is False
    with pytest.raises(ValueError, match="text_cache must be true or false"):
        comparison_spec({**spec, "text_cache": "no"})


def test_key_is_the_encoder_and_the_exact_texts():
    l3 = load_text_model("minilm_l3", device="cpu")
    int8 = load_text_model("minilm_l6_int8", device="cpu")
    ident = encoder_identity(l3, batch_size=64)
    assert ident == encoder_identity(load_text_model("minilm_l3", device="cpu"), batch_size=64)  # a second load
    assert ident["weights_sha256"] == l3.sha256 and ident["max_length"] == 128 and ident["normalize"] is False
    key = embedding_key(ident, TEXTS)
    assert key == embedding_key(dict(ident), list(TEXTS))
    assert key != embedding_key(encoder_identity(int8, batch_size=64), TEXTS)  # another model
    assert key != embedding_key(encoder_identity(l3, batch_size=32), TEXTS)  # another padding per batch
    assert key != embedding_key(ident, TEXTS[:2])  # one text fewer
    assert key != embedding_key(ident, [TEXTS[0] + " ", *TEXTS[1:]])  # one text changed
    assert key != embedding_key(ident, TEXTS[::-1])  # another order
    assert texts_digest(["a b", "c"]) != texts_digest(["a", "b c"])  # the boundaries count, not only the characters


def test_a_corrupt_or_wrong_shaped_file_is_computed_again(tmp_path):
    encoder = load_text_model("minilm_l3", device="cpu")
    cache = TextEmbeddingCache()
    fresh, hit = cached_encode(encoder, TEXTS, cache=cache, batch_size=64)
    assert not hit and fresh.shape == (3, 384) and fresh.dtype == np.float32
    again, hit = cached_encode(encoder, TEXTS, cache=cache, batch_size=64)
    assert hit and np.array_equal(again, fresh)
    path = cache.path(embedding_key(encoder_identity(encoder, batch_size=64), TEXTS))
    outside = tmp_path / "elsewhere.npy"  # a valid file of the right shape, but outside the cache's folder
    np.save(outside, fresh)
    corruptions = [b"not an npy file", path.read_bytes()[:100],  # garbage, truncated
                   _npy(np.zeros((2, 384), np.float32)), _npy(np.zeros((3, 384), np.float64)),  # shape, dtype
                   _npy(np.full((3, 384), np.nan, np.float32)),  # not finite
                   _npy(np.array([{"a": 1}] * 3, dtype=object), allow_pickle=True),  # a pickle inside
                   pickle.dumps(fresh)]
    for bad in [*corruptions, outside]:
        path.unlink()
        if isinstance(bad, Path):
            path.symlink_to(bad)
        else:
            path.write_bytes(bad)
        calls = []
        inner = encoder.encode
        encoder.encode = lambda texts, **kw: calls.append(len(texts)) or inner(texts, **kw)
        out, hit = cached_encode(encoder, TEXTS, cache=cache, batch_size=64)
        encoder.encode = inner
        assert not hit and calls == [3] and np.allclose(out, fresh, atol=1e-6)
        assert np.array_equal(np.load(path, allow_pickle=False), out)  # written again, whole
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_the_cache_stays_inside_the_first_data_root(tmp_path, monkeypatch):
    monkeypatch.delenv("COMPATLAB_TEXT_CACHE")  # conftest points it at the test's folder; here: the default
    root = data_roots()[0]
    assert root == (tmp_path / "data").resolve() and default_folder() == root / "cache" / "text-embeddings"
    cache = TextEmbeddingCache()
    cached_encode(load_text_model("minilm_l3", device="cpu"), TEXTS, cache=cache, batch_size=64)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 1 and files[0].resolve().is_relative_to(root / "cache" / "text-embeddings")
    with pytest.raises(OutsideRootsError, match="outside the data roots"):
        TextEmbeddingCache("/etc")
    (tmp_path / "data" / "link").symlink_to("/etc")
    with pytest.raises(OutsideRootsError):
        TextEmbeddingCache(tmp_path / "data" / "link" / "cache")


def _npy(array: np.ndarray, *, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def test_compatlab_text_cache_names_the_folder_inside_the_data_roots(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPATLAB_TEXT_CACHE", str(tmp_path / "elsewhere"))
    assert default_folder() == tmp_path / "elsewhere"
    assert TextEmbeddingCache().folder.resolve() == (tmp_path / "elsewhere").resolve()
    monkeypatch.setenv("COMPATLAB_TEXT_CACHE", "/etc/cache")
    with pytest.raises(OutsideRootsError, match="outside the data roots"):
        TextEmbeddingCache()


def test_a_static_models_identity_names_its_tokenizer_and_runtime():
    """The static encoder holds a bare tokenizers.Tokenizer and averages rows in numpy: it is cached like the others."""
    from support.text_encoders import WORDS, tiny_tokenizer_json

    from engine.checkpoints.text_cache import encoder_identity
    from engine.models.static_text import StaticTextEncoder

    table = np.arange(len(WORDS) * 4, dtype=np.float32).reshape(len(WORDS), 4)
    encoder = StaticTextEncoder(table, np.ones(len(WORDS), np.float32), tiny_tokenizer_json().encode(), name="tiny")
    encoder.sha256 = "ab" * 32
    identity = encoder_identity(encoder, batch_size=64)
    assert identity["numpy"] == np.__version__ and identity["max_length"] == encoder.max_tokens
    assert identity["class"] == "StaticTextEncoder" and identity["dim"] == 4
    other = StaticTextEncoder(table, np.ones(len(WORDS), np.float32), tiny_tokenizer_json(WORDS[:-1] + ["cow"]).encode(),
                              name="tiny")
    other.sha256 = encoder.sha256
    assert encoder_identity(other, batch_size=64)["tokenizer_sha256"] != identity["tokenizer_sha256"]
