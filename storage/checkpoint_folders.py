"""Where a database's checkpoints live, and the file a stored ``checkpoint_path`` names (torch-free).

Every trained step is saved to ``<root>/experiment_<id>/step_<t>.safetensors``. Experiment ids are per database,
so the root belongs to the database, or two databases overwrite each other's checkpoints (and the geometry and
probe pages of one read the other's models). :func:`checkpoint_root` is the one rule the writer (``engine.run.
pipeline``, through ``run`` and ``worker``) and ``run_app.py`` use (it sits in ``storage`` beside the feature
store's own "beside the database" rule, so every floor of the engine and the app may import it):

* ``--checkpoints DIR`` (``RunContext.checkpoint_dir``): DIR, as the operator chose it;
* a SQLite file ``F`` in folder ``D``: ``D/checkpoints/F`` (``data/compatlab.db`` -> ``data/checkpoints/compatlab.db/``),
  beside the database, so the pair moves and is backed up together and two files in one folder stay apart;
* any other database (PostgreSQL, in-memory SQLite): ``data/checkpoints/<backend>-<16 hex>``, the first 16 hex
  digits of the SHA-256 of the URL with its password masked (so a changed password keeps the folder and the
  folder name shows no secret).

A model version records the absolute path of its file. Readers go through :func:`stored_checkpoint`: an absolute
path is the file; a relative one was written before this rule (``data/checkpoints/experiment_<id>/...`` from the
directory the run started in) and is read from the current directory, as it always was.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from sqlalchemy import make_url

DATA_ROOT = Path("data")


def _url_text(db_url: Any) -> str:
    """The URL as text; a SQLAlchemy ``URL`` with its password shown, since the folder of a SQLite file needs it whole."""
    render = getattr(db_url, "render_as_string", None)
    return render(hide_password=False) if render is not None else str(db_url)


def checkpoint_root(db_url: Any, configured: Path | None = None) -> Path:
    """The folder that holds the ``experiment_<id>`` folders of the database at ``db_url`` (text or ``URL``)."""
    if configured is not None:
        return Path(configured)
    parsed = make_url(_url_text(db_url))
    database = parsed.database or ""
    if parsed.get_backend_name() == "sqlite" and database and database != ":memory:" and not database.startswith("file:"):
        file = Path(os.path.realpath(Path(database).expanduser().absolute()))
        return file.parent / "checkpoints" / file.name
    masked = parsed.render_as_string(hide_password=True)
    return DATA_ROOT / "checkpoints" / f"{parsed.get_backend_name()}-{hashlib.sha256(masked.encode()).hexdigest()[:16]}"


def experiment_checkpoints(db_url: Any, experiment_id: int, configured: Path | None = None) -> Path:
    """The folder of experiment ``experiment_id``'s step checkpoints in the database at ``db_url``."""
    return checkpoint_root(db_url, configured) / f"experiment_{int(experiment_id)}"


def stored_checkpoint(path: str | None) -> Path | None:
    """The existing file a model version's ``checkpoint_path`` names, or None (none recorded, or the file is gone)."""
    if not path:
        return None
    file = Path(path)
    return file if file.is_file() else None
