"""``ties`` names one thing (issue 40, STYLE.md 14): the ECC tie rule (``fail`` / ``pass``, ``engine.core.kinds.beats``).
Recall@k's rule for a negative that ties the best positive (``pessimistic`` / ``optimistic``,
``engine.metrics.retrieval.RankTies``) travels as ``rank_ties``.

Two scans over Python's AST, in the style of ``tests/test_floors.py``:

* a parameter (or a dataclass field) that carries a rank-tie rule, annotated ``RankTies`` or defaulting to
  ``"pessimistic"`` / ``"optimistic"``, is not named ``ties``, nor is one annotated as a collection (a Recall@k matrix's
  tie readings are ``tie_readings``); an ECC rule (default ``"fail"`` / ``"pass"`` / ``STRICT``) is not named
  ``rank_ties``;
* a call that passes ``ties=`` reaches a callee that has a ``ties`` parameter (or ``**kwargs``). The callee is resolved
  by its name (``f(...)``, ``module.f(...)``, ``obj.f(...)``) among the top-level functions and dataclasses defined in
  ``engine/``; a name defined several times passes when any definition takes ``ties``.

Limits, stated honestly: a call through another name (an alias, a variable holding the function, a method of a class
the scan does not index, a function defined outside ``engine/``) is not resolved and not checked; keys of a dict
splatted with ``**`` are not read; the values are not followed (``ties=x`` where ``x`` holds a rank rule passes when the
callee's parameter is named ``ties``: the first scan is what keeps such parameters named ``rank_ties``).
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from engine.core.kinds import RANK_TIE_RULES, TIE_RULES

ROOT = Path(__file__).resolve().parents[1]
RANK_RULES = set(RANK_TIE_RULES)
ECC_RULES = set(TIE_RULES)
GOING: set[str] = set()  # files left out of the first scan (none since the task mechanism went, issue 41)
ALLOWED = {  # MatrixResult.ties, each Recall@k matrix's stored tie readings (a dict, not a rule), read under that name
           "engine/metrics/compatibility.py:86"}


def files(*rooms: str, going: bool = True) -> list[Path]:
    """The Python files under ``rooms``; without those of :data:`GOING` when ``going`` is False."""
    paths = [p for room in rooms for p in sorted((ROOT / room).rglob("*.py"))]
    return [p for p in paths if going or not {p.relative_to(ROOT).as_posix(), *map(str, p.relative_to(ROOT).parents)} & GOING]


def _rule(node: ast.AST | None) -> str | None:
    """``"rank"`` / ``"ecc"`` when a default or annotation names a tie rule of that family, ``"data"`` when an
    annotation says a collection (a Recall@k matrix's tie readings, lines of words), else None."""
    if node is None:
        return None
    text = ast.unparse(node)
    if "RankTies" in text or (isinstance(node, ast.Constant) and node.value in RANK_RULES):
        return "rank"
    if text == "STRICT" or (isinstance(node, ast.Constant) and node.value in ECC_RULES):
        return "ecc"
    if any(word in text for word in ("dict", "Mapping", "Sequence", "list")):
        return "data"
    return None


Named = tuple[str, ast.AST | None, ast.AST | None, int]  # name, annotation, default, line


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> Iterator[Named]:
    """``(name, annotation, default, line)`` of every parameter."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    yield from ((p.arg, p.annotation, d, p.lineno) for p, d in zip(positional, defaults))
    yield from ((p.arg, p.annotation, d, p.lineno) for p, d in zip(a.kwonlyargs, a.kw_defaults))


def _fields(cls: ast.ClassDef) -> Iterator[Named]:
    """``(name, annotation, default, line)`` of every annotated class attribute (a dataclass's fields)."""
    yield from ((s.target.id, s.annotation, s.value, s.lineno) for s in cls.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name))


def misnamed(path: Path) -> Iterator[str]:
    """Each parameter or field of ``path`` whose name says one tie rule while its type or default says the other."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = path.relative_to(ROOT).as_posix()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            named = _params(node)
        elif isinstance(node, ast.ClassDef):
            named = _fields(node)
        else:
            continue
        for name, annotation, default, line in named:
            kind = _rule(annotation) or _rule(default)
            if name == "ties" and kind == "rank":
                yield f"{where}:{line} names a rank-tie rule `ties`: call it `rank_ties`"
            if name == "ties" and kind == "data":
                yield f"{where}:{line} names a collection `ties`: `ties` is the ECC rule (tie readings: `tie_readings`)"
            if name == "rank_ties" and kind == "ecc":
                yield f"{where}:{line} names an ECC tie rule `rank_ties`: call it `ties`"


def signatures(paths: list[Path]) -> dict[str, list[set[str] | None]]:
    """Top-level function and dataclass name -> each definition's keyword names (None: it takes ``**kwargs``)."""
    out: dict[str, list[set[str] | None]] = {}
    for path in paths:
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = None if node.args.kwarg else {p[0] for p in _params(node)}
            elif isinstance(node, ast.ClassDef) and any(ast.unparse(d).split("(")[0].endswith("dataclass")
                                                        for d in node.decorator_list):
                names = {f[0] for f in _fields(node)}
            else:
                continue
            out.setdefault(node.name, []).append(names)
    return out


def stray_ties(path: Path, known: dict[str, list[set[str] | None]]) -> Iterator[str]:
    """Each call in ``path`` that passes ``ties=`` to an engine function or dataclass none of whose definitions takes it."""
    where = path.relative_to(ROOT).as_posix()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call) or not any(k.arg == "ties" for k in node.keywords):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else \
            node.func.attr if isinstance(node.func, ast.Attribute) else None
        defs = known.get(name or "")
        if defs and not any(d is None or "ties" in d for d in defs):
            yield f"{where}:{node.lineno} passes ties= to {name}(), which has no `ties` parameter"


def test_ties_names_only_the_ecc_rule():
    found = [line for path in files("engine", "app", "bench", "storage", going=False) for line in misnamed(path)
             if line.split(" ")[0] not in ALLOWED]
    assert not found, "\n".join(found)


def test_no_call_passes_ties_to_a_function_without_it():
    known = signatures(files("engine"))
    assert {"metrics_from_stats", "compatibility_matrices", "beats", "Reading"} <= set(known)  # the index is not empty
    found = [line for path in files("engine", "app", "bench", "tests") for line in stray_ties(path, known)]
    assert not found, "\n".join(found)


def test_the_scans_find_a_misnamed_rule_and_a_stray_keyword(tmp_path, monkeypatch):
    """The scans themselves, on a file with each mistake and each right spelling."""
    bad = tmp_path / "bad.py"
    bad.write_text("from dataclasses import dataclass\n"
                   "def a(x, *, ties: RankTies = 'pessimistic'): ...\n"   # 2: a rank rule named ties
                   "def b(x, ties='optimistic'): ...\n"                  # 3: the same, by its default
                   "def c(x, *, rank_ties: str = STRICT): ...\n"         # 4: an ECC rule named rank_ties
                   "def d(x, *, ties: str = STRICT, rank_ties: RankTies = 'pessimistic'): ...\n"  # right
                   "@dataclass\nclass R:\n    ties: str = 'pessimistic'\n"  # 8: a field
                   "def e(**kw): ...\n"
                   "def f(ties: dict | None = None): ...\n"  # 10: a collection named ties
                   "c(1, ties='fail')\nd(1, ties='fail')\ne(ties=1)\nmod.c(ties=2)\nunknown(ties=3)\nR(ties=4)\n",
                   encoding="utf-8")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert [line.split(" ")[0] for line in misnamed(bad)] == ["bad.py:2", "bad.py:3", "bad.py:4", "bad.py:8", "bad.py:10"]
    known = signatures([bad])
    assert [line.split(" ")[0] for line in stray_ties(bad, known)] == ["bad.py:11", "bad.py:14"]
