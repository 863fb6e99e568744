"""Test modules share helpers through tests/support/, never by importing each other (issue 40: 84 imports between
test files): a test module is collected once, for its own tests, and a helper has one home."""
from __future__ import annotations

import ast
from pathlib import Path

from support.source_scan import imports_anywhere

TESTS = Path(__file__).resolve().parent


def test_no_test_module_imports_another():
    tests = {p.stem for p in TESTS.glob("test_*.py")}
    wrong = sorted(f"{p.name} imports {m}" for p in [*TESTS.glob("*.py"), *(TESTS / "support").glob("*.py")]
                   for m in imports_anywhere(p) if m.split(".")[-1] in tests or m.split(".")[0] in tests)
    assert not wrong, wrong


def test_the_support_package_holds_no_tests():
    names = [f"{p.name}:{n.name}" for p in (TESTS / "support").glob("*.py")
             for n in ast.parse(p.read_text(encoding="utf-8")).body
             if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
    assert not names, names
