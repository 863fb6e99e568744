"""Run a TorchScript archive contained: a scan of its code first, then a separate, limited process.

TorchScript is a program: its ``forward`` can call tensor ops that take a path (``torch.from_file``
reads or, with ``shared=True``, creates and overwrites a file) or allocate without bound. Two layers
keep that away from the server:

1. **The process (the layer that holds).** The archive runs in a fresh interpreter
   (``python -I sandbox_child.py``, started with ``subprocess``, never a fork of the worker with its
   database connections) in an empty temporary folder, with RLIMIT_FSIZE=0 (no file can be written
   or grown), RLIMIT_AS (its memory, ``memory_bytes`` over what torch itself maps), no core dumps,
   and, where the kernel has Landlock (Linux >= 5.13), no file-system access at all, no TCP and no
   signals to other processes. The archive is sent as bytes on stdin; batches go in and come back
   as raw float32 ``.npy`` arrays (``allow_pickle=False``; shapes and sizes checked from the
   header before the data is read). Errors are fixed sentences chosen by the parent from a code;
   the child's stderr is discarded and its exception texts are shown only to the command line's
   operator running their own file (``model_errors``), so nothing a model reads reaches the dashboard.
2. **The scan (a second layer).** Before the archive is run, the TorchScript source in its
   ``code/`` entries is searched for ops that touch files or reach outside torch
   (:data:`FORBIDDEN`); a match refuses the archive. A deny-list cannot be complete; it is there to
   refuse the known attacks early with a clear message, the process is what contains the unknown.
"""
from __future__ import annotations

import os
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import weakref
import zipfile
from pathlib import Path

import numpy as np

SANDBOX_MEMORY_BYTES = 4_000_000_000
REQUEST_TIMEOUT_S = 600.0
MAX_OUTPUT_VALUES = 1 << 28  # per returned array (1 GiB of float32)
CHILD = Path(__file__).with_name("sandbox_child.py")
_CODES = {1: "cannot be loaded as TorchScript (a corrupt or incompatible archive)",
          2: "has NaN/inf weights",
          3: "its forward raised an error (the dashboard does not show a model's own messages: run it with "
             "'python -m engine compare-checkpoints' on your machine to see it)",
          4: "its forward returned something other than logits, a (features, logits) pair or a dict with "
             "'features' and 'logits'",
          5: "exceeded the memory limit of the contained TorchScript process"}

# Ops whose presence in an archive's TorchScript source refuses it (a second layer; see the module docstring).
FORBIDDEN = {
    r"\bfrom_file\b": "torch.from_file (reads or writes a file)",
    r"\btorch\.(load|save)\b": "torch.load/torch.save (file access)",
    r"(?<![\w.])open\s*\(": "open() (file access)",
    r"\bops\.(?!aten\b|prim\b)\w+": "a custom torch.ops namespace (code outside torch)",
    r"\btorch\.classes\.": "a custom TorchScript class (code outside torch)",
    r"\b_load_for_mobile\b|\bjit\.load\b": "loading another archive",
}
MAX_CODE_BYTES = 50_000_000


class SandboxError(ValueError):
    """A TorchScript archive refused or failed in its contained process; the message is one sentence."""


def scan_archive(path: Path) -> None:
    """Refuse an archive whose TorchScript code calls a :data:`FORBIDDEN` op (``SandboxError`` naming it)."""
    with zipfile.ZipFile(path) as archive:
        code = [i for i in archive.infolist() if "/code/" in i.filename and not i.filename.endswith("/")]
        if sum(i.file_size for i in code) > MAX_CODE_BYTES:
            raise SandboxError(f"its TorchScript code is over {MAX_CODE_BYTES // 1_000_000} MB")
        for info in code:
            text = archive.read(info).decode("utf-8", errors="replace")
            what = next((v for pattern, v in FORBIDDEN.items() if re.search(pattern, text)), None)
            if what is not None:
                raise SandboxError(f"its TorchScript code calls {what}, which a model has no reason to do; refused "
                                   "without running it")


class SandboxedScript:
    """A TorchScript archive loaded in its own contained process; call it with a batch to get (features, logits).

    ``require_landlock``: refuse to run it where the kernel cannot deny the process file access (the
    resource limits alone do not stop ``from_file(shared=True)`` from overwriting an existing file).
    ``model_errors``: pass on the last line of the model's own exception (for the local operator's
    files only: a hostile model can put anything it read into that text).
    """

    def __init__(self, path: Path, *, memory_bytes: int = SANDBOX_MEMORY_BYTES, timeout_s: float = REQUEST_TIMEOUT_S,
                 require_landlock: bool = True, model_errors: bool = False) -> None:
        self.timeout_s, self.model_errors = timeout_s, model_errors
        self._folder = tempfile.TemporaryDirectory(prefix="compatlab-ts-")
        os.chmod(self._folder.name, 0o500)  # empty and read-only, also where Landlock is missing
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4"),
               "LANG": "C.UTF-8"}
        self._proc = subprocess.Popen([sys.executable, "-I", str(CHILD), str(memory_bytes)], cwd=self._folder.name,
                                      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      close_fds=True, start_new_session=True)
        self._closer = weakref.finalize(self, _stop, self._proc, self._folder)
        data = path.read_bytes()
        self._write(struct.pack("<Q", len(data)) + data)
        del data
        tag = self._read(1)
        if tag == b"E":
            self._error()
        if tag != b"R":
            self._died()
        flags = self._read(2)
        self.has_embed, self.contained = bool(flags[0]), bool(flags[1])
        if require_landlock and not self.contained:
            self.close()
            raise SandboxError("cannot be contained on this server: its kernel has no Landlock (Linux >= 5.13 with "
                               "landlock enabled), so a TorchScript model could read and write the server's files; "
                               "refused")

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Features ``(batch, d)`` (d may be 0) and logits ``(batch, classes)`` of a float32 batch."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        self._write(b"X" + _npy_bytes(x))
        tag = self._read(1)
        if tag == b"E":
            self._error()
        if tag != b"A":
            self._died()
        features, logits = self._array(len(x)), self._array(len(x))
        if logits.ndim != 2 or logits.shape[1] < 1:
            raise SandboxError(f"gives logits of shape {logits.shape}; expected (batch, classes)")
        return features, logits

    def close(self) -> None:
        self._closer()

    # --- the pipe ---

    def _write(self, data: bytes) -> None:
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._died()

    def _read(self, n: int) -> bytes:
        chunks, fd, left = [], self._proc.stdout.fileno(), n
        while left:
            ready, _, _ = select.select([fd], [], [], self.timeout_s)
            if not ready:
                self.close()
                raise SandboxError(f"did not answer within {self.timeout_s:.0f} s in its contained process; stopped")
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                self._died()
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _array(self, batch: int) -> np.ndarray:
        import io

        prefix = self._read(8)
        if prefix[:6] != b"\x93NUMPY" or prefix[6] not in (1, 2):
            self._malformed()
        size = self._read(2 if prefix[6] == 1 else 4)
        length = int.from_bytes(size, "little")
        if length > 4096:
            self._malformed()
        header = io.BytesIO(prefix + size + self._read(length))
        np.lib.format.read_magic(header)
        try:
            read = np.lib.format.read_array_header_1_0 if prefix[6] == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(header)
        except ValueError:
            self._malformed()
        if dtype != np.float32 or fortran or len(shape) != 2 or shape[0] != batch or shape[1] > MAX_OUTPUT_VALUES // max(batch, 1):
            self.close()
            raise SandboxError(f"returned outputs of shape {shape} for a batch of {batch}; expected (batch, n)")
        return np.frombuffer(self._read(int(np.prod(shape)) * 4), dtype=np.float32).reshape(shape).copy()

    def _malformed(self) -> None:
        self.close()
        raise SandboxError("answered with a malformed array; stopped")

    def _error(self) -> None:
        code = self._read(1)[0]
        (length,) = struct.unpack("<H", self._read(2))
        text = self._read(length).decode("utf-8", errors="replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if self.model_errors and code == 3 and lines:
            raise SandboxError(re.sub(r"^\w+(Error|Exception): ", "", lines[-1])[:300])
        raise SandboxError(_CODES.get(code, "failed in its contained process"))

    def _died(self) -> None:
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self.close()
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            why = {"SIGXFSZ": ": it tried to write a file, which is not allowed",
                   "SIGKILL": ", probably for using too much memory",
                   "SIGSEGV": ", probably for using too much memory or a crash inside torch"}.get(name, "")
            raise SandboxError(f"its contained TorchScript process was stopped by {name}{why}")
        raise SandboxError(f"its contained TorchScript process ended unexpectedly (exit code {code})")


def _npy_bytes(x: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, x, allow_pickle=False)
    return buffer.getvalue()


def _stop(proc: subprocess.Popen, folder: tempfile.TemporaryDirectory) -> None:
    if proc.poll() is None:
        try:
            proc.stdin.write(b"Q")
            proc.stdin.close()
            proc.wait(timeout=2)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except (OSError, ValueError):
            pass
    os.chmod(folder.name, 0o700)
    folder.cleanup()
