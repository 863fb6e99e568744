"""Where the server may read files from (the data roots), and whether it may run TorchScript; no torch here.

Every server path that a browser user or a worker job can name (image folders, checkpoint paths,
class-list files, dataset roots of configs) goes through :func:`confine` before anything reads it:
the path is made absolute (from the current directory), ``~``, ``..`` and symlinks are resolved
(``os.path.realpath``), and a path outside every data root is refused with one line that names the
path and the roots, never what the folder holds.

The data roots are the project's ``./data`` folder, the folder of the SQLite database named by
``$COMPATLAB_DB_URL`` (where ``run_app.py`` keeps checkpoints and uploads), and every folder in
``$COMPATLAB_DATA_ROOTS`` (``os.pathsep``-separated), which ``--data-root DIR`` (repeatable, on
``run_app.py`` and on every ``python -m engine`` command that reads data) extends.

Who is confined: the dashboard and the worker confine every path; the command line confines
dataset roots and image folders too (the same loaders serve both), widened with ``--data-root``;
checkpoint files and class lists given on the command line (``compare-checkpoints --model PATH``)
are the local operator's own and are not confined.

``$COMPATLAB_ALLOW_TORCHSCRIPT=1`` (``--allow-torchscript`` on ``run_app.py`` or ``worker``) lets
dashboard jobs run TorchScript archives, contained (``engine.checkpoints.sandbox``); by default
they are refused, since an archive is a program, not weights.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from storage.safe_open import inside_roots
from storage.settings import ALLOW_HOSTS, ALLOW_TORCHSCRIPT, DATA_ROOTS, DB_URL, read_setting

ROOTS_ENV = DATA_ROOTS.name
TORCHSCRIPT_ENV = ALLOW_TORCHSCRIPT.name
HOSTS_ENV = ALLOW_HOSTS.name


class OutsideRootsError(ValueError):
    """A path outside every data root; the message is one line and lists nothing from the disk."""


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(Path(os.path.expanduser(str(path))).absolute()))


def sqlite_folder(url: str) -> Path | None:
    """The resolved folder of a SQLite URL's database file; None for other backends, memory or a bad URL."""
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:" or database.startswith("file:"):
        return None
    return _real(database).parent


def data_roots() -> tuple[Path, ...]:
    """The configured data roots, resolved, without duplicates (see the module docstring)."""
    roots = [_real("data")]
    folder = sqlite_folder(read_setting(DB_URL) or "")
    if folder is not None:
        roots.append(folder)
    roots += [_real(p) for p in read_setting(DATA_ROOTS)]
    return tuple(dict.fromkeys(roots))


def confine(path: str | Path, *, what: str = "path") -> Path:
    """``path`` resolved (absolute, symlinks and ``..`` followed); ``OutsideRootsError`` when outside the data roots.

    Nothing under ``path`` is opened or listed before the check; the error names the path and the roots only.
    """
    text = str(path).strip()
    if not text or "\x00" in text:
        raise OutsideRootsError(f"{what} {text!r} is not a path")
    real, roots = _real(text), data_roots()
    if not inside_roots(real, roots):
        raise OutsideRootsError(
            f"{what} {text} is outside the data roots ({', '.join(map(str, roots))}), so it is not read; the server's "
            f"operator can add a folder with --data-root DIR (or ${ROOTS_ENV})")
    return real


def torchscript_allowed() -> bool:
    """Whether dashboard jobs may run TorchScript archives (``--allow-torchscript`` / ``$COMPATLAB_ALLOW_TORCHSCRIPT=1``)."""
    return read_setting(ALLOW_TORCHSCRIPT)


def add_arguments(parser: argparse.ArgumentParser, *, torchscript: bool = False) -> None:
    """``--data-root DIR`` (repeatable) and, for servers, ``--allow-torchscript``."""
    parser.add_argument("--data-root", action="append", dest="data_roots", metavar="DIR", default=None,
                        help=f"also read data (image folders, dataset roots, checkpoints) from DIR (repeatable; "
                             f"default: ./data and the SQLite database's folder; ${ROOTS_ENV} adds more)")
    if torchscript:
        parser.add_argument("--allow-torchscript", action="store_true",
                            help="let dashboard jobs run TorchScript archives (programs, not weights), each in a "
                                 "contained child process; refused by default")
        parser.add_argument("--allow-host", action="append", dest="allow_hosts", metavar="HOST[:PORT]", default=None,
                            help=f"a host dashboard jobs may connect to when they read a team's store (repeatable; "
                                 f"none by default; ${HOSTS_ENV} adds more)")


def export(args: argparse.Namespace) -> None:
    """Put ``--data-root`` (and a ``--db`` SQLite file's folder) and ``--allow-torchscript`` into this process's
    environment, which its children inherit."""
    extra = [str(_real(p)) for p in getattr(args, "data_roots", None) or []]
    folder = sqlite_folder(getattr(args, "db", None) or "")  # --db: that database's folder, as $COMPATLAB_DB_URL's
    if folder is not None:
        extra.append(str(folder))
    if extra:
        current = list(read_setting(DATA_ROOTS))
        os.environ[ROOTS_ENV] = os.pathsep.join(dict.fromkeys(current + extra))
    if getattr(args, "allow_torchscript", False):
        os.environ[TORCHSCRIPT_ENV] = "1"
    hosts = [h.strip().lower() for h in getattr(args, "allow_hosts", None) or [] if h.strip()]
    if hosts:
        os.environ[HOSTS_ENV] = ",".join(dict.fromkeys([*read_setting(ALLOW_HOSTS), *hosts]))
        read_setting(ALLOW_HOSTS)  # a malformed host is one line now, not in a child
