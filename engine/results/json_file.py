"""A command's ``--json OUT``: written whole or not at all (a temporary file in the same folder, then a rename).

Only a regular file is ever replaced (or a new one created): an existing device, FIFO, socket or folder is refused,
so ``--json /dev/null`` cannot turn ``/dev/null`` into a regular file. A symbolic link is followed and its target
replaced (the link stays).
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def json_target(path: Path) -> Path:
    """The file ``--json path`` will replace (links followed); ``ValueError`` when that is not a regular file or a new one."""
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except OSError as exc:
        raise ValueError(f"--json {path}: cannot be checked ({exc.strerror or type(exc).__name__})") from None
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError(f"--json {path} is {_kind(mode)}, not a regular file; give a file path (it is replaced whole)")
    for parent in target.parents:  # the nearest existing folder above it must be a folder
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"--json {path}: {parent} is not a folder")
            break
    return target


def write_json_atomic(path: Path, data: Any, *, allow_nan: bool = True) -> None:
    """Write ``data`` as indented JSON to ``path`` (its folder created); an interrupted write leaves the old file.

    ``allow_nan=False`` refuses NaN/inf (strict JSON) instead of writing them as ``NaN``/``Infinity``. A path that
    is (or links to) anything but a regular file is refused with ``ValueError`` before anything is written.
    """
    write_text_atomic(path, json.dumps(data, indent=2, allow_nan=allow_nan))


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (its folder created) whole or not at all, under :func:`write_json_atomic`'s rules."""
    path = json_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        json_target(path)  # checked again just before the rename: a device put there meanwhile is not replaced
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
