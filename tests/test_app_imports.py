"""The dashboard's Explore pages never load torch, torchvision, numba or faiss into the Streamlit process.

Every module any page or helper under ``app/`` imports (at the top or inside a function; the Learn demos
excepted, see ``app/learn/__init__.py``) is imported in a fresh interpreter and ``sys.modules`` is read; there
are no exceptions. The Geometry page's nearest-neighbour call is numpy-only
(``engine.analysis.neighbours``; ``tests/test_neighbours_torch_free.py`` calls it in a fresh interpreter).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.source_scan import imports_anywhere

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchvision", "numba", "faiss")


def app_files() -> list[Path]:
    """Every module of the dashboard but the Learn demos."""
    return sorted(p for p in (ROOT / "app").rglob("*.py") if "learn" not in p.relative_to(ROOT / "app").parts)


def imported_modules(path: Path) -> set[str]:
    """Modules a file imports anywhere (module level or inside functions), from ``engine``, ``storage``, ``app``."""
    return {m for m in imports_anywhere(path) if m.split(".")[0] in ("engine", "storage", "app") and m != "app.learn"}


def heavy_after_import(module: str) -> list[str]:
    """The heavy modules in ``sys.modules`` after importing ``module`` in a fresh interpreter."""
    code = (f"import importlib, json, sys; importlib.import_module({module!r}); "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""}, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_scan_sees_the_pages_and_their_imports():
    files = {str(p.relative_to(ROOT)) for p in app_files()}
    assert {"app/main.py", "app/queries.py", "app/app_pages/compatibility.py", "app/app_pages/geometry.py"} <= files
    assert not any("learn" in f for f in files)
    assert "engine.core.contract" in imported_modules(ROOT / "app" / "queries.py")


@pytest.mark.parametrize("module", sorted({m for p in app_files() for m in imported_modules(p)} | {"app.main"}))
def test_app_imports_load_no_torch(module):
    users = sorted(str(p.relative_to(ROOT)) for p in app_files() if module in imported_modules(p))
    heavy = heavy_after_import(module)
    assert heavy == [], f"importing {module} (used by {', '.join(users) or 'the router'}) loads {heavy}"
