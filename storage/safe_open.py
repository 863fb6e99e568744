"""Open a user's data file for reading: a regular file inside the given roots, checked after opening (torch-free).

:func:`open_regular` opens without blocking (``O_NONBLOCK``: a FIFO with no writer does not hang the open), then
looks at what was opened, not at the path: ``fstat`` must say a regular file (FIFOs, sockets and devices such as
``/dev/zero`` are refused at once), and the opened file's own path (``/proc/self/fd/N``; elsewhere the resolved
path whose device and inode must match the descriptor) must lie inside a root. A symlink swapped between the check
and the open cannot redirect the read: nothing is read before the descriptor is checked. Reads then stop at the
size the file had when it was opened (a file that grows while read is not followed), and ``max_bytes`` refuses a
larger file before reading. Every refusal is a one-line :class:`UnsafeFileError` naming the path, never its content.
"""
from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO



def inside_roots(path: Path, roots: tuple[Path, ...]) -> bool:
    """Whether the resolved ``path`` is a root or lies under one."""
    return any(path == root or root in path.parents for root in roots)


class UnsafeFileError(ValueError):
    """A file that is not read: not a regular file, outside the roots, or too large; the message is one line."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _opened_path(fd: int, path: str, st: os.stat_result) -> Path | None:
    """The resolved path of the file behind ``fd`` (None when it cannot be told)."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        real = os.path.realpath(path)
        try:
            now = os.stat(real)
        except OSError:
            return None
        return Path(real) if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) else None


class _Capped(io.RawIOBase):
    """A raw reader that ends at ``limit`` bytes (the size the file had when it was opened)."""

    def __init__(self, raw: io.FileIO, limit: int) -> None:
        super().__init__()
        self.raw, self.limit = raw, limit

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:
            return self.raw.seek(self.limit + offset)
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        left = self.limit - self.raw.tell()
        if left <= 0:
            return 0
        view = memoryview(buffer).cast("B")
        return self.raw.readinto(view[:min(len(view), left)]) or 0

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        self.raw.close()
        super().close()


def open_regular(path: str | Path, *, roots: Iterable[str | Path] | None, what: str = "file",
                 max_bytes: int | None = None) -> BinaryIO:
    """``path`` opened for binary reading (see the module docstring); ``roots=None``: anywhere (the operator's own
    file), still a regular file only. ``UnsafeFileError`` (a ``ValueError``) when refused, ``OSError`` when absent
    or unreadable."""
    text = os.fspath(path)
    if "\x00" in text:
        raise UnsafeFileError(f"{what} {text!r} is not a path")
    fd = os.open(text, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(f"{what} {text} is {_kind(st.st_mode)}, not a regular file, so it is not read")
        if roots is not None:
            resolved = tuple(Path(os.path.realpath(r)) for r in roots)
            opened = _opened_path(fd, text, st)
            if opened is None or not inside_roots(opened, resolved):
                raise UnsafeFileError(f"{what} {text} leads outside {', '.join(map(str, resolved)) or 'the roots'} "
                                      f"(a symlink?), so it is not read")
        if max_bytes is not None and st.st_size > max_bytes:
            raise UnsafeFileError(f"{what} {text} holds {st.st_size} bytes, above the {max_bytes}-byte limit, so it "
                                  f"is not read")
        os.set_blocking(fd, True)
        raw = io.FileIO(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise
    return io.BufferedReader(_Capped(raw, st.st_size))  # type: ignore[return-value]


def read_regular(path: str | Path, *, roots: Iterable[str | Path] | None, what: str = "file",
                 max_bytes: int | None = None) -> bytes:
    """The whole content of ``path`` opened by :func:`open_regular` (same checks and errors)."""
    with open_regular(path, roots=roots, what=what, max_bytes=max_bytes) as handle:
        return handle.read()
