"""Every ``COMPATLAB_*`` variable is declared once (``storage/settings.py``), read through one reader, and listed in
docs/setup.md exactly as declared."""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from storage import settings
from storage.settings import SETTINGS, SettingError, read_setting

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"COMPATLAB_[A-Z0-9_]+")
# stdlib-only modules that spell a declared name for writing it into a child's environment (their docstrings say why)
MIRRORS = {"engine/core/threads.py": "COMPATLAB_THREADS", "app/gate.py": "COMPATLAB_SECRET"}


def code_files() -> list[Path]:
    files = [*(ROOT / "engine").rglob("*.py"), *(ROOT / "app").rglob("*.py"), *(ROOT / "storage").rglob("*.py")]
    return sorted(files) + [ROOT / "run_app.py"]


def test_unset_or_blank_gives_the_default():
    for setting in SETTINGS.values():
        assert read_setting(setting, {}) == setting.default
        assert read_setting(setting, {setting.name: "   "}) == setting.default
    assert read_setting(settings.HEARTBEAT_S, {}) == 5.0 and read_setting(settings.STALE_AFTER_S, {}) == 60.0
    assert read_setting(settings.MAX_ARRAY_BYTES, {}) == 4 * 2**30
    assert read_setting(settings.MAX_CHECKPOINT_BYTES, {}) == 2 * 10**9
    assert read_setting(settings.ALLOW_TORCHSCRIPT, {}) is False and read_setting(settings.DATA_ROOTS, {}) == ()


def test_values_are_parsed():
    env = {"COMPATLAB_THREADS": " 3 ", "COMPATLAB_MAX_CHECKPOINT_BYTES": "1.5GB", "COMPATLAB_HEARTBEAT_S": "0.2",
           "COMPATLAB_ALLOW_TORCHSCRIPT": "yes", "COMPATLAB_FEATURE_DTYPE": "Float16",
           "COMPATLAB_DATA_ROOTS": os.pathsep.join(["/a", "", " ", "/b c"]), "COMPATLAB_MAX_ARRAY_BYTES": "1024",
           "COMPATLAB_DB_URL": " sqlite:////x.db "}
    assert read_setting(settings.THREADS, env) == 3
    assert read_setting(settings.MAX_CHECKPOINT_BYTES, env) == 1_500_000_000
    assert read_setting(settings.HEARTBEAT_S, env) == 0.2
    assert read_setting(settings.ALLOW_TORCHSCRIPT, env) is True
    assert read_setting(settings.ALLOW_TORCHSCRIPT, {"COMPATLAB_ALLOW_TORCHSCRIPT": "0"}) is False
    assert read_setting(settings.FEATURE_DTYPE, env) == "float16"
    assert read_setting(settings.DATA_ROOTS, env) == ("/a", "/b c")
    assert read_setting(settings.MAX_ARRAY_BYTES, env) == 1024
    assert read_setting(settings.DB_URL, env) == "sqlite:////x.db"


@pytest.mark.parametrize(("setting", "raw"), [
    (settings.THREADS, "0"), (settings.THREADS, "1.5"), (settings.HEARTBEAT_S, "-1"), (settings.STALE_AFTER_S, "inf"),
    (settings.HEARTBEAT_S, "soon"), (settings.MAX_ARRAY_BYTES, "4GB"), (settings.MAX_CHECKPOINT_BYTES, "big"),
    (settings.ALLOW_TORCHSCRIPT, "maybe"), (settings.FEATURE_DTYPE, "int8")])
def test_a_bad_value_is_one_line_naming_the_variable(setting, raw):
    with pytest.raises(SettingError) as exc:
        read_setting(setting, {setting.name: raw})
    assert str(exc.value) == f"${setting.name} must be {setting.must_be}, got {raw!r}"
    assert "\n" not in str(exc.value)


def test_every_variable_the_code_names_is_declared():
    undeclared = sorted({f"{p.relative_to(ROOT)}: {n}" for p in code_files()
                         for n in NAME.findall(p.read_text(encoding="utf-8")) if n not in SETTINGS})
    assert not undeclared, "\n".join(undeclared)


def test_names_are_spelled_only_in_the_declarations():
    """A string that is just a variable's name appears in ``storage/settings.py`` and the two mirrors only."""
    spelled = []
    for path in code_files():
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
                if rel != "storage/settings.py" and MIRRORS.get(rel) != node.value:
                    spelled.append(f"{rel}:{node.lineno}: {node.value}")
    assert not spelled, "\n".join(spelled)


def test_the_mirrors_equal_the_declarations():
    from app import gate
    from engine.core import threads

    assert threads.THREADS_ENV == settings.THREADS.name and gate.SECRET_ENV == settings.SECRET.name


def test_no_module_reads_the_environment_itself():
    """Outside ``storage/settings.py`` no ``environ.get`` / ``getenv`` is given a declared name or an ``*_ENV``."""
    reads = []
    for path in code_files():
        if path.name == "settings.py" and path.parent.name == "storage":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and (
                    node.func.attr == "getenv" or node.func.attr == "get" and "environ" in ast.unparse(node.func.value)):
                arg = ast.unparse(node.args[0])
                if NAME.search(arg) or arg.endswith("_ENV"):
                    reads.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not reads, "\n".join(reads)


def test_the_readme_table_is_the_declarations():
    lines = (ROOT / "docs/setup.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("| Variable | Value | Default | Meaning |")
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    assert "\n".join(lines[start:end]) == settings.markdown_table(), "run python -m storage.settings and paste it"
    listed = [NAME.search(line).group(0) for line in lines[start + 2:end]]
    assert listed == list(SETTINGS) and len(SETTINGS) == 14  # COMPATLAB_OWNER_LEASE_S went with the task layer
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    mentioned = set(NAME.findall("\n".join(p.read_text(encoding="utf-8") for p in pages)))
    assert mentioned <= set(SETTINGS), f"the docs name undeclared variables: {sorted(mentioned - set(SETTINGS))}"
    assert set(NAME.findall("\n".join(lines))) == set(SETTINGS)  # the set-up page names every one


def test_run_app_refuses_a_bad_variable_before_starting(monkeypatch, capsys):
    import run_app

    monkeypatch.setenv("COMPATLAB_ALLOW_TORCHSCRIPT", "maybe")
    with pytest.raises(SystemExit) as exc:
        run_app.parse_args(["--no-demo", "--no-browser"])
    assert exc.value.code == 2
    assert "$COMPATLAB_ALLOW_TORCHSCRIPT must be 1 (yes) or 0 (no), got 'maybe'" in capsys.readouterr().err
