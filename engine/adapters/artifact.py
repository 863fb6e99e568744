"""A post-hoc adapter as a folder a team can apply without this product: weights, a small JSON and an ONNX graph.

``DIR/adapter.safetensors`` (float32 tensors, no pickle), ``DIR/adapter.json`` (:data:`FORMAT`: kind, widths,
normalisation, options, what it was fitted on, its held-out metrics, the tensors' shapes, and ``fingerprints``: the
:class:`engine.core.fingerprint.Fingerprint` of its ``input`` and ``output`` spaces) and ``DIR/adapter.onnx``
(:mod:`engine.adapters.onnx_graph`; input ``new``, output ``old``). :func:`save_adapter` writes a temporary folder
beside ``DIR`` and renames it, so ``DIR`` is whole or absent; an existing ``DIR`` is replaced only with ``force``.
:func:`load_adapter` validates the JSON strictly (known keys, types, sizes bounded) and reads only the safetensors
weights, checking each tensor's declared dtype and shape before it is read; every refusal is one line. A folder
written before fingerprints (no ``fingerprints`` key) still loads; :func:`load_fingerprints` then gives None.
"""
from __future__ import annotations

import json
import math
import os
import stat
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from engine.adapters.posthoc import NORMALISE, POSTHOC, PosthocMap, check_tensors, kind_of, options_for
from engine.core.fingerprint import Fingerprint

FORMAT = "compatibility-lab/posthoc-adapter/1"
JSON_NAME, WEIGHTS_NAME, ONNX_NAME = "adapter.json", "adapter.safetensors", "adapter.onnx"
MAX_JSON_BYTES = 1 << 20
MAX_DIM = 1 << 16
MAX_WEIGHT_BYTES = 1 << 31  # 2 GiB: far above any map of two embedding spaces
KEYS = {"format", "kind", "new_dim", "old_dim", "normalise", "options", "tensors", "fitted_on", "metrics", "files"}
OPTIONAL_KEYS = {"fingerprints"}  # absent in folders written before fingerprints (issue 42)
SPACES = ("input", "output")  # the fingerprints' keys: the space the adapter maps from, and the one it maps into
# how the stored weights are read (``files.weights_orientation``): row vectors times (in, out) matrices
ORIENTATION = ("row vectors: a batch x of shape (batch, new_dim) maps as x @ W (+ b), every matrix stored (in, out) "
               "(weight is (new_dim, old_dim)), not (out, in) as torch.nn.Linear stores it, so x @ W.T is wrong; with "
               "normalise l2 each row is scaled to unit length before the map and after it")
FORMULAS = {kind: k.formula for kind, k in POSTHOC.items()}  # as each exported adapter's metadata states it


class AdapterFileError(ValueError):
    """An adapter folder that cannot be read as one; the message is one line."""


def describe(m: PosthocMap, fingerprints: dict[str, Fingerprint] | None = None) -> dict[str, Any]:
    """The JSON of an adapter folder (``fingerprints``: of its ``input`` and ``output`` spaces)."""
    extra = {} if fingerprints is None else {"fingerprints": {k: fingerprints[k].to_json() for k in SPACES}}
    return {**extra, "format": FORMAT, "kind": m.kind, "new_dim": m.new_dim, "old_dim": m.old_dim, "normalise": m.normalise,
            "options": asdict(m.options), "tensors": {n: list(t.shape) for n, t in m.tensors.items()},
            "fitted_on": m.fitted_on, "metrics": m.metrics,
            "files": {"weights": WEIGHTS_NAME, "weights_orientation": ORIENTATION, "formula": FORMULAS[m.kind],
                      "onnx": ONNX_NAME,
                      "onnx_io": {"input": "new (batch, new_dim) float32", "output": "old (batch, old_dim) float32"}}}


ADAPTER_FILES = frozenset((JSON_NAME, WEIGHTS_NAME, ONNX_NAME))


def check_replaceable(folder: Path) -> None:
    """``--force`` replaces an adapter folder this tool wrote, nothing else: ``AdapterFileError`` (one line, with the
    count) when ``folder`` holds anything but the adapter's own regular files, or lacks its ``adapter.json``."""
    entries = list(os.scandir(folder))
    foreign = [e for e in entries if e.name not in ADAPTER_FILES or not e.is_file(follow_symlinks=False)]
    if foreign or not any(e.name == JSON_NAME for e in entries):
        raise AdapterFileError(f"{folder} is not an adapter folder ({len(foreign)} of its {len(entries)} entries are "
                               f"not an adapter's files); --force replaces only an adapter folder, so nothing was "
                               "written: give a new folder")


def save_adapter(m: PosthocMap, folder: str | Path, *, force: bool = False, onnx: bool = True,
                 fingerprints: dict[str, Fingerprint] | None = None) -> Path:
    """Write ``m`` to ``folder`` (whole or not at all) with the ``fingerprints`` of its input and output spaces;
    an existing ``folder`` is refused unless ``force``."""
    if fingerprints is not None:
        _check_spaces(m, fingerprints, str(folder))
    from safetensors.numpy import save_file

    folder = Path(folder)
    if folder.is_symlink():
        raise AdapterFileError(f"{folder} is a symbolic link; give the folder itself (a link is never replaced)")
    if folder.exists() and not force:
        raise AdapterFileError(f"{folder} exists; give --force to replace it")
    if folder.exists() and not folder.is_dir():
        raise AdapterFileError(f"{folder} exists and is not a folder")
    if folder.exists():
        check_replaceable(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(describe(m, fingerprints), indent=2, allow_nan=False)  # a NaN metric is refused before anything is written
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        save_file({n: np.ascontiguousarray(t, np.float32) for n, t in m.tensors.items()}, str(tmp / WEIGHTS_NAME),
                  metadata={"format": FORMAT})
        if onnx:
            from engine.adapters.onnx_graph import onnx_model

            (tmp / ONNX_NAME).write_bytes(onnx_model(m).SerializeToString())
        (tmp / JSON_NAME).write_text(text, encoding="utf-8")
        os.chmod(tmp, 0o755)
        if folder.exists():
            aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
            os.replace(folder, aside / "old")
            os.replace(tmp, folder)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _int(info: dict, key: str, where: str) -> int:
    value = info.get(key)
    if type(value) is not int or not 1 <= value <= MAX_DIM:
        raise AdapterFileError(f"{where}: {key} must be an integer in [1, {MAX_DIM}], got {value!r}")
    return value


def _member(folder: Path, name: str) -> Path:
    """``folder / name``, a regular file of the folder's own: a link (which could lead out of the data roots) or a
    device is refused in one line."""
    path = folder / name
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise AdapterFileError(f"{folder} is not an adapter folder: {name} is missing") from None
    if stat.S_ISLNK(mode):
        raise AdapterFileError(f"{path} is a symbolic link; an adapter's files must be its own (a link may lead out "
                               "of the data roots)")
    if not stat.S_ISREG(mode):
        raise AdapterFileError(f"{path} is not a regular file")
    return path


def _read_json(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise AdapterFileError(f"{folder} is not an adapter folder (no such folder)")
    path = _member(folder, JSON_NAME)
    if path.stat().st_size > MAX_JSON_BYTES:
        raise AdapterFileError(f"{path} is {path.stat().st_size:,} bytes; an adapter description is at most "
                               f"{MAX_JSON_BYTES:,}")
    try:
        info = json.loads(path.read_text(encoding="utf-8"),
                          parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not JSON")))
    except (UnicodeDecodeError, ValueError) as exc:
        raise AdapterFileError(f"{path} is not valid JSON ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise AdapterFileError(f"{path} nests too deeply to be an adapter description") from None
    if not isinstance(info, dict):
        raise AdapterFileError(f"{path} holds a JSON {type(info).__name__}, not an object")
    if info.get("format") != FORMAT:
        raise AdapterFileError(f"{path} is not a Compatibility Lab post-hoc adapter (format {info.get('format')!r}, "
                               f"expected {FORMAT!r})")
    if not KEYS <= set(info) <= KEYS | OPTIONAL_KEYS:
        raise AdapterFileError(f"{path}: unexpected keys {sorted(set(info) - KEYS - OPTIONAL_KEYS)}, missing keys "
                               f"{sorted(KEYS - set(info))}")
    return info


def _check_spaces(m: PosthocMap, fingerprints: object, where: str) -> dict[str, Fingerprint]:
    """``fingerprints`` as ``{"input": ..., "output": ...}`` of ``m``'s widths; ``AdapterFileError`` otherwise."""
    if not isinstance(fingerprints, dict) or set(fingerprints) != set(SPACES):
        raise AdapterFileError(f"{where}: fingerprints must name exactly the {' and '.join(SPACES)} spaces")
    try:
        spaces = {k: v if isinstance(v, Fingerprint) else Fingerprint.from_json(v, where=f"the {k} fingerprint")
                  for k, v in fingerprints.items()}
    except ValueError as exc:
        raise AdapterFileError(f"{where}: {exc}") from None
    for key, dim in (("input", m.new_dim), ("output", m.old_dim)):
        if spaces[key].dim != dim:
            raise AdapterFileError(f"{where}: the {key} fingerprint is {spaces[key].dim}-d, the adapter's {key} "
                                   f"{dim}-d")
    return spaces


def load_adapter(folder: str | Path) -> PosthocMap:
    """The adapter saved in ``folder`` (see the module docstring for what is checked)."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    info = _read_json(folder)
    where = str(folder / JSON_NAME)
    try:
        entry = kind_of(info["kind"]) if isinstance(info["kind"], str) else kind_of(repr(info["kind"]))
        if not isinstance(info["options"], dict):
            raise ValueError("options must be a JSON object")
        options = options_for(info["kind"], info["options"])
    except ValueError as exc:
        raise AdapterFileError(f"{where}: {exc}") from None
    new_dim, old_dim = _int(info, "new_dim", where), _int(info, "old_dim", where)
    if info["normalise"] not in NORMALISE:
        raise AdapterFileError(f"{where}: normalise must be one of {', '.join(NORMALISE)}, got {info['normalise']!r}")
    for key in ("fitted_on", "metrics", "files"):
        if not isinstance(info[key], dict):
            raise AdapterFileError(f"{where}: {key} must be a JSON object")
    shapes = entry.shapes(new_dim, old_dim, options)
    if info["tensors"] != {n: list(s) for n, s in shapes.items()}:
        raise AdapterFileError(f"{where}: tensors {info['tensors']!r} do not match a {info['kind']} adapter of "
                               f"{new_dim} -> {old_dim} dimensions")
    expected_bytes = sum(4 * math.prod(s) for s in shapes.values())
    if expected_bytes > MAX_WEIGHT_BYTES:
        raise AdapterFileError(f"{where}: the declared tensors need {expected_bytes:,} bytes, more than "
                               f"{MAX_WEIGHT_BYTES:,}")
    path = _member(folder, WEIGHTS_NAME)
    size = path.stat().st_size
    if size > expected_bytes + MAX_JSON_BYTES:
        raise AdapterFileError(f"{path} is {size:,} bytes, more than its declared tensors ({expected_bytes:,}) allow")
    tensors = {}
    try:
        with safe_open(str(path), framework="numpy") as handle:
            if set(handle.keys()) != set(shapes):
                raise AdapterFileError(f"{path} holds tensors {sorted(handle.keys())}, expected {sorted(shapes)}")
            for name, shape in shapes.items():
                part = handle.get_slice(name)
                if part.get_dtype() != "F32" or tuple(part.get_shape()) != shape:
                    raise AdapterFileError(f"{path}: tensor {name} is {part.get_dtype()} {tuple(part.get_shape())}, "
                                           f"expected F32 {shape}")
                tensors[name] = handle.get_tensor(name)
                if not np.isfinite(tensors[name]).all():
                    raise AdapterFileError(f"{path}: tensor {name} holds NaN or infinite values")
    except (SafetensorError, OSError) as exc:
        raise AdapterFileError(f"{path} is not a readable safetensors file ({str(exc).splitlines()[0]})") from None
    try:
        check_tensors(tensors, str(path))
    except ValueError as exc:
        raise AdapterFileError(str(exc)) from None
    m = PosthocMap(info["kind"], new_dim, old_dim, info["normalise"], options, tensors, info["fitted_on"],
                   info["metrics"])
    if "fingerprints" in info:
        _check_spaces(m, info["fingerprints"], where)
    return m


def load_fingerprints(folder: str | Path) -> dict[str, Fingerprint] | None:
    """The fingerprints of the ``input`` and ``output`` spaces of the adapter in ``folder`` (checked as
    :func:`load_adapter` checks them); None for a folder written before fingerprints."""
    folder = Path(folder)
    info = _read_json(folder)
    if "fingerprints" not in info:
        return None
    m = PosthocMap(info["kind"], _int(info, "new_dim", str(folder)), _int(info, "old_dim", str(folder)), "none",
                   None, {})
    return _check_spaces(m, info["fingerprints"], str(folder / JSON_NAME))


__all__ = ["FORMAT", "FORMULAS", "ORIENTATION", "SPACES", "AdapterFileError", "describe", "load_adapter",
           "load_fingerprints", "save_adapter"]
