"""Every ``COMPATLAB_*`` environment variable, declared once: its name, default, how it is read and checked, and
what it means (:data:`SETTINGS`); :func:`read_setting` is the one reader, and a bad value is one line naming it.

Why here: ``storage`` is the bottom layer that the engine, the dashboard and ``run_app.py`` all import, and it
imports nothing from above (``tests/test_floors.py``), while three of the variables are storage's own (the
database, the feature store and its dtype). ``engine.core`` may not load SQLAlchemy when it is imported (which
importing ``storage`` does), so its one reader, ``engine.core.threads.requested``, imports this module inside the
function, as ``engine.core.config`` does with ``storage.name_problem``; ``engine.core.threads.THREADS_ENV`` spells
the name for the children's environment and ``tests/test_settings.py`` checks it equals :data:`THREADS`'s.
This module itself is stdlib only. The README's table of variables is :func:`markdown_table` (checked by a test).
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class SettingError(ValueError):
    """A variable holds a value it cannot take; the message is one line naming the variable and the value."""


@dataclass(frozen=True)
class Setting:
    """One variable: ``parse`` turns its (stripped, non-empty) text into a value or raises ValueError; unset or empty
    it is ``default``. ``must_be`` finishes "$NAME must be ..." in the error; ``shown_default`` is the README's."""

    name: str
    parse: Callable[[str], Any]
    must_be: str
    meaning: str
    default: Any = None
    shown_default: str = "unset"


def _text(raw: str) -> str:
    return raw


def _folders(raw: str) -> tuple[str, ...]:
    return tuple(p for p in raw.split(os.pathsep) if p.strip())


def _flag(raw: str) -> bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _seconds(raw: str) -> float:
    value = float(raw)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(raw)
    return value


def _whole(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(raw)
    return value


def _dtype(raw: str) -> str:
    if raw.lower() != "float16":
        raise ValueError(raw)
    return "float16"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """``"2GB"``, ``"500M"``, ``"1.5g"`` or a number of bytes -> bytes (powers of 1000); ValueError (one line)."""
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


_HOST = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:\d{1,5})?$|^\[[0-9a-f:.]+\](:\d{1,5})?$")


def _hosts(raw: str) -> tuple[str, ...]:
    """Comma-separated ``host`` or ``host:port`` entries, lower-cased; ValueError on anything else (a scheme, a path)."""
    out = tuple(h.strip().lower() for h in raw.split(",") if h.strip())
    if not all(_HOST.match(h) for h in out):
        raise ValueError(raw)
    return out


_SECONDS = "a positive number of seconds"
DB_URL = Setting("COMPATLAB_DB_URL", _text, "a database URL",
                 "the database every process uses (`--db URL` on `run_app.py` sets it for its children)",
                 shown_default="`sqlite:///data/compatlab.db` (from the current directory)")
DATA_ROOTS = Setting("COMPATLAB_DATA_ROOTS", _folders, "folders separated by `os.pathsep`",
                     "folders the server may also read data from, besides `./data` and the SQLite file's folder "
                     "(`--data-root DIR` adds to it)", default=())
ALLOW_TORCHSCRIPT = Setting("COMPATLAB_ALLOW_TORCHSCRIPT", _flag, "1 (yes) or 0 (no)",
                            "dashboard jobs may run TorchScript archives, each contained (`--allow-torchscript`)",
                            default=False, shown_default="0")
FEATURE_STORE = Setting("COMPATLAB_FEATURE_STORE", _text, "a folder or s3://bucket/prefix",
                        "where new feature sets are written (see \"Where features live\" in docs/design.md)",
                        shown_default="`features/` beside a SQLite file; in SQL rows otherwise")
FEATURE_DTYPE = Setting("COMPATLAB_FEATURE_DTYPE", _dtype, "empty (store as given) or 'float16'",
                        "`float16` stores features at half size, read back as float32",
                        shown_default="unset (as extracted: float32)")
HEARTBEAT_S = Setting("COMPATLAB_HEARTBEAT_S", _seconds, _SECONDS,
                      "how often a worker's heartbeat marks its running jobs alive", default=5.0, shown_default="5")
STALE_AFTER_S = Setting("COMPATLAB_STALE_AFTER_S", _seconds, _SECONDS,
                        "a running job without a heartbeat for this long is failed as stale", default=60.0,
                        shown_default="60")
MAX_ARRAY_BYTES = Setting("COMPATLAB_MAX_ARRAY_BYTES", _whole, "a whole number of bytes (1 or more)",
                          "the largest array `evaluate-folder` reads from one `.npz` file", default=4 * 1024**3,
                          shown_default="4294967296 (4 GiB)")
MAX_CHECKPOINT_BYTES = Setting("COMPATLAB_MAX_CHECKPOINT_BYTES", parse_size,
                               "a size such as 2GB, 500MB or a number of bytes",
                               "the largest checkpoint a dashboard job reads (`--max-checkpoint-size`); a request "
                               "can only lower it", default=2_000_000_000, shown_default="2GB")
SECRET = Setting("COMPATLAB_SECRET", _text, "a text of at least 16 characters (`app.gate.check_secret` checks it)",
                 "the shared secret dashboard visitors must enter; needed to listen beyond this machine "
                 "(`--secret-file PATH`)")
TEXT_CACHE = Setting("COMPATLAB_TEXT_CACHE", _text, "a folder inside the data roots",
                     "where text comparisons keep the embeddings they computed, one `.npy` per encoder and list of "
                     "texts (`compare-checkpoints --no-cache` neither reads nor writes it)",
                     shown_default="`cache/text-embeddings/` in the first data root (`./data`)")
ALLOW_HOSTS = Setting("COMPATLAB_ALLOW_HOSTS", _hosts, "host names or host:port, separated by commas",
                      "the hosts a dashboard job may connect to when it reads a team's store (`--allow-host HOST[:PORT]` "
                      "adds one); none by default, so the browser can make the server contact no host",
                      default=(), shown_default="unset (none)")
THREADS = Setting("COMPATLAB_THREADS", _whole, "a whole number of threads (1 or more)",
                  "torch / BLAS / numba threads of every process (`--threads N`)",
                  shown_default="unset (`cores // processes`, or the libraries' own)")
DASK_SCHEDULER = Setting("COMPATLAB_DASK_SCHEDULER", _text, "`tcp://HOST:PORT`, `local:N` or `in-process` "
                         "(`engine.core.cluster` checks it)",
                         "where a fan-out runs, as `--cluster` (which replaces it): a running Dask scheduler, a "
                         "LocalCluster of N worker processes, or this process", shown_default="unset (in-process)")

SETTINGS: dict[str, Setting] = {s.name: s for s in (
    DB_URL, DATA_ROOTS, ALLOW_TORCHSCRIPT, FEATURE_STORE, FEATURE_DTYPE, HEARTBEAT_S, STALE_AFTER_S,
    MAX_ARRAY_BYTES, MAX_CHECKPOINT_BYTES, SECRET, TEXT_CACHE, ALLOW_HOSTS, THREADS, DASK_SCHEDULER)}


def read_setting(setting: Setting, environ: Mapping[str, str] | None = None) -> Any:
    """``setting``'s value from ``environ`` (default: this process's environment), ``setting.default`` when it is
    unset or blank; :class:`SettingError` (one line) when the value cannot be parsed."""
    raw = (os.environ if environ is None else environ).get(setting.name, "").strip()
    if not raw:
        return setting.default
    try:
        return setting.parse(raw)
    except ValueError:
        raise SettingError(f"${setting.name} must be {setting.must_be}, got {raw!r}") from None


def check_all(environ: Mapping[str, str] | None = None) -> None:
    """Read every declared variable; :class:`SettingError` for the first bad one (servers check at start)."""
    for setting in SETTINGS.values():
        read_setting(setting, environ)


def markdown_table() -> str:
    """The README's table of the variables, one row per declaration."""
    rows = ["| Variable | Value | Default | Meaning |", "|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.must_be} | {s.shown_default} | {s.meaning} |" for s in SETTINGS.values()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
