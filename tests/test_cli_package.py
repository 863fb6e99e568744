"""The command line is one package: a module per command group, sharing only ``engine.cli.options``."""
import ast
from pathlib import Path

from engine.cli import COMMANDS, build_parser

CLI = Path(__file__).resolve().parents[1] / "engine" / "cli"


def cli_imports(path: Path) -> set[str]:
    """The ``engine.cli`` modules a file imports (``from engine.cli import x`` counts as ``engine.cli.x``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("engine.cli")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("engine.cli"):
            out |= {f"{node.module}.{a.name}" if node.module == "engine.cli" else node.module for a in node.names}
    return out


def test_a_command_module_imports_no_other_command_module_only_the_shared_options():
    modules = sorted(p for p in CLI.glob("*.py") if p.name not in ("__init__.py", "options.py"))
    assert {p.stem for p in modules} == {"run", "evaluate", "worker", "adapt", "adapter", "checkpoints", "export_images",
                                         "upgrade", "reproduce", "doctor", "mteb"}
    wrong = {p.name: cli_imports(p) - {"engine.cli.options"} for p in modules}
    assert not any(wrong.values()), wrong
    assert cli_imports(CLI / "options.py") == set()


def test_the_parser_has_every_command_in_the_table_and_no_other():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == list(COMMANDS)
    assert list(COMMANDS) == ["evaluate", "run", "compare", "worker", "adapt", "adapter", "extract", "compare-checkpoints",
                              "export-images", "presets", "check-upgrade", "reproduce", "doctor", "mteb"]
    assert sub.choices["compare"].get_default("export") == "markdown" and sub.choices["run"].get_default("export") == "text"


def test_importing_the_command_line_loads_no_torch_or_numba():
    """``python -m engine worker`` sizes torch's and numba's pools after parsing; a command module that loads them at
    import (as the reproduce command once did) would fix numba's pool at every core first."""
    import subprocess
    import sys

    code = "import sys, engine.cli; print(sorted(m for m in ('torch', 'numba', 'faiss') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
