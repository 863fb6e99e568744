"""A source's text: its kind, its location and its options; credentials masked in every message (torch-free).

One syntax for every kind: ``[KIND:]LOCATION[#key=value&key=value]``. ``KIND`` is one of :data:`KINDS`; without
it the kind is recognised from the location (see :func:`parse`). Option values are percent-decoded (``%26`` for
``&``, ``%23`` for ``#``; ``+`` stays a plus), so a SQL query fits: ``sql:sqlite:///data/e.db#query=SELECT id,
emb AS vector FROM items``. The options each kind reads are listed in ``engine/sources/__init__.py``.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from engine.core.kinds import SOURCES
from engine.data.roots import OutsideRootsError, confine
from storage.secrets import SECRET_REF, mask_url

KINDS = tuple(SOURCES)
SQL_SCHEMES = ("postgresql", "postgres", "sqlite", "mysql", "mariadb", "oracle", "mssql")
ARROW_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".arrow": "ipc", ".feather": "ipc", ".ipc": "ipc"}


class SourceError(ValueError):
    """A source that cannot be read as asked; the message is one line, credentials masked."""


@dataclass(frozen=True)
class SourceText:
    kind: str
    location: str
    options: dict[str, str] = field(default_factory=dict)

    def masked(self) -> str:
        """The text as a message shows it: passwords and secret options replaced by ``***``."""
        opts = "&".join(f"{k}={v}" for k, v in self.options.items())
        return mask_url(f"{self.kind}:{self.location}" + (f"#{opts}" if opts else ""))

    def option(self, key: str, default: str | None = None) -> str | None:
        return self.options.get(key, default)


def resolve_secrets(text: str) -> str:
    """``text`` with each ``${SOURCE_SECRET_NAME}`` replaced by that variable of this process's environment (the
    worker's, for a job): a stored payload names its secrets, never holds them. One line when one is not set."""
    import os

    def value(m: re.Match) -> str:
        if m.group(1) not in os.environ:
            raise SourceError(f"the source names the secret ${{{m.group(1)}}}, which this process's environment does "
                              "not set (the worker reads it from its own environment)")
        return os.environ[m.group(1)]

    return SECRET_REF.sub(value, text)


def split_options(text: str) -> tuple[str, dict[str, str]]:
    """``LOCATION#k=v&k=v`` -> (location, options); the last ``#`` that starts options splits."""
    if "#" not in text:
        return text, {}
    location, _, tail = text.partition("#")
    options: dict[str, str] = {}
    for part in tail.split("&"):
        if not part:
            continue
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise SourceError(f"option {part!r} in the source text is not key=value (options: #key=value&key=value)")
        options[unquote(key).strip()] = unquote(value)
    return location, options


def parse(text: str) -> SourceText:
    """The kind, location and options of a source text; :class:`SourceError` when the kind cannot be told."""
    text = text.strip()
    if not text:
        raise SourceError("the source is empty; give a path or URL, optionally prefixed with one of "
                          + ", ".join(f"{k}:" for k in KINDS))
    prefix, colon, rest = text.partition(":")
    if colon and prefix in KINDS:
        location, options = split_options(rest)
        return SourceText(prefix, location.strip(), options)
    location, options = split_options(text)
    return SourceText(recognise(location), location.strip(), options)


def recognise(location: str) -> str:
    """The kind a location names by its scheme or suffix (a local folder by what it holds)."""
    scheme = location.split("://", 1)[0].split("+")[0].lower() if "://" in location else ""
    if scheme in SQL_SCHEMES:
        return "sql"
    stem = location.rstrip("/").lower()
    suffix = Path(stem).suffix
    if suffix in (".npz", ".npy"):
        return suffix[1:]
    if suffix in ARROW_SUFFIXES:
        return "parquet"
    if suffix == ".lance":
        return "lance"
    if not scheme:
        folder = local_path(location, what="source")  # confined before anything under it is listed
        if (folder / "meta.json").is_file() and (folder / "collection").is_dir():
            return "qdrant"
        if folder.is_dir() and any(p.suffix == ".lance" for p in folder.iterdir()):
            return "lance"
        if folder.is_dir() and any(p.suffix in ARROW_SUFFIXES for p in folder.rglob("*")):
            return "parquet"
    raise SourceError(f"cannot tell what kind of source {mask_url(location)} is; prefix it with one of "
                      + ", ".join(f"{k}:" for k in KINDS))


# remote stores a URL may name (memory://: the process's own in-memory filesystem, which reaches no file)
URL_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss", "http", "https", "memory")


def is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def check_url(location: str, *, what: str) -> None:
    """A remote location must name a remote store by one allow-listed scheme (:data:`URL_SCHEMES`), never an fsspec
    chain (``simplecache::file://``) or a scheme that reads local files (``local://``, ``zip://``, ``reference://``
    ...): local files are plain paths or ``file://`` inside the data roots. One line otherwise."""
    if "::" in location:
        raise SourceError(f"{what} {mask_url(location)} chains URLs (::); give one plain path or one remote URL")
    scheme = location.split("://", 1)[0].lower()
    if scheme not in URL_SCHEMES:
        raise SourceError(f"{what} {mask_url(location)}: the scheme {scheme}:// is not read; give a plain path or "
                          f"file:// inside the data roots, or a URL of {', '.join(f'{x}://' for x in URL_SCHEMES)}")


def local_members(folder: Path, suffixes: set[str] | dict[str, str], *, what: str) -> list[str]:
    """The files under a local dataset ``folder`` with one of ``suffixes``, each resolved (links followed, each
    folder once; names starting with ``.`` or ``_`` skipped, as pyarrow's discovery does) and checked: a regular file
    inside the data roots, else one line (a member that is a link leading out of the roots is refused, not read)."""
    out, seen = [], set()
    for root, dirs, names in os.walk(folder, followlinks=True):
        real_root = os.path.realpath(root)
        if real_root in seen:  # a link back up the tree: each folder once
            dirs[:] = []
            continue
        seen.add(real_root)
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]  # pyarrow's own discovery skips these too
        for name in sorted(dirs) + sorted(n for n in names if not n.startswith((".", "_"))):
            path = Path(root) / name
            try:
                real = confine(path, what=f"{what} member")
            except OutsideRootsError as exc:
                raise SourceError(str(exc)) from exc
            if name in names and Path(name).suffix.lower() in suffixes:
                if not real.is_file():
                    raise SourceError(f"{what} member {path} is not a regular file")
                out.append(str(real))
        dirs.sort()
    return out


def local_path(location: str, *, what: str) -> Path:
    """A local location (a plain path or ``file://``) resolved and confined to the data roots."""
    if location.startswith("file://"):
        location = unquote(urlsplit(location).path)
    try:
        return confine(location, what=what)
    except OutsideRootsError as exc:
        raise SourceError(str(exc)) from exc


def first_line(exc: BaseException) -> str:
    """An exception's first line, passwords masked (what a reader's failure shows)."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return mask_url(lines[0].strip())
