"""The name an experiment is stored under, checked before any work: what every database column can hold."""
from __future__ import annotations

MAX_EXPERIMENT_NAME = 200  # storage.models.Experiment.name is String(200); PostgreSQL refuses longer text


def check_experiment_name(name: str, option: str = "--name") -> str:
    """``name`` if it is 1..200 printable characters (no NUL, control or formatting characters); else ValueError."""
    if not name.strip():
        raise ValueError(f"{option} is empty; give the experiment a name")
    if len(name) > MAX_EXPERIMENT_NAME:
        raise ValueError(f"{option} has {len(name)} characters; at most {MAX_EXPERIMENT_NAME}")
    if not name.isprintable():
        bad = next(c for c in name if not c.isprintable())
        raise ValueError(f"{option} contains the unprintable character U+{ord(bad):04X}; use plain text")
    return name
