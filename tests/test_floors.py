"""The engine's floors: each floor imports only the floors below it (``../shared/STYLE.md``, docs/design.md "Layout").

Every import of every engine module counts, at the top of the file or inside a function (a lazy import is an
arrow too). Floor 0 ``engine.core`` is torch-free and imports nothing else of the engine; floor 1 holds the
kernels, each importing only core and the kernels before it in :data:`KERNELS`; floor 2 the shared middle
(results, evaluation, the task mechanism); floor 3 the stages, which never import the job layer or each other
(``upgrade``, the use case on top, may use ``analysis`` and ``checkpoints``); floor 4 the entry points, among them
``read``, the dashboard's door (it never imports the job layer or the CLI). ``storage`` imports nothing from the engine.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("data", "sources", "models", "methods", "metrics", "adapters")  # a kernel may import the ones before it
SHARED = ("results", "evaluate", "tasks")
STAGES = ("run", "checkpoints", "analysis", "upgrade", "learn", "reproduce")
ENTRY = ("jobs", "cli", "read", "__main__")
FLOOR = {"core": 0, **{k: 1 for k in KERNELS}, **{s: 2 for s in SHARED}, **{s: 3 for s in STAGES},
         **{e: 4 for e in ENTRY}}
STAGE_USES = {"upgrade": {"analysis", "checkpoints"}}  # the use case on top
SHARED_USES = {"results": set(), "tasks": set(), "evaluate": {"tasks"}}  # the mechanism knows no domain


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[str]:
    """Every absolute module a file imports (``from a.b import c`` yields ``a.b`` and ``a.b.c``)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def engine_files() -> list[Path]:
    return sorted(p for p in (ROOT / "engine").rglob("*.py"))


def room(module: str) -> str:
    """The floor-level package of an engine module: ``engine.metrics.retrieval`` -> ``metrics``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def arrows() -> set[tuple[str, str]]:
    """``(importer room, imported room)`` for every import between two engine rooms."""
    known = {module_name(p) for p in engine_files()}
    out = set()
    for path in engine_files():
        src = room(module_name(path))
        for target in imports(path):
            if target in known and room(target) and room(target) != src:
                out.add((src, room(target)))
    return out


def test_every_engine_room_has_a_floor():
    rooms = {room(module_name(p)) for p in engine_files()} - {""}
    assert rooms <= set(FLOOR), f"rooms without a floor: {sorted(rooms - set(FLOOR))}"


def test_no_import_runs_up_or_across_a_floor():
    wrong = []
    for src, dst in sorted(arrows()):
        if FLOOR[dst] > FLOOR[src]:
            wrong.append(f"{src} -> {dst} (floor {FLOOR[src]} imports floor {FLOOR[dst]})")
        elif FLOOR[dst] == FLOOR[src] == 1 and KERNELS.index(dst) > KERNELS.index(src):
            wrong.append(f"{src} -> {dst} (a kernel imports a later kernel)")
        elif FLOOR[dst] == FLOOR[src] == 2 and dst not in SHARED_USES[src]:
            wrong.append(f"{src} -> {dst} (shared rooms import only what SHARED_USES allows)")
        elif FLOOR[dst] == FLOOR[src] == 3 and dst not in STAGE_USES.get(src, set()):
            wrong.append(f"{src} -> {dst} (stages never import each other)")
        elif FLOOR[dst] == FLOOR[src] == 4 and src == "read":
            wrong.append(f"{src} -> {dst} (the dashboard's door reads; it never enqueues or runs a job)")
    assert not wrong, "\n".join(wrong)


def test_the_module_graph_has_no_circle():
    """Module-level imports only (a lazy import cannot make an import circle fail, but a circle at the top can)."""
    known = {module_name(p): p for p in engine_files()}
    edges = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = set()
        for node in tree.body:
            for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    top.update(m for m in imports_of(sub) if m in known and m != name)
        edges[name] = top
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in edges[node]:
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " -> ".join(trail[trail.index(nxt):] + [node, nxt]))
            if nxt not in state:
                visit(nxt, trail + [node] if nxt not in trail else trail)
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [])


def imports_of(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        yield node.module
        yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_storage_imports_nothing_from_the_engine_or_the_app():
    wrong = [f"{p.relative_to(ROOT)}: {m}" for p in sorted((ROOT / "storage").rglob("*.py"))
             for m in imports(p) if m.split(".")[0] in ("engine", "app")]
    assert not wrong, "\n".join(wrong)


def test_the_core_is_torch_free():
    """Importing every ``engine.core`` module loads no torch, torchvision, numba, faiss or SQLAlchemy."""
    modules = sorted(module_name(p) for p in (ROOT / "engine" / "core").rglob("*.py"))
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in ('torch', 'torchvision', 'numba', 'faiss', 'sqlalchemy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def layout_block() -> str:
    design = (ROOT / "docs/design.md").read_text(encoding="utf-8")
    start = design.index("## Layout")
    return design[start:design.index("\n## ", start + 1)]


def test_the_readme_layout_matches_the_tree():
    """Every engine room is named in docs/design.md's Layout, and every file the Layout names exists."""
    block = layout_block()
    rooms = {room(module_name(p)) for p in engine_files()} - {"", "__main__"}
    missing_rooms = sorted(r for r in rooms if f"{r}/" not in block)
    assert not missing_rooms, f"rooms the Layout does not name: {missing_rooms}"
    files = {p.name for top in ("app", "engine", "storage", "tests", "bench") for p in (ROOT / top).rglob("*.py")}
    files |= {p.name for p in ROOT.glob("*.py")}
    named = set(re.findall(r"[A-Za-z_]+\.py", block))
    assert not sorted(named - files), f"files the Layout names that do not exist: {sorted(named - files)}"


def test_no_circle_even_through_lazy_imports():
    """Imports inside functions count too (issue 40: compare <-> text_compare closed a circle lazily): a lazy import
    hides a circle from Python but not from a reader; only ``if TYPE_CHECKING`` blocks (annotations) are left out."""
    known = {module_name(p): p for p in engine_files()}
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                for n in ast.walk(node)}
        edges[name] = {m for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip
                       for m in imports_of(node) if m in known and m != name}
    circles = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(trail[trail.index(nxt):] + [node, nxt] if nxt in trail else [node, nxt]))
            elif nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [])
    assert not circles, "\n".join(circles)


def test_the_core_loads_no_heavy_library_even_when_called():
    """No ``engine.core`` module imports torch, numba, faiss or torchvision anywhere, inside functions included (issue
    40: the thread rule loaded torch and numba when called; applying it lives in engine.models.thread_pools)."""
    heavy = ("torch", "torchvision", "numba", "faiss")
    wrong = [f"{p.relative_to(ROOT)}: {m}" for p in sorted((ROOT / "engine" / "core").rglob("*.py"))
             for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if isinstance(node, (ast.Import, ast.ImportFrom))
             for m in imports_of(node) if m.split(".")[0] in heavy]
    assert not wrong, "\n".join(wrong)


# engine modules the dashboard imports: 37 (counted 2026-11-28), 16 (2026-11-29: engine.read, issue 40); lower it as
# the border thins
APP_ENGINE_MODULES = 16
APP_ENGINE_ROOMS = ("core", "read", "learn")  # learn: the Learn demos only (app/learn/__init__.py)


def app_engine_imports() -> set[str]:
    """The engine modules ``app/`` imports anywhere: ``from engine.x import y`` counts ``engine.x.y`` when that is a
    module, else ``engine.x``."""
    used = set()
    for path in (ROOT / "app").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("engine"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    used.add(sub if (ROOT / (sub.replace(".", "/") + ".py")).is_file() else node.module)
            elif isinstance(node, ast.Import):
                used |= {a.name for a in node.names if a.name.startswith("engine")}
    return used


def test_the_app_border_does_not_widen():
    """The dashboard reads what the engine stored through a small set of engine modules (issue 40): the count may go
    down, never up."""
    used = app_engine_imports()
    assert len(used) <= APP_ENGINE_MODULES, sorted(used)


def test_the_app_reaches_the_engine_only_through_core_and_read():
    """Pages import ``engine.core`` and the dashboard's door ``engine.read`` (each name there is imported from where it
    is computed); only the Learn demos import their own ``engine.learn`` module."""
    used = app_engine_imports()
    wrong = sorted(m for m in used if room(m) not in APP_ENGINE_ROOMS)
    assert not wrong, f"the app imports {wrong}: import them through engine.read (or engine.core)"
    learn = sorted(f"{p.relative_to(ROOT)}: {m}" for p in (ROOT / "app").rglob("*.py")
                   if "learn" not in p.relative_to(ROOT / "app").parts for m in imports(p) if m.startswith("engine.learn"))
    assert not learn, "\n".join(learn)
