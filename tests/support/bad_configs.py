"""Shared by several test modules; moved from tests/test_bad_configs.py."""
import copy
import math

from sqlalchemy import func, select

from storage import session_scope
from storage.models import Base

BASE = {"name": "bad", "methods": ["independent"], "dataset": {"name": "digits"},
        "scenario": {"initial_classes": 5, "increment": 5, "num_steps": 2}, "model": {"width": 8}, "training": {"epochs": 1}}


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v + '"'
    if isinstance(v, list):
        return "[" + ", ".join(map(_toml_value, v)) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def _toml(data: dict) -> str:
    top = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict) or k == "method_params"]
    sections = [f"[{k}]\n" + "\n".join(f"{kk} = {_toml_value(vv)}" for kk, vv in v.items())
                for k, v in data.items() if isinstance(v, dict) and k != "method_params"]
    return "\n".join(top) + "\n" + "\n".join(sections) + "\n"


def _with(**over) -> dict:
    data = copy.deepcopy(BASE)
    for key, value in over.items():
        section, _, name = key.rpartition("__")
        target = data.setdefault(section, {}) if section else data
        target.pop(name) if value is None else target.__setitem__(name, value)
    return data


def _counts(db) -> dict[str, int]:
    with session_scope(db) as s:
        return {t.name: s.scalar(select(func.count()).select_from(t)) for t in Base.metadata.sorted_tables}

