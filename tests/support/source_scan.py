"""Reading the project's source as text and syntax trees (the layout tests: floors, app imports, test layout)."""
from __future__ import annotations

import ast
from pathlib import Path


def imports_anywhere(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside functions (absolute imports only)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out
