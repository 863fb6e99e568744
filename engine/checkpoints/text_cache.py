"""A file cache of text embeddings: one float32 ``.npy`` per (encoder, exact list of texts), so that a second
comparison with the same model and corpus (another metric, one more model) embeds nothing again
(``engine.checkpoints.text_compare``).

Key: the SHA-256 of the encoder's identity (:func:`encoder_identity`: whatever makes two encoders give different
vectors) and of the texts themselves, in order (:func:`texts_digest`), never of the options that chose them.
Value: ``<folder>/<key[:2]>/<key>.npy``, the array's ``.npy`` bytes followed by their SHA-256 (32 bytes), written
under a temporary name in the same folder and renamed (a reader sees the whole file or none), read with
``allow_pickle=False`` as a regular file inside the folder (``storage.safe_open``). A file whose checksum does not
match its bytes (edited, reordered, truncated), that does not load, or is not a float32 ``(len(texts), dim)`` array
of finite values, is ignored and written again, never trusted. The folder is ``<first data root>/cache/text-embeddings``
(:func:`default_folder`; ``COMPATLAB_TEXT_CACHE`` names another); one outside the data roots is refused. A read-only
or full disk is no error: the embeddings are computed and returned, only not kept. The key's encoder part comes from
the encoder itself (:meth:`engine.models.text_encoder.TextEncoder.identity`).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.data.roots import confine, data_roots
from storage.safe_open import read_regular
from storage.settings import TEXT_CACHE, read_setting

CACHE_FORMAT = 2  # bump when what a cached file means changes: every older file then misses (2: checksum trailer,
# the BERT config in the identity)
DIGEST_BYTES = 32  # the SHA-256 trailer of a cached file
NPY_HEADER_BYTES = 4096  # an .npy header is far smaller; bounds the read with the array's own size


def default_folder() -> Path:
    """``$COMPATLAB_TEXT_CACHE``, else ``<first data root>/cache/text-embeddings`` (``engine.data.roots.data_roots``:
    the project's ``./data``)."""
    return Path(read_setting(TEXT_CACHE) or data_roots()[0] / "cache" / "text-embeddings")


def encoder_identity(encoder: Any, *, batch_size: int) -> dict[str, Any] | None:
    """What makes ``encoder`` (an ``engine.models.text_encoder.TextEncoder``) give the vectors it gives: its class, the
    weights' SHA-256, :meth:`~engine.models.text_encoder.TextEncoder.identity` (tokenizer, limit, pooling, size,
    runtime) and the batch size (padding changes the last bits). None when the weights' hash is unknown: such an
    encoder is not cached."""
    if not getattr(encoder, "sha256", ""):
        return None
    return {"format": CACHE_FORMAT, "class": type(encoder).__name__, "weights_sha256": encoder.sha256,
            **encoder.identity(), "batch_size": int(batch_size)}


def texts_digest(texts: Sequence[str]) -> str:
    """SHA-256 of the texts in order, each as its UTF-8 byte count then its bytes (so no two lists share one)."""
    h = hashlib.sha256()
    h.update(len(texts).to_bytes(8, "little"))
    for text in texts:
        data = str(text).encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def embedding_key(identity: dict[str, Any], texts: Sequence[str]) -> str:
    """The cache key of ``texts`` embedded by the encoder of ``identity``."""
    head = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{head}\n{texts_digest(texts)}".encode("utf-8")).hexdigest()


class TextEmbeddingCache:
    """The cache's folder (``folder``: :func:`default_folder` when None; inside the data roots, else
    ``engine.data.roots.OutsideRootsError``) and its files."""

    def __init__(self, folder: str | Path | None = None) -> None:
        self.folder = confine(default_folder() if folder is None else folder, what="text embedding cache folder")

    def path(self, key: str) -> Path:
        """Where the embeddings of ``key`` are kept."""
        return self.folder / key[:2] / f"{key}.npy"

    def load(self, key: str, rows: int, dim: int) -> np.ndarray | None:
        """The cached ``(rows, dim)`` float32 embeddings of ``key``; None when absent or not exactly that."""
        try:
            data = read_regular(self.path(key), roots=[self.folder], what="cached text embeddings",
                                max_bytes=NPY_HEADER_BYTES + rows * dim * 4 + DIGEST_BYTES)
            body, digest = data[:-DIGEST_BYTES], data[-DIGEST_BYTES:]
            if len(data) <= DIGEST_BYTES or hashlib.sha256(body).digest() != digest:
                return None  # edited, reordered or truncated since it was written: recomputed
            array = np.load(io.BytesIO(body), allow_pickle=False)
        except (OSError, ValueError, EOFError):  # absent, refused, too large, truncated, not an .npy, object array
            return None
        if (not isinstance(array, np.ndarray) or array.dtype != np.float32 or array.shape != (rows, dim)
                or not np.isfinite(array).all()):
            return None
        return array

    def save(self, key: str, array: np.ndarray) -> None:
        """Keep ``array`` (float32) for ``key``: a temporary file in the same folder, then renamed over the old one."""
        target = self.path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        except OSError:
            return  # a read-only or full disk: nothing kept
        try:
            buffer = io.BytesIO()
            np.save(buffer, np.ascontiguousarray(array, dtype=np.float32), allow_pickle=False)
            body = buffer.getvalue()
            with os.fdopen(fd, "wb") as handle:
                handle.write(body + hashlib.sha256(body).digest())
            os.replace(tmp, target)
        except OSError:
            pass
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def cached_encode(encoder: Any, texts: Sequence[str], *, cache: TextEmbeddingCache | None, batch_size: int,
                  progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, bool]:
    """``(embeddings, cached)``: ``encoder.encode(texts)``, or its earlier result read from ``cache`` (then
    ``cached`` is True and the encoder is not called). ``cache=None``: always computed, nothing kept."""
    identity = None if cache is None else encoder_identity(encoder, batch_size=batch_size)
    if identity is None:
        return encoder.encode(texts, batch_size=batch_size, progress=progress), False
    key = embedding_key(identity, texts)
    found = cache.load(key, len(texts), int(encoder.dim))
    if found is not None:
        return found, True
    embeddings = encoder.encode(texts, batch_size=batch_size, progress=progress)
    cache.save(key, embeddings)
    return embeddings, False


__all__ = ["TextEmbeddingCache", "cached_encode", "default_folder", "embedding_key", "encoder_identity", "texts_digest"]
