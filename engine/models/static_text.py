"""A static text encoder (a model2vec-style embedding table): a text's embedding is the mean of its tokens' rows,
each row scaled by its token's weight, L2-normalised. Plain numpy and ``tokenizers``; no network runs.

A static model is a folder of three files, all read as data with their sizes checked before reading:
``embeddings.safetensors`` (``embeddings``: (V, D) float16/float32, ``weights``: (V,) float), ``tokenizer.json``
(V tokens, encoded without special tokens, unknown tokens dropped) and ``recipe.json`` (how it was distilled and the
SHA-256 of the teacher's weights). Inference follows ``model2vec.StaticModel.encode``: a text is cut to
``MAX_TOKENS * median token length`` characters, then to :data:`MAX_TOKENS` tokens; a text with no known token
embeds as zeros.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.data.text_model_files import SMALL_FILE_BYTES, TEXT_MAX_BYTES, TextModelError, read_limited
from engine.models.text_encoder import Pooling, TextEncoder

EMBEDDINGS_FILE, TOKENIZER_FILE, RECIPE_FILE = "embeddings.safetensors", "tokenizer.json", "recipe.json"
STATIC_FORMAT = "compatlab-static-text/1"
MAX_TOKENS = 512  # model2vec's StaticModel.encode default (max_length)
TABLE_DTYPES = (np.float16, np.float32)


class StaticTextEncoder(TextEncoder):
    """Embeds texts as the normalised mean of weighted token rows (see the module docstring)."""

    def __init__(self, table: np.ndarray, weights: np.ndarray, tokenizer_json: bytes, *, name: str,
                 max_tokens: int = MAX_TOKENS) -> None:
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - a malformed file: say which
            raise TextModelError(f"{name}: {TOKENIZER_FILE} is not a tokenizers file "
                                 f"({str(exc).splitlines()[0][:120]})") from None
        tokenizer.no_padding()
        tokenizer.no_truncation()
        vocab = tokenizer.get_vocab()
        if table.ndim != 2 or weights.shape != (table.shape[0],) or len(vocab) != table.shape[0]:
            raise TextModelError(f"{name}: the embedding table {tuple(table.shape)} and weights {tuple(weights.shape)} "
                                 f"do not match the tokenizer's {len(vocab)} tokens")
        super().__init__(tokenizer, Pooling("mean", True), name=name, dim=int(table.shape[1]))
        self.rows = np.asarray(table, np.float32) * np.asarray(weights, np.float32)[:, None]  # weighted, as encoded
        unk = getattr(tokenizer.model, "unk_token", None)
        self.unk_id = vocab.get(unk) if unk is not None else None
        tokens = sorted(vocab, key=vocab.__getitem__)
        self.max_tokens = max_tokens
        self.max_chars = max_tokens * int(np.median([len(t) for t in tokens]))

    def token_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's token ids as the static model reads them (no special tokens, no unknowns, truncated)."""
        encoded = self.tokenizer.encode_batch([t[:self.max_chars] for t in texts], add_special_tokens=False)
        out = []
        for e in encoded:
            ids = np.asarray(e.ids, np.int64)
            if self.unk_id is not None:
                ids = ids[ids != self.unk_id]
            out.append(ids[:self.max_tokens])
        return out

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """(B, dim) float32 embeddings of one batch of texts (zeros for a text without a known token)."""
        ids = self.token_ids(texts)
        counts = np.array([len(i) for i in ids], np.int64)
        out = np.zeros((len(texts), self.dim), np.float32)
        if counts.sum():
            sums = np.add.reduceat(self.rows[np.concatenate(ids)], np.r_[0, np.cumsum(counts)[:-1]][counts > 0], axis=0)
            out[counts > 0] = sums / counts[counts > 0, None]
        return out / np.clip(np.linalg.norm(out, axis=1, keepdims=True), 1e-12, None)

    def tokenizer_json(self) -> str:
        """The tokenizer as it runs (no padding, no truncation), as ``tokenizer.json`` text."""
        return self.tokenizer.to_str()

    @property
    def max_length(self) -> int:
        """The most tokens of a text the model averages."""
        return int(self.max_tokens)

    def runtime(self) -> dict[str, Any]:
        """Token rows averaged in numpy."""
        return {"numpy": np.__version__}

    def encode(self, texts: Sequence[str], *, batch_size: int = 64,
               progress: Callable[[int], None] | None = None) -> np.ndarray:
        """(N, dim) float32 embeddings of ``texts`` in their order, ``batch_size`` texts at a time."""
        out = np.empty((len(texts), self.dim), np.float32)
        step = max(batch_size, 1024)  # no padding here: larger batches cost nothing and tokenise faster
        for start in range(0, len(texts), step):
            out[start:start + step] = self.embed_batch(texts[start:start + step])
            if progress is not None:
                progress(len(out[start:start + step]))
        return out


def read_recipe(folder: Path) -> dict:
    """``recipe.json`` of a static model folder (at most 1 MiB), checked to be this format's."""
    try:
        recipe = json.loads(read_limited(folder / RECIPE_FILE, 1 << 20))
    except ValueError as exc:
        if isinstance(exc, TextModelError):
            raise
        raise TextModelError(f"{folder / RECIPE_FILE} is not JSON ({exc})") from None
    if not isinstance(recipe, dict) or recipe.get("format") != STATIC_FORMAT:
        raise TextModelError(f"{folder / RECIPE_FILE} is not a static text model's recipe (format {STATIC_FORMAT})")
    return recipe


def load_static_folder(folder: str | Path, *, name: str | None = None, max_bytes: int = TEXT_MAX_BYTES) -> StaticTextEncoder:
    """The static model in ``folder`` (see the module docstring); :class:`TextModelError` (one line) when a file is
    missing, larger than ``max_bytes``, malformed, or its shapes disagree."""
    from safetensors.numpy import load as load_safetensors

    folder = Path(folder)
    name = name or folder.name
    read_recipe(folder)
    data = read_limited(folder / EMBEDDINGS_FILE, max_bytes)
    try:
        tensors = load_safetensors(data)
    except Exception as exc:  # noqa: BLE001 - a malformed header or truncated data
        raise TextModelError(f"{folder / EMBEDDINGS_FILE} is not a safetensors file ({str(exc)[:160]})") from None
    if set(tensors) != {"embeddings", "weights"}:
        raise TextModelError(f"{folder / EMBEDDINGS_FILE} holds {sorted(tensors)}; a static model holds embeddings "
                             "and weights")
    table, weights = tensors["embeddings"], tensors["weights"]
    if table.dtype not in TABLE_DTYPES or weights.dtype.kind != "f":
        raise TextModelError(f"{folder / EMBEDDINGS_FILE}: embeddings are {table.dtype}, weights {weights.dtype}; "
                             "expected float16/float32 and float")
    if not (np.isfinite(table).all() and np.isfinite(weights).all()):
        raise TextModelError(f"{folder / EMBEDDINGS_FILE} holds NaN or infinite values")
    encoder = StaticTextEncoder(table, weights, read_limited(folder / TOKENIZER_FILE, SMALL_FILE_BYTES), name=name)
    encoder.sha256 = hashlib.sha256(data).hexdigest()
    return encoder


__all__ = ["EMBEDDINGS_FILE", "MAX_TOKENS", "RECIPE_FILE", "STATIC_FORMAT", "TOKENIZER_FILE", "StaticTextEncoder",
           "load_static_folder", "read_recipe"]
