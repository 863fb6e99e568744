"""A command's ``--json OUT``: written whole or not at all (a temporary file in the same folder, then a rename)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, *, allow_nan: bool = True) -> None:
    """Write ``data`` as indented JSON to ``path`` (its folder created); an interrupted write leaves the old file.

    ``allow_nan=False`` refuses NaN/inf (strict JSON) instead of writing them as ``NaN``/``Infinity``.
    """
    text = json.dumps(data, indent=2, allow_nan=allow_nan)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
