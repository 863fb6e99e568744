"""Text encoders: sentences -> one embedding each, through an ONNX graph (``onnxruntime``) or a BERT encoder read from
safetensors (:mod:`engine.models.bert`), tokenised by a ``tokenizer.json`` (``tokenizers``).

An ONNX file is data: it is size-checked, read into memory, hash-checked when pinned, and handed to onnxruntime as
bytes (so it cannot pull in external files), with no custom-op library registered; a graph needing one is refused.
Inputs ``input_ids`` / ``attention_mask`` / ``token_type_ids`` are fed as the graph declares them. The output is the
one named ``last_hidden_state`` or else the graph's only float (batch, tokens, hidden) output, pooled here; a graph
without one must have a single float (batch, hidden) output, taken as already pooled.

Pooling (mean over the attention mask, or the [CLS] token) and L2 normalisation follow the model folder's
``modules.json`` and ``1_Pooling/config.json`` (sentence-transformers' layout); a bare ONNX file is told them by its
caller. Texts are encoded in batches of texts of similar length (sorted by token count, a stable order), one batch in
memory at a time; the same texts and batch size give the same embeddings.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import torch

from engine.core.signals import Cancelled, cancel_requested, on_cancel
from engine.models.bert import BertConfig, load_bert
from engine.models.onnx_check import GraphError, check_graph
from engine.data.text_model_files import (TEXT_MAX_BYTES, ModelFolder, TextModelError, check_sha256, read_limited,
                                         weights_member)

POOLINGS = ("mean", "cls")
MAX_TOKENS_PER_BATCH = 1 << 18  # padded tokens per batch at most (bounds the (B, L, H) activations)


@dataclass(frozen=True)
class Pooling:
    """How token states become one embedding: ``mode`` (mean over the mask, or cls) and L2 normalisation."""

    mode: str = "mean"
    normalize: bool = True


def mean_pool(states: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The mean of each row's token states over its attention mask: (B, L, H), (B, L) -> (B, H) float32."""
    weights = mask.astype(np.float32)[..., None]
    return (states * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)


def pool(states: np.ndarray, mask: np.ndarray, pooling: Pooling) -> np.ndarray:
    """(B, L, H) token states -> (B, H) embeddings as ``pooling`` says."""
    out = mean_pool(states, mask) if pooling.mode == "mean" else states[:, 0, :]
    out = np.asarray(out, np.float32)
    if pooling.normalize:
        out = out / np.clip(np.linalg.norm(out, axis=1, keepdims=True), 1e-12, None)
    return out


def pooling_of(folder: ModelFolder) -> Pooling:
    """The pooling a sentence-transformers folder declares (``modules.json``); mean without normalisation when it
    declares none (a bare BERT folder)."""
    if not folder.exists("modules.json"):
        return Pooling("mean", normalize=False)
    modules = _json(folder, "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise TextModelError(f"{folder.path}!modules.json is not a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unknown = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if unknown:
        raise TextModelError(f"{folder.path}: module {unknown[0]!r} is not supported (Transformer, Pooling, Normalize)")
    mode = "mean"
    if "Pooling" in kinds:
        config = _json(folder, f"{modules[kinds.index('Pooling')].get('path') or '1_Pooling'}/config.json")
        modes = [m for m, key in (("mean", "pooling_mode_mean_tokens"), ("cls", "pooling_mode_cls_token"),
                                  ("max", "pooling_mode_max_tokens"), ("sqrt", "pooling_mode_mean_sqrt_len_tokens"))
                 if config.get(key)]
        if len(modes) != 1 or modes[0] not in POOLINGS:
            raise TextModelError(f"{folder.path}: pooling {'+'.join(modes) or 'none'} is not supported; mean or cls")
        mode = modes[0]
    return Pooling(mode, normalize="Normalize" in kinds)


def _json(folder: ModelFolder, name: str):
    try:
        return json.loads(folder.read(name, max_bytes=1 << 20))
    except ValueError as exc:
        if isinstance(exc, TextModelError):
            raise
        raise TextModelError(f"{folder.path}!{name} is not JSON ({exc})") from None


MAX_ADDED_TOKENS = 100_000  # BERT adds 5, large multilingual tokenizers a few thousand


class TextTokenizer:
    """A ``tokenizer.json`` that pads each batch to its longest text and truncates at ``max_length`` tokens."""

    def __init__(self, data: bytes, *, max_length: int = 512, what: str = "tokenizer.json") -> None:
        from tokenizers import Tokenizer

        added = data.count(b'"special"')  # one per added token: counted before the library builds them
        if added > MAX_ADDED_TOKENS:
            raise TextModelError(f"{what} adds {added:,} tokens, more than {MAX_ADDED_TOKENS:,}; not loaded (each costs "
                                 "memory in the tokenizer library)")
        try:
            self.tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001 - a malformed file: say which
            raise TextModelError(f"{what} is not a tokenizers file ({str(exc).splitlines()[0][:120]})") from None
        declared = self.tokenizer.padding or {}  # the file's own pad token, else BERT's [PAD]
        pad_token = declared.get("pad_token") or "[PAD]"
        pad_id = declared.get("pad_id", self.tokenizer.token_to_id(pad_token) or 0)
        self.tokenizer.no_padding()
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)  # to each batch's longest text
        self.tokenizer.enable_truncation(max_length)
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.max_length = max_length

    def lengths(self, texts: Sequence[str], chunk: int = 4096) -> np.ndarray:
        """Token counts (with special tokens, truncated) of ``texts``, tokenised ``chunk`` texts at a time."""
        out = np.empty(len(texts), np.int64)
        for start in range(0, len(texts), chunk):
            encoded = self.tokenizer.encode_batch(list(texts[start:start + chunk]))
            out[start:start + len(encoded)] = [len(e.ids) for e in encoded]
        return out

    def __call__(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """``input_ids``, ``attention_mask``, ``token_type_ids`` (B, L) int64 of a padded batch."""
        encoded = self.tokenizer.encode_batch(list(texts))
        return {"input_ids": np.array([e.ids for e in encoded], np.int64),
                "attention_mask": np.array([e.attention_mask for e in encoded], np.int64),
                "token_type_ids": np.array([e.type_ids for e in encoded], np.int64)}


class TextEncoder:
    """A tokenizer, a network giving token states (or pooled vectors) and a pooling; :meth:`encode` embeds texts."""

    kind = "text"

    def __init__(self, tokenizer: TextTokenizer, pooling: Pooling, *, name: str, dim: int) -> None:
        self.tokenizer, self.pooling, self.name, self.dim = tokenizer, pooling, name, dim
        self.sha256 = ""  # of the weights' bytes, set by the loaders

    def states(self, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, bool]:
        """``(output, pooled)``: (B, L, H) token states, or (B, H) when the network pools itself."""
        raise NotImplementedError

    def embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        """(B, dim) float32 embeddings of one batch of texts."""
        batch = self.tokenizer(texts)
        out, pooled = self.states(batch)
        if pooled:  # a graph that pools itself: one "token" per text, only the normalisation left to do
            return pool(np.asarray(out)[:, None, :], np.ones((len(out), 1), np.int64), self.pooling)
        return pool(out, batch["attention_mask"], self.pooling)

    def encode(self, texts: Sequence[str], *, batch_size: int = 64,
               progress: Callable[[int], None] | None = None) -> np.ndarray:
        """(N, dim) float32 embeddings of ``texts`` in their order, computed in batches of similar length."""
        out = np.empty((len(texts), self.dim), np.float32)
        for rows in batches_by_length(self.tokenizer.lengths(texts), batch_size):
            out[rows] = self.embed_batch([texts[i] for i in rows])
            if progress is not None:
                progress(len(rows))
        bad = ~np.isfinite(out).all(axis=1)
        if bad.any():
            raise TextModelError(f"{self.name} gives NaN/inf embeddings for {int(bad.sum())} of {len(out)} texts")
        return out

    def close(self) -> None:
        """Release the network (nothing to do for in-process encoders)."""

    def tokenizer_json(self) -> str:
        """The tokenizer as it runs (padding and truncation included), as ``tokenizer.json`` text."""
        return self.tokenizer.tokenizer.to_str()

    @property
    def max_length(self) -> int:
        """The most tokens of a text the encoder reads."""
        return int(self.tokenizer.max_length)

    def runtime(self) -> dict[str, Any]:
        """What computes the vectors: the runtime, its version and where it runs."""
        raise NotImplementedError

    def identity(self) -> dict[str, Any]:
        """What besides its weights makes this encoder's vectors what they are (the text embedding cache's key,
        ``engine.checkpoints.text_cache``): the tokenizer and its token limit, pooling, normalisation, size, runtime."""
        return {"tokenizer_sha256": hashlib.sha256(self.tokenizer_json().encode("utf-8")).hexdigest(),
                "tokenizers": package_version("tokenizers"), "max_length": self.max_length,
                "pooling": self.pooling.mode, "normalize": bool(self.pooling.normalize), "dim": int(self.dim),
                **self.runtime()}


def package_version(name: str) -> str | None:
    """An installed distribution's version, None when it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def batches_by_length(lengths: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    """Row indices in batches of similar token counts (stable sort), each at most ``batch_size`` rows and
    :data:`MAX_TOKENS_PER_BATCH` padded tokens."""
    order = np.argsort(lengths, kind="stable")
    start = 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and stop - start < batch_size and \
                (stop - start + 1) * lengths[order[stop]] <= MAX_TOKENS_PER_BATCH:
            stop += 1
        yield order[start:stop]
        start = stop


class OnnxTextEncoder(TextEncoder):
    """An ONNX graph run by onnxruntime (CPU; CUDA when torch sees a GPU and onnxruntime has its provider)."""

    def __init__(self, model: bytes, tokenizer: TextTokenizer, pooling: Pooling, *, name: str,
                 threads: int | None = None, device: str = "auto") -> None:
        import onnxruntime as ort

        try:
            check_graph(model, name)  # before onnxruntime sees it: standard operators and the graph's own data only
        except GraphError as exc:
            raise TextModelError(str(exc)) from None
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 4  # onnxruntime's own error log stays quiet: its message is in the one line below
        providers = ["CPUExecutionProvider"]
        if device != "cpu" and torch.cuda.is_available() and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        try:
            self.session = ort.InferenceSession(model, sess_options=options, providers=providers)
        except Exception as exc:  # noqa: BLE001 - not ONNX, an unknown operator, a custom-op domain: onnxruntime says which
            raise TextModelError(f"{name} is not an ONNX model onnxruntime can run here "
                                 f"({str(exc).splitlines()[0][:160]})") from None
        self.inputs = [i.name for i in self.session.get_inputs()]
        unknown = [i for i in self.inputs if i not in ("input_ids", "attention_mask", "token_type_ids")]
        if "input_ids" not in self.inputs or unknown:
            raise TextModelError(f"{name}: the graph's inputs {self.inputs} are not a BERT-style encoder's "
                                 "(input_ids, attention_mask, token_type_ids)")
        self.output, pooled, dim = _pick_output(self.session, name)
        self.pooled = pooled
        super().__init__(tokenizer, pooling, name=name, dim=dim)
        self._check_vocabulary()

    def states(self, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, bool]:
        """One batch through the graph; a job's cancel terminates a run under way (``RunOptions.terminate``, set from
        a watcher thread: a graph with an endless ``Loop`` cannot otherwise be stopped)."""
        import onnxruntime as ort

        options = ort.RunOptions()
        try:
            with on_cancel(lambda: setattr(options, "terminate", True)):
                out = self.session.run([self.output], {k: batch[k] for k in self.inputs}, run_options=options)
        except Exception as exc:  # a terminated run: the cancel's, else the graph's own error
            if cancel_requested():
                raise Cancelled(f"cancelled while running {self.name}") from exc
            raise
        return out[0], self.pooled

    def runtime(self) -> dict[str, Any]:
        """onnxruntime on its first provider, and the graph output read."""
        return {"onnxruntime": package_version("onnxruntime"), "provider": self.session.get_providers()[0],
                "output": self.output, "pooled": bool(self.pooled)}

    def _check_vocabulary(self) -> None:
        """The graph must accept the tokenizer's largest id (a smaller embedding table means another vocabulary)."""
        probe = {"input_ids": np.array([[self.tokenizer.vocab_size - 1]], np.int64),
                 "attention_mask": np.ones((1, 1), np.int64), "token_type_ids": np.zeros((1, 1), np.int64)}
        try:
            self.states(probe)
        except Exception as exc:  # noqa: BLE001 - whatever the runtime raises on an id past its table
            raise TextModelError(f"{self.name} does not take the tokenizer's ids (its largest, "
                                 f"{self.tokenizer.vocab_size - 1}, fails: {str(exc).splitlines()[0][:120]}); "
                                 "the tokenizer does not match the model") from None


def _pick_output(session, name: str) -> tuple[str, bool, int]:
    """``(output name, pooled, hidden size)``: see the module docstring."""
    floats = [o for o in session.get_outputs() if o.type in ("tensor(float)", "tensor(float16)")]
    by_name = [o for o in floats if o.name == "last_hidden_state"]
    states = by_name or [o for o in floats if len(o.shape) == 3]
    if len(states) == 1 and isinstance(states[0].shape[-1], int):
        return states[0].name, False, states[0].shape[-1]
    pooled = [o for o in floats if len(o.shape) == 2 and isinstance(o.shape[-1], int)]
    if not states and len(pooled) == 1:
        return pooled[0].name, True, pooled[0].shape[-1]
    raise TextModelError(f"{name}: cannot tell which output is the embedding (float outputs: "
                         f"{[(o.name, o.shape) for o in floats]}); expected last_hidden_state or one (batch, tokens, "
                         "hidden) output with a fixed hidden size")


class BertTextEncoder(TextEncoder):
    """A :class:`engine.models.bert.BertEncoder` in torch (CPU, or CUDA when asked and present)."""

    def __init__(self, config: BertConfig, tensors: dict[str, torch.Tensor], tokenizer: TextTokenizer,
                 pooling: Pooling, *, name: str, device: torch.device | None = None) -> None:
        if tokenizer.vocab_size != config.vocab_size:
            raise TextModelError(f"{name}: tokenizer.json has {tokenizer.vocab_size} tokens but the model's vocabulary "
                                 f"has {config.vocab_size}; the tokenizer does not match the model")
        self.device = device or torch.device("cpu")
        self.config = config
        self.net = load_bert(config, tensors, what=f"{name} model.safetensors").to(self.device)
        super().__init__(tokenizer, pooling, name=name, dim=config.hidden_size)

    def identity(self) -> dict[str, Any]:
        """The encoder's identity and its whole ``config.json`` (heads, ``layer_norm_eps``: the same weights under
        another config give other vectors)."""
        return {**super().identity(), "config": dataclasses.asdict(self.config)}

    def states(self, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, bool]:
        with torch.inference_mode():
            args = [torch.from_numpy(batch[k]).to(self.device) for k in ("input_ids", "attention_mask", "token_type_ids")]
            return self.net(*args).float().cpu().numpy(), False

    def runtime(self) -> dict[str, Any]:
        """The engine's torch BERT, on its device."""
        return {"torch": package_version("torch"), "device": str(self.device)}


def load_onnx_encoder(path: str | Path, tokenizer_json: bytes, *, pooling: Pooling = Pooling(), max_length: int = 512,
                      max_bytes: int = TEXT_MAX_BYTES, sha256: str | None = None, name: str | None = None,
                      threads: int | None = None, device: str = "auto") -> OnnxTextEncoder:
    """An ONNX text encoder from its file (size checked before reading; SHA-256 checked when given)."""
    path = Path(path)
    model = read_limited(path, max_bytes)
    if sha256 is not None:
        check_sha256(model, sha256, str(path), "use the original file")
    return onnx_encoder(model, TextTokenizer(tokenizer_json, max_length=max_length), pooling,
                        name=name or path.name, threads=threads, device=device)


def onnx_encoder(model: bytes, tokenizer: TextTokenizer, pooling: Pooling, *, name: str, threads: int | None = None,
                 device: str = "auto") -> OnnxTextEncoder:
    """:class:`OnnxTextEncoder` of the graph's bytes, with their SHA-256 recorded."""
    encoder = OnnxTextEncoder(model, tokenizer, pooling, name=name, threads=threads, device=device)
    encoder.sha256 = hashlib.sha256(model).hexdigest()
    return encoder


def load_bert_folder(folder: ModelFolder, *, name: str | None = None, max_length: int | None = None,
                     device: torch.device | None = None) -> BertTextEncoder:
    """A sentence-transformers (or plain BERT) folder: ``config.json``, ``model.safetensors``, ``tokenizer.json``,
    with the pooling it declares and ``sentence_bert_config.json``'s ``max_seq_length``."""
    from safetensors.torch import load as load_safetensors

    name = name or folder.path.name
    config = BertConfig.from_json(folder.read("config.json", max_bytes=1 << 20), what=f"{folder.path}!config.json")
    stored = folder.size("model.safetensors")
    if 2 * config.parameters() > stored + (1 << 20):  # float16 at the least: 2 bytes a parameter
        raise TextModelError(f"{folder.path}!config.json declares {config.parameters():,} parameters, but "
                             f"model.safetensors holds {stored:,} bytes (fewer than 2 a parameter); refused before "
                             "anything is allocated")
    if max_length is None:
        sbert = _json(folder, "sentence_bert_config.json") if folder.exists("sentence_bert_config.json") else {}
        max_length = int(sbert.get("max_seq_length") or config.max_position_embeddings)
    max_length = min(max_length, config.max_position_embeddings)
    tokenizer = TextTokenizer(folder.read("tokenizer.json", max_bytes=64 << 20), max_length=max_length,
                              what=f"{folder.path}!tokenizer.json")
    weights = folder.read("model.safetensors")
    try:
        tensors = load_safetensors(weights)
    except Exception as exc:  # noqa: BLE001 - a malformed header or truncated data
        raise TextModelError(f"{folder.path}!model.safetensors is not a safetensors file ({exc})") from None
    encoder = BertTextEncoder(config, tensors, tokenizer, pooling_of(folder), name=name, device=device)
    encoder.sha256 = hashlib.sha256(weights).hexdigest()
    return encoder


def load_text_folder(folder: ModelFolder, *, name: str | None = None, threads: int | None = None,
                     device: str = "auto") -> TextEncoder:
    """A user's text encoder: a folder or zip with ``tokenizer.json`` and either ``model.safetensors`` +
    ``config.json`` (a BERT, :func:`load_bert_folder`) or ``model.onnx`` (or ``onnx/model.onnx``), pooled as its
    ``modules.json`` declares (mean and L2 normalisation when it declares nothing) with ``sentence_bert_config.json``'s
    ``max_seq_length`` (else 512 tokens)."""
    name = name or folder.path.name
    member = weights_member(folder)  # the same rule the dashboard checks a folder by, before a worker loads it
    if member == "model.safetensors":
        target = torch.device("cuda" if device != "cpu" and torch.cuda.is_available() else "cpu")
        return load_bert_folder(folder, name=name, device=target)
    sbert = _json(folder, "sentence_bert_config.json") if folder.exists("sentence_bert_config.json") else {}
    tokenizer = TextTokenizer(folder.read("tokenizer.json", max_bytes=64 << 20),
                              max_length=int(sbert.get("max_seq_length") or 512), what=f"{folder.path}!tokenizer.json")
    pooling = pooling_of(folder) if folder.exists("modules.json") else Pooling("mean", True)
    return onnx_encoder(folder.read(member), tokenizer, pooling, name=name, threads=threads, device=device)
