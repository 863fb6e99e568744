"""What a ``torch.save`` zip declares, read without torch and without running anything from it.

``check_torch_zip(path, max_bytes)`` runs before ``torch.load``: its unpickler rebuilds nothing but plain
containers and records of the tensors (storage, offset, shape, strides), so a file that claims more than it holds
is refused before a byte is allocated for it. Every tensor must be a dense view: no expanded (stride-0), negative
or overlapping strides, and it must fit inside its storage; every storage must match its zip record's size; and the
tensors' element bytes, counted once per state_dict entry (entries that share a storage or a tensor count each
time, as a model loading them copies each), must fit ``max_bytes``. Importing this module loads neither torch nor numpy.
"""
from __future__ import annotations

import collections
import io
import math
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.checkpoints.files import CheckpointError, first_line, human_bytes, listed, refusal

MAX_PICKLE_BYTES = 64_000_000  # a state_dict's data.pkl is ~100 bytes per tensor

# torch's legacy typed storages (``torch.FloatStorage`` ...): element size in bytes
STORAGE_ITEMSIZE = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
                    "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
                    "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8, "UntypedStorage": 1}
# dtypes named by ``_rebuild_tensor_v3`` (the dtypes without a typed storage of their own)
DTYPE_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
                  "int8": 1, "uint8": 1, "bool": 1, "uint16": 2, "uint32": 4, "uint64": 8, "complex32": 4,
                  "complex64": 8, "complex128": 16, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
                  "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1}


@dataclass(frozen=True)
class _Kind:
    """A storage class or dtype named in the pickle, with its element size."""

    name: str
    itemsize: int


@dataclass(frozen=True)
class _Storage:
    key: str
    itemsize: int
    numel: int


@dataclass(frozen=True)
class _View:
    """One tensor as the pickle declares it."""

    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    itemsize: int

    @property
    def numel(self) -> int:
        return math.prod(self.size)


class _Refused(Exception):
    """A global the scan does not rebuild; the message is the refusal's detail."""


def _int(value: object) -> bool:
    return type(value) is int


def _ints(value: object) -> bool:
    return isinstance(value, tuple) and all(_int(v) for v in value)


class _Scanner(pickle.Unpickler):
    """Rebuilds plain containers and :class:`_View` records; every other global is refused."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.views: list[_View] = []
        self.storages: dict[str, _Storage] = {}

    def _view(self, storage: object, offset: object, size: object, stride: object, itemsize: int) -> _View:
        if not isinstance(storage, _Storage) or not _int(offset) or not _ints(size) or not _ints(stride) \
                or len(size) != len(stride):
            raise _Refused("a tensor record that is not storage, offset, shape and strides")
        view = _View(storage, offset, size, stride, itemsize)
        self.views.append(view)
        return view

    def rebuild_v2(self, storage, offset, size, stride, *_rest):  # pickle's call
        return self._view(storage, offset, size, stride, getattr(storage, "itemsize", 0))

    def rebuild_v3(self, storage, offset, size, stride, _grad, _hooks, dtype, *_rest):  # ANN201
        if not isinstance(dtype, _Kind):
            raise _Refused("a tensor record without a dtype")
        return self._view(storage, offset, size, stride, dtype.itemsize)

    @staticmethod
    def parameter(data, *_rest):  # ANN205
        if not isinstance(data, _View):
            raise _Refused("a parameter that is not a tensor")
        return data

    @staticmethod
    def encode(text, encoding="utf-8"):  # how protocol 2 writes bytes
        if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8"):
            raise _Refused("_codecs.encode of something other than text")
        return text.encode(encoding)

    @staticmethod
    def device(*args):  # ANN205
        return "device(" + ", ".join(map(repr, args)) + ")"

    def find_class(self, module: str, name: str) -> object:
        module = "builtins" if module == "__builtin__" else module  # protocol 2's name for it
        found = {("collections", "OrderedDict"): collections.OrderedDict,
                 ("torch._utils", "_rebuild_tensor_v2"): self.rebuild_v2,
                 ("torch._utils", "_rebuild_tensor_v3"): self.rebuild_v3,
                 ("torch._utils", "_rebuild_parameter"): self.parameter,
                 ("torch._utils", "_rebuild_parameter_with_state"): self.parameter,
                 ("_codecs", "encode"): self.encode,
                 ("torch", "Size"): tuple, ("torch", "device"): self.device,  # plain values torch.load also accepts
                 ("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
                 ("builtins", "complex"): complex}.get((module, name))
        if found is not None:
            return found
        if module in ("torch", "torch.storage") and name in STORAGE_ITEMSIZE:
            return _Kind(name, STORAGE_ITEMSIZE[name])
        if module == "torch" and name in DTYPE_ITEMSIZE:
            return _Kind(name, DTYPE_ITEMSIZE[name])
        called = name if module == "builtins" else f"{module}.{name}"  # as torch names it
        raise _Refused(f"unpickling it would call {called}")

    def persistent_load(self, pid: object) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Kind)
                and isinstance(pid[2], str) and _int(pid[4]) and pid[4] >= 0):
            raise _Refused("a storage record torch.save does not write")
        storage = _Storage(pid[2], pid[1].itemsize, pid[4])
        if self.storages.setdefault(storage.key, storage) != storage:
            raise _Refused(f"storage {storage.key} declared twice with different sizes")
        return storage


def _entries(obj: object) -> list[tuple[str, _View]]:
    """The (key, tensor record) entries of the top-level mapping and of mappings one level down (wrapped
    state_dicts): what a model would load, each entry its own copy even where the pickle shares one record."""
    out: list[tuple[str, _View]] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(value, _View):
                out.append((str(key), value))
            elif isinstance(value, dict):
                out += [(str(k), v) for k, v in value.items() if isinstance(v, _View)]
    return out


def view_problem(view: _View) -> str | None:
    """Why a declared tensor view is refused (None when it is a dense view inside its storage)."""
    if view.itemsize < 1:
        return "has no element type"
    if view.offset < 0 or any(d < 0 for d in view.size):
        return f"declares a negative offset or shape {list(view.size)}"
    if view.numel == 0:
        return None
    dims = sorted((st, d) for st, d in zip(view.stride, view.size) if d > 1)
    span = 1  # elements reached by the dimensions taken so far
    for st, d in dims:
        if st <= 0:
            return (f"is a {'stride-0 (expanded)' if st == 0 else 'negative-stride'} view: shape {list(view.size)}, "
                    f"strides {list(view.stride)}")
        if st < span:
            return f"is an overlapping view: shape {list(view.size)}, strides {list(view.stride)}"
        span += st * (d - 1)
    held = view.storage.numel * view.storage.itemsize // view.itemsize
    if view.offset + span > held:
        return (f"ends at element {view.offset + span} (offset {view.offset}, shape {list(view.size)}, strides "
                f"{list(view.stride)}) but its storage holds {held}")
    return None


def _archive(path: Path, archive: zipfile.ZipFile) -> tuple[str, dict[str, zipfile.ZipInfo]]:
    """The record prefix (torch reads the first entry's folder) and the entries by name (duplicates refused)."""
    entries = archive.infolist()
    by_name = {e.filename: e for e in entries}
    if len(by_name) != len(entries):
        raise CheckpointError(path, "is a zip archive with duplicate entry names: corrupt or forged")
    prefix = entries[0].filename.split("/", 1)[0] if entries else ""
    return prefix, by_name


def check_torch_zip(path: Path, max_bytes: int) -> None:
    """Refuse a ``torch.save`` zip whose tensors are not dense views of their storages, whose storages do not match
    their records, or whose tensors would take more than ``max_bytes``; allocates only the pickle's own objects."""
    with zipfile.ZipFile(path) as archive:
        prefix, entries = _archive(path, archive)
        pkl = entries.get(f"{prefix}/data.pkl")
        if pkl is None:
            raise CheckpointError(path, "is a zip archive without the data.pkl torch.save writes")
        if pkl.file_size > MAX_PICKLE_BYTES:
            raise CheckpointError(path, f"its data.pkl would take {human_bytes(pkl.file_size)}, over the "
                                        f"{human_bytes(MAX_PICKLE_BYTES)} a state_dict needs; refused before "
                                        "reading it")
        data = archive.read(pkl)
    scanner = _Scanner(data)
    try:
        obj = scanner.load()
    except _Refused as exc:
        raise CheckpointError(path, refusal(str(exc))) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            RecursionError, MemoryError) as exc:
        raise CheckpointError(path, f"is truncated or corrupt ({first_line(exc)})") from None
    for storage in scanner.storages.values():
        record = entries.get(f"{prefix}/data/{storage.key}")
        nbytes = storage.numel * storage.itemsize
        if record is None or record.file_size != nbytes:
            held = "is missing" if record is None else f"holds {human_bytes(record.file_size)}"
            raise CheckpointError(path, f"storage {storage.key} declares {human_bytes(nbytes)} but its record {held}: "
                                        "truncated or corrupt")
    entries = _entries(obj)
    names = {id(view): name for name, view in reversed(entries)}
    for index, view in enumerate(scanner.views):
        problem = view_problem(view)
        if problem:
            name = names.get(id(view), f"#{index + 1}")
            raise CheckpointError(path, f"tensor {name} {problem}; only dense tensors that fit their storage are "
                                        "read (save t.contiguous()); refused before loading it")
    counted = {id(view) for _, view in entries}
    loaded = [*entries, *(("?", v) for v in scanner.views if id(v) not in counted)]
    total = sum(view.numel * view.itemsize for _, view in loaded)
    if total > max_bytes:
        shown = listed([f"{name} {list(view.size)}" for name, view in
                        sorted(loaded, key=lambda e: e[1].numel * e[1].itemsize, reverse=True)])
        raise CheckpointError(path, f"its tensors would take {human_bytes(total)} once loaded, over the "
                                    f"{human_bytes(max_bytes)} size limit ({shown}); refused before loading them")
