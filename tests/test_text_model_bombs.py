"""Text encoders are refused before they allocate (issue 39, "allocation bombs"): a config.json declaring far more
parameters than model.safetensors holds, a zip member inflating past 100x, a tokenizer adding millions of tokens."""
from __future__ import annotations

import json
import zipfile

import pytest

from engine.data.text_model_files import ModelFolder
from engine.models.bert import BertConfig
from engine.models.text_encoder import TextModelError, TextTokenizer, load_bert_folder

CONFIG = {"vocab_size": 100, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
          "intermediate_size": 16, "max_position_embeddings": 32, "type_vocab_size": 2}


def test_the_parameter_count_is_the_built_encoder_s():
    """By hand (embeddings 134 x 8 + LayerNorm 16 = 1,088; a layer 4 x 72 + 16 + 144 + 136 + 16 = 600) and as the
    torch module built from the same config counts them."""
    from engine.models.bert import BertEncoder

    for layers in (1, 3):
        c = BertConfig(**{**CONFIG, "num_hidden_layers": layers})
        assert c.parameters() == 1088 + 600 * layers == sum(p.numel() for p in BertEncoder(c).parameters())


@pytest.mark.parametrize("change", [{"intermediate_size": 10**6}, {"num_hidden_layers": 4000}])
def test_a_config_declaring_more_than_the_weights_hold_is_refused_before_allocating(tmp_path, change):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**CONFIG, **change}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)
    with pytest.raises(TextModelError, match=r"config.json declares [\d,]+ parameters, but model.safetensors holds 4,096 "
                                             r"bytes"):
        load_bert_folder(ModelFolder(folder))


def test_a_zip_member_inflating_past_100x_is_refused(tmp_path):
    path = tmp_path / "m.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("model.safetensors", b"\0" * (64 << 20))  # 64 MiB of zeros deflate about 1,000x
    with pytest.raises(TextModelError, match=r"declares 67,108,864 bytes from [\d,]+ compressed \(more than 100x"):
        ModelFolder(path).read("model.safetensors")


def test_a_tokenizer_adding_millions_of_tokens_is_refused_before_the_library_builds_it():
    entry = '{"id":%d,"content":"t%d","single_word":false,"lstrip":false,"rstrip":false,"normalized":true,"special":false}'
    data = ('{"added_tokens":[' + ",".join(entry % (i, i) for i in range(100_001)) + "]}").encode()
    with pytest.raises(TextModelError, match="adds 100,001 tokens, more than 100,000"):
        TextTokenizer(data)
