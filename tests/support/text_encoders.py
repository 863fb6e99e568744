"""Shared by several test modules; moved from tests/test_text_encoders.py."""
import json

import torch
from safetensors.torch import save as save_safetensors
from tokenizers import Tokenizer, models, pre_tokenizers

from engine.models.bert import BertConfig, BertEncoder

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", "dog"]


def tiny_tokenizer_json(words=WORDS) -> str:
    from tokenizers.processors import TemplateProcessing

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok.to_str()


def hf_names(net: BertEncoder) -> dict[str, torch.Tensor]:
    """The tiny net's weights under Hugging Face BertModel names (what a safetensors file holds)."""
    inverse = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
               "attention_out": "attention.output.dense", "attention_norm": "attention.output.LayerNorm",
               "intermediate": "intermediate.dense", "output": "output.dense", "output_norm": "output.LayerNorm"}
    emb = {"word_embeddings": "word_embeddings", "position_embeddings": "position_embeddings",
           "token_type_embeddings": "token_type_embeddings", "embedding_norm": "LayerNorm"}
    out = {}
    for name, t in net.state_dict().items():
        parts = name.split(".")
        if parts[0] == "layers":
            out[f"encoder.layer.{parts[1]}.{inverse[parts[2]]}.{parts[3]}"] = t.clone()
        else:
            out[f"embeddings.{emb[parts[0]]}.{parts[1]}"] = t.clone()
    return out


def write_tiny_folder(folder, *, pooling="mean", normalize=True, vocab=len(WORDS)):
    config = {"vocab_size": vocab, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 16, "max_position_embeddings": 16, "type_vocab_size": 2, "hidden_act": "gelu",
              "layer_norm_eps": 1e-12}
    torch.manual_seed(0)
    net = BertEncoder(BertConfig.from_json(json.dumps(config)))
    files = {"config.json": json.dumps(config), "tokenizer.json": tiny_tokenizer_json(),
             "modules.json": json.dumps([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                                         {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
                                        + ([{"idx": 2, "name": "2", "path": "2_Normalize",
                                             "type": "sentence_transformers.models.Normalize"}] if normalize else [])),
             "1_Pooling/config.json": json.dumps({"pooling_mode_mean_tokens": pooling == "mean",
                                                  "pooling_mode_cls_token": pooling == "cls"})}
    folder.mkdir()
    (folder / "1_Pooling").mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "model.safetensors").write_bytes(save_safetensors(hf_names(net)))
    return net

