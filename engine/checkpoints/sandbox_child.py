"""The contained process that runs one TorchScript archive (started by ``engine.checkpoints.sandbox``).

Run as ``python -I sandbox_child.py MEMORY_BYTES`` in an empty temporary folder; imports nothing
from the project. Before it reads the archive (from stdin, as bytes) it sets RLIMIT_FSIZE=0 (no
file can be written), RLIMIT_AS (its memory), RLIMIT_CORE=0, and, where the kernel has Landlock,
denies itself every file-system access, TCP and signals to other processes. Then it answers
requests on stdin/stdout; every message is a one-byte tag plus raw ``.npy`` arrays
(``allow_pickle=False``) or an error code.

Protocol: parent sends ``u64 length + archive bytes``; child answers ``R`` + u8 has_embed + u8 Landlock applied, or
``E`` + u8 code + u16 length + text (the exception's text; the parent shows it only where the
operator runs their own file). Then per batch: parent sends ``X`` + float32 npy; child answers ``A`` + features
npy + logits npy, or ``E`` + u8 code. ``Q`` or end of input stops it.
"""
import ctypes
import io
import os
import resource
import struct
import sys

# error codes (the parent turns them into its own sentences)
LOAD, NONFINITE, FORWARD, OUTPUT, MEMORY = 1, 2, 3, 4, 5

# Landlock (linux/landlock.h)
_SYS_CREATE, _SYS_RESTRICT = 444, 446
_FS_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_RIGHTS = 0b11  # bind, connect TCP (ABI >= 4)
_SCOPES = 0b11  # abstract unix sockets, signals (ABI >= 6)
PR_SET_NO_NEW_PRIVS = 38


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none); only asks, restricts nothing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        return max(0, int(libc.syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))))
    except (OSError, AttributeError):
        return 0


def _landlock() -> int:
    """Deny all file-system access (and TCP, and signals out, where supported); the ABI version, 0 when unavailable."""
    abi = landlock_abi()
    if abi < 1:
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        fs = _FS_RIGHTS[max(k for k in _FS_RIGHTS if k <= abi)]
        attr = struct.pack("QQQ", fs, _NET_RIGHTS if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
        size = 8 if abi < 4 else (16 if abi < 6 else 24)
        buf = ctypes.create_string_buffer(attr[:size], size)
        fd = int(libc.syscall(_SYS_CREATE, buf, ctypes.c_size_t(size), ctypes.c_uint32(0)))
        if fd < 0:
            return 0
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(_SYS_RESTRICT, fd, ctypes.c_uint32(0)) != 0:
            return 0
        os.close(fd)
        return abi
    except (OSError, AttributeError):
        return 0


def _limit(memory_bytes: int) -> None:
    with open("/proc/self/statm") as handle:
        virtual = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (virtual + memory_bytes, virtual + memory_bytes))


def _read(stream, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError
    return data


class _Pipe:
    """A pipe seen through ``read``/``write`` only (numpy then streams it in chunks instead of seeking)."""

    def __init__(self, stream) -> None:
        self.read, self.write = getattr(stream, "read", None), getattr(stream, "write", None)


def _send(out, tag: bytes, *arrays) -> None:
    import numpy as np

    out.write(tag)
    for array in arrays:
        np.lib.format.write_array(_Pipe(out), np.ascontiguousarray(array, dtype=np.float32), allow_pickle=False)
    out.flush()


def _fail(out, code: int, text: str = "") -> None:
    data = text.encode("utf-8", errors="replace")[-2000:]
    out.write(b"E" + bytes([code]) + struct.pack("<H", len(data)) + data)
    out.flush()


def _outputs(module, has_embed: bool, x):
    import torch

    out = module(x)
    if isinstance(out, torch.Tensor):
        features = module.embed(x) if has_embed else x.new_zeros((x.shape[0], 0))
        logits = out
    elif isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(o, torch.Tensor) for o in out):
        features, logits = out
    elif isinstance(out, dict) and all(isinstance(out.get(k), torch.Tensor) for k in ("features", "logits")):
        features, logits = out["features"], out["logits"]
    else:
        return None
    return features.detach().float().flatten(1).numpy(), logits.detach().float().numpy()


def main() -> int:
    memory_bytes = int(sys.argv[1])
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing the model prints can reach the protocol stream
    import numpy as np
    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    (length,) = struct.unpack("<Q", _read(stdin, 8))
    archive = _read(stdin, length)
    _limit(memory_bytes)
    contained = _landlock() > 0
    try:
        module = torch.jit.load(io.BytesIO(archive), map_location="cpu").eval()
    except MemoryError:
        return _fail(stdout, MEMORY) or 0
    except Exception:  # noqa: BLE001 - any load failure: the parent says so without the archive's own words
        return _fail(stdout, LOAD) or 0
    del archive
    if not all(bool(torch.isfinite(v).all()) for v in module.state_dict().values() if v.is_floating_point()):
        return _fail(stdout, NONFINITE) or 0
    has_embed = hasattr(module, "embed")
    stdout.write(b"R" + bytes([has_embed, contained]))
    stdout.flush()
    while True:
        tag = stdin.read(1)
        if tag != b"X":
            return 0
        x = torch.from_numpy(np.lib.format.read_array(_Pipe(stdin), allow_pickle=False).copy())
        try:
            with torch.inference_mode():
                result = _outputs(module, has_embed, x)
        except MemoryError:
            _fail(stdout, MEMORY)
            continue
        except Exception as exc:  # noqa: BLE001 - the parent shows the model's words only to the local operator
            _fail(stdout, FORWARD, str(exc))
            continue
        if result is None:
            _fail(stdout, OUTPUT)
        else:
            _send(stdout, b"A", *result)


if __name__ == "__main__":
    sys.exit(main())
