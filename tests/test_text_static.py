"""The static text model (engine.models.static_text, engine.models.static_distill): its encoder against a numpy
recomputation from the stored table, the loader's refusals, and all-MiniLM-L6-v2 distilled by model2vec checked
against the teacher run by the engine's own torch BERT (slow: the distillation runs the teacher on 29,524 tokens)."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="pip install -r requirements-text.txt")

from safetensors.numpy import save_file
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from engine.data.text_model_files import TextModelError
from engine.models.static_distill import (
    INSTALL,
    RECIPE,
    STATIC_NAME,
    TEACHER_SHA256,
    cache_folder,
    load_static_model,
    model2vec_missing,
)
from engine.models.static_text import (
    EMBEDDINGS_FILE,
    RECIPE_FILE,
    STATIC_FORMAT,
    TOKENIZER_FILE,
    load_static_folder,
)
from engine.models.text_models import missing_text_models

WORDS = ["[UNK]", "the", "dog", "barks", "at", "a", "cat", "river", "flows", "slowly", "."]
SENTENCES = ["The dog barks at the cat.", "a river flows slowly", "dog", "zebra quokka", "the the the cat", ""]


def write_static(folder, table: np.ndarray, weights: np.ndarray, *, recipe: dict | None = None,
                 tokenizer: Tokenizer | None = None) -> None:
    """A static model folder by hand: a word-level tokenizer over WORDS, the table, the weights and a recipe."""
    folder.mkdir(parents=True, exist_ok=True)
    if tokenizer is None:
        tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.Lowercase()
        tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / TOKENIZER_FILE))
    save_file({"embeddings": np.ascontiguousarray(table), "weights": np.ascontiguousarray(weights)},
              str(folder / EMBEDDINGS_FILE))
    (folder / RECIPE_FILE).write_text(json.dumps(recipe or {"format": STATIC_FORMAT, "recipe": RECIPE,
                                                            "teacher_sha256": TEACHER_SHA256}))


def numpy_embeddings(folder, texts: list[str]) -> np.ndarray:
    """The static embedding by hand: ids from tokenizer.json (no special tokens, unknowns dropped), the mean of
    table[id] * weight[id] in float64, divided by its norm (zeros stay zeros)."""
    from safetensors.numpy import load_file

    tensors = load_file(str(folder / EMBEDDINGS_FILE))
    table, weights = tensors["embeddings"].astype(np.float64), tensors["weights"].astype(np.float64)
    tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    tokenizer.no_padding()
    unk = tokenizer.token_to_id("[UNK]")
    out = np.zeros((len(texts), table.shape[1]))
    for row, text in enumerate(texts):
        ids = [i for i in tokenizer.encode(text, add_special_tokens=False).ids if i != unk]
        if ids:
            mean = (table[ids] * weights[ids, None]).mean(axis=0)
            out[row] = mean / np.linalg.norm(mean)
    return out


@pytest.fixture
def tiny(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "tiny"
    write_static(folder, rng.normal(size=(len(WORDS), 8)).astype(np.float16),
                 rng.uniform(0.1, 1.0, len(WORDS)).astype(np.float32))
    return folder


def test_static_encoder_is_the_normalised_mean_of_weighted_rows(tiny):
    encoder = load_static_folder(tiny)
    got = encoder.encode(SENTENCES, batch_size=2)
    assert got.shape == (len(SENTENCES), 8) and got.dtype == np.float32
    assert np.allclose(got, numpy_embeddings(tiny, SENTENCES), atol=1e-6)
    assert not got[3].any() and not got[5].any()  # only unknown words, or nothing: zeros, as model2vec gives
    assert np.allclose(encoder.encode(SENTENCES[::-1]), got[::-1], atol=1e-7)  # one text's vector: not its batch's


def one_line_refusal(folder, match: str, **kwargs) -> None:
    with pytest.raises(TextModelError, match=match) as info:
        load_static_folder(folder, **kwargs)
    assert "\n" not in str(info.value)


def test_loader_refuses_oversize_malformed_and_mismatched_files(tiny, tmp_path):
    size = (tiny / EMBEDDINGS_FILE).stat().st_size
    one_line_refusal(tiny, "exceeds the limit", max_bytes=size - 1)
    load_static_folder(tiny, max_bytes=size)  # the limit itself is allowed
    rng = np.random.default_rng(1)
    cases = {
        "garbage": ("not a safetensors file", None),
        "keys": ("holds \\['embeddings'\\]", {"embeddings": np.zeros((len(WORDS), 8), np.float16)}),
        "rows": ("do not match the tokenizer's 11 tokens",
                 {"embeddings": np.zeros((len(WORDS) + 1, 8), np.float16), "weights": np.ones(len(WORDS) + 1, np.float32)}),
        "ints": ("expected float16/float32", {"embeddings": np.zeros((len(WORDS), 8), np.int8),
                                               "weights": np.ones(len(WORDS), np.float32)}),
        "nan": ("NaN or infinite", {"embeddings": np.full((len(WORDS), 8), np.nan, np.float32),
                                    "weights": np.ones(len(WORDS), np.float32)}),
    }
    for name, (match, tensors) in cases.items():
        folder = tmp_path / name
        write_static(folder, rng.normal(size=(len(WORDS), 8)).astype(np.float16), np.ones(len(WORDS), np.float32))
        if tensors is None:
            (folder / EMBEDDINGS_FILE).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
        else:
            save_file(tensors, str(folder / EMBEDDINGS_FILE))
        one_line_refusal(folder, match)
    (tiny / TOKENIZER_FILE).write_text("{}")
    one_line_refusal(tiny, "not a tokenizers file")
    (tiny / RECIPE_FILE).write_text(json.dumps({"format": "something else"}))
    one_line_refusal(tiny, "not a static text model's recipe")
    (tiny / RECIPE_FILE).unlink()
    one_line_refusal(tiny, "not a file")


def test_a_cached_model_of_another_recipe_is_refused_and_model2vec_is_asked_for_when_absent(tmp_path, monkeypatch):
    target = cache_folder(root=tmp_path)
    write_static(target, np.ones((len(WORDS), 4), np.float16), np.ones(len(WORDS), np.float32),
                 recipe={"format": STATIC_FORMAT, "recipe": {**RECIPE, "pca_dims": 256}, "teacher_sha256": TEACHER_SHA256})
    with pytest.raises(TextModelError, match="another recipe"):
        load_static_model(root=tmp_path)
    empty = tmp_path / "empty"
    monkeypatch.setitem(sys.modules, "model2vec", None)  # import model2vec now raises ImportError
    assert INSTALL in model2vec_missing()
    with pytest.raises(TextModelError, match="requirements-text-static.txt"):
        load_static_model(root=empty)
    assert not empty.exists()  # nothing half-written


# --- the real distillation -------------------------------------------------------------------------------

MISSING = missing_text_models(("minilm_l6",))
needs_wheel = pytest.mark.skipif(bool(MISSING), reason=f"the offline text models are not installed: {'; '.join(MISSING)}")
needs_model2vec = pytest.mark.skipif(model2vec_missing() is not None, reason=str(model2vec_missing()))


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """all-MiniLM-L6-v2 distilled once for this module, under a temporary data root (``<tmp>/data``)."""
    root = tmp_path_factory.mktemp("static") / "data"
    load_static_model(root=root)
    return root


@pytest.mark.slow
@needs_wheel
@needs_model2vec
def test_distilled_rows_are_the_teachers_token_outputs_up_to_a_rigid_motion(distilled):
    """PCA keeping all 384 dimensions centres and rotates: the distances between tokens' rows equal the distances
    between the teacher's mean-pooled outputs for [CLS] token [SEP], run here by the engine's own torch BERT."""
    import torch
    from safetensors.numpy import load_file

    from engine.data.text_model_files import minilm_l6_folder
    from engine.models.text_encoder import load_bert_folder

    folder = cache_folder(root=distilled)
    recipe = json.loads((folder / RECIPE_FILE).read_text())
    assert recipe["recipe"] == RECIPE and recipe["teacher_sha256"] == TEACHER_SHA256 and recipe["dim"] == 384
    static = load_static_folder(folder)
    teacher = load_bert_folder(minilm_l6_folder(), device=torch.device("cpu"))
    words = ["dog", "cat", "river", "music", "happy", "car", "bank", "run", "green", "seven"]
    static_ids = [static.token_ids([w])[0] for w in words]
    assert all(len(i) == 1 for i in static_ids)  # single-token words in both vocabularies
    ids = [int(i[0]) for i in static_ids]
    rows = load_file(str(folder / EMBEDDINGS_FILE))["embeddings"][ids].astype(np.float64)  # before the SIF weights
    batch = teacher.tokenizer(words)
    assert (batch["input_ids"].shape[1] == 3) and (batch["input_ids"][:, 0] == 101).all()  # [CLS] word [SEP]
    states, _ = teacher.states(batch)
    outputs = states.mean(axis=1)  # model2vec pools over all three tokens
    d_static = np.linalg.norm(rows[:, None] - rows[None], axis=2)
    d_teacher = np.linalg.norm(outputs[:, None] - outputs[None], axis=2)
    # distances of 5.5 to 9.4 agree to 4e-4 here (a float16 table); one token's row off by one misses by ~3
    assert np.abs(d_static - d_teacher).max() < 1e-3 * d_teacher.max()


@pytest.mark.slow
@needs_wheel
@needs_model2vec
def test_distilled_encoder_equals_numpy_and_model2vec(distilled):
    from model2vec import StaticModel
    from safetensors.numpy import load_file

    folder = cache_folder(root=distilled)
    texts = ["A man is eating food.", "breathe with great difficulty, as when experiencing a strong emotion",
             "dog", "Xylophones!!! and ünïcödé", "the the the"]
    got = load_static_folder(folder).encode(texts)
    assert np.allclose(got, numpy_embeddings(folder, texts), atol=1e-5)
    tensors = load_file(str(folder / EMBEDDINGS_FILE))
    reference = StaticModel(tensors["embeddings"], Tokenizer.from_file(str(folder / TOKENIZER_FILE)),
                            weights=tensors["weights"], normalize=True).encode(texts)
    assert np.allclose(got, reference, atol=1e-5)


@pytest.mark.slow
@needs_wheel
@needs_model2vec
def test_the_static_model_runs_in_a_text_comparison(distilled, monkeypatch):
    from engine.checkpoints.compare import compare_checkpoints
    from engine.data.wordnet import WORDNET_ROOT

    if not (WORDNET_ROOT / "data.noun").is_file():
        pytest.skip("WordNet's files are absent: apt-get install wordnet-base")
    monkeypatch.chdir(distilled.parent)  # ./data is the first data root: the cache distilled above
    cmp = compare_checkpoints({"models": [{"path": "pretrained:minilm_l6"}, {"path": f"pretrained:{STATIC_NAME}"}],
                               "dataset": "wordnet:queries=40,gallery=120,seed=1", "views": ["encoder"],
                               "metrics": ["recall@1"]})
    assert cmp.labels == ["minilm_l6", STATIC_NAME]
    ql, gl = cmp.split_labels["query"], cmp.split_labels["gallery"]
    matrix = cmp.results["encoder"].values["recall@1"]
    for t in range(2):
        for k in range(t + 1):
            q, g = cmp.outputs[t]["query"]["encoder"], cmp.outputs[k]["gallery"]["encoder"]
            expected = float(np.mean(gl[np.argmax(q @ g.T, axis=1)] == ql))
            assert matrix[t, k] == pytest.approx(expected, abs=1e-9)
    assert cmp.models[1].sha256 == load_static_folder(cache_folder(root=distilled)).sha256
