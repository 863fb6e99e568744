"""A BERT encoder written out in torch (embeddings, N layers of self-attention + GELU feed-forward, post-LayerNorm),
reading a Hugging Face ``BertModel``'s ``config.json`` and ``model.safetensors`` without ``transformers``."""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from engine.data.text_model_files import TextModelError

_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size")


@dataclass(frozen=True)
class BertConfig:
    """The sizes of a BERT encoder (a ``config.json``'s fields of the same names)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_json(cls, text: str | bytes, *, what: str = "config.json") -> "BertConfig":
        """Read a BERT ``config.json``; :class:`TextModelError` when it is not a BERT with GELU and absolute positions."""
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise TextModelError(f"{what} is not JSON ({exc})") from None
        if not isinstance(raw, Mapping):
            raise TextModelError(f"{what} is not a JSON object")
        missing = [k for k in _CONFIG_KEYS if not isinstance(raw.get(k), int) or raw[k] < 1]
        if missing:
            raise TextModelError(f"{what} lacks positive integer(s) {', '.join(missing)} of a BERT config")
        if raw.get("hidden_act", "gelu") != "gelu" or raw.get("position_embedding_type", "absolute") != "absolute":
            raise TextModelError(f"{what}: only BERT with hidden_act 'gelu' and absolute positions is supported, got "
                                 f"{raw.get('hidden_act')!r} / {raw.get('position_embedding_type')!r}")
        if raw["hidden_size"] % raw["num_attention_heads"]:
            raise TextModelError(f"{what}: hidden_size {raw['hidden_size']} is not a multiple of "
                                 f"num_attention_heads {raw['num_attention_heads']}")
        return cls(**{k: raw[k] for k in _CONFIG_KEYS}, layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)))

    def parameters(self) -> int:
        """The encoder's parameter count from the sizes alone (embeddings, per layer attention, feed-forward and two
        LayerNorms), known before anything is allocated."""
        h, i = self.hidden_size, self.intermediate_size
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h
        layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
        return embeddings + self.num_hidden_layers * layer


class BertLayer(nn.Module):
    """Self-attention and a GELU feed-forward, each followed by a residual LayerNorm (BERT's post-norm)."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.heads = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.attention_out = nn.Linear(c.hidden_size, c.hidden_size)
        self.attention_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.intermediate = nn.Linear(c.hidden_size, c.intermediate_size)
        self.output = nn.Linear(c.intermediate_size, c.hidden_size)
        self.output_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``x`` (B, L, H); ``bias`` (B, 1, 1, L): 0 for tokens, the dtype's minimum for padding."""
        b, n, h = x.shape
        split = lambda t: t.view(b, n, self.heads, h // self.heads).transpose(1, 2)  # noqa: E731 (B, heads, L, d)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(h // self.heads) + bias
        context = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, h)
        x = self.attention_norm(x + self.attention_out(context))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))  # exact (erf) GELU, as BERT's "gelu"


class BertEncoder(nn.Module):
    """Token ids -> the last hidden state (B, L, hidden_size)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.embedding_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The last hidden state of a padded batch (positions 0..L-1; token types 0 unless given)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)[None] + self.token_type_embeddings(types)
        x = self.embedding_norm(x)
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, bias)
        return x


# Hugging Face BertModel names -> this module's names ({i}: the layer)
_LAYER_NAMES = {
    "attention.self.query": "query", "attention.self.key": "key", "attention.self.value": "value",
    "attention.output.dense": "attention_out", "attention.output.LayerNorm": "attention_norm",
    "intermediate.dense": "intermediate", "output.dense": "output", "output.LayerNorm": "output_norm",
}
_EMBEDDING_NAMES = {"embeddings.word_embeddings": "word_embeddings", "embeddings.position_embeddings": "position_embeddings",
                    "embeddings.token_type_embeddings": "token_type_embeddings", "embeddings.LayerNorm": "embedding_norm"}
_IGNORED = ("pooler.", "embeddings.position_ids")  # BertModel's pooler (unused by sentence embeddings), a buffer


def bert_state_dict(tensors: Mapping[str, torch.Tensor], *, what: str = "model.safetensors") -> dict[str, torch.Tensor]:
    """A ``BertModel`` state dict (optionally under ``bert.``) renamed for :class:`BertEncoder`; pooler dropped."""
    out = {}
    for name, tensor in tensors.items():
        key = name.removeprefix("bert.")
        if key.startswith(_IGNORED):
            continue
        stem, _, leaf = key.rpartition(".")
        if stem in _EMBEDDING_NAMES:
            out[f"{_EMBEDDING_NAMES[stem]}.{leaf}"] = tensor
            continue
        parts = stem.split(".", 3)
        if len(parts) == 4 and parts[:2] == ["encoder", "layer"] and parts[2].isdigit() and parts[3] in _LAYER_NAMES:
            out[f"layers.{parts[2]}.{_LAYER_NAMES[parts[3]]}.{leaf}"] = tensor
            continue
        raise TextModelError(f"{what}: tensor {name!r} is not part of a BERT encoder")
    return out


def load_bert(config: BertConfig, tensors: Mapping[str, torch.Tensor], *, what: str = "model.safetensors") -> BertEncoder:
    """A :class:`BertEncoder` holding ``tensors`` (every weight present, every shape as the config says), in eval mode."""
    model = BertEncoder(config)
    state = bert_state_dict(tensors, what=what)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise TextModelError(f"{what} lacks {len(missing)} tensor(s) of a {config.num_hidden_layers}-layer BERT "
                             f"(first: {missing[0]}); does config.json match the weights?")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise TextModelError(f"{what} has tensors beyond config.json's {config.num_hidden_layers} layers (first: {extra[0]})")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise TextModelError(f"{what}: {name} has shape {tuple(tensor.shape)}, config.json implies "
                                 f"{tuple(expected[name].shape)}")
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.eval()
