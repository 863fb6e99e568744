"""The installable package: pyproject.toml names every source folder, its scripts resolve, nothing edits sys.path."""
from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS = {"compatlab": "engine.cli:main", "compatlab-app": "run_app:main"}
NO_PATH_EDITS = ("app", "bench", "tests", "engine", "storage", "run_app.py")


def sys_path_edits(source: str) -> list[int]:
    """Lines of ``source`` that change ``sys.path``: a call of one of its methods, or an assignment to it or a slice."""
    def is_sys_path(node: ast.AST) -> bool:
        node = node.value if isinstance(node, ast.Subscript) else node
        return (isinstance(node, ast.Attribute) and node.attr == "path"
                and isinstance(node.value, ast.Name) and node.value.id == "sys")

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value):
            lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            lines.extend(node.lineno for t in targets if is_sys_path(t))
    return sorted(lines)


def requirement_pins(name: str = "requirements.txt") -> list[str]:
    """A requirements file's requirement lines, comments dropped."""
    lines = [line.split("#")[0].strip() for line in (ROOT / name).read_text().splitlines()]
    return [line for line in lines if line]


def test_the_detector_finds_every_form_of_a_path_edit_and_nothing_else():
    edits = ("sys.path.insert(0, 'x')\nsys.path.append('x')\nsys.path[:0] = ['x']\nsys.path += ['x']\n"
             "sys.path.extend(['x'])\n")
    reads = "first = sys.path[0]\ntext = 'sys.path.insert(0, x)'\nos.path.join('a', 'b')\nif 'x' in sys.path: pass\n"
    assert sys_path_edits(edits + reads) == [1, 2, 3, 4, 5]


def test_no_source_file_edits_sys_path():
    files = [p for name in NO_PATH_EDITS for p in ([ROOT / name] if name.endswith(".py") else (ROOT / name).rglob("*.py"))]
    assert len(files) > 50  # the folders were found
    found = [f"{p.relative_to(ROOT)}:{line}" for p in files for line in sys_path_edits(p.read_text(encoding="utf-8"))]
    assert not found, "the installed package (pip install -e .) replaces these: " + ", ".join(found)


def test_the_package_finder_names_every_source_folder_and_no_other():
    setuptools = pytest.importorskip("setuptools")
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    packaged = set(setuptools.find_namespace_packages(where=str(ROOT), include=find["include"], exclude=find["exclude"]))
    folders = {str(p.parent.relative_to(ROOT)).replace(os.sep, ".") for top in ("engine", "storage", "app")
               for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts}
    assert {"engine", "engine.metrics", "storage", "app", "app.app_pages", "app.learn"} <= folders
    assert packaged == folders
    assert PYPROJECT["tool"]["setuptools"]["py-modules"] == ["run_app"]


def test_dependencies_come_from_requirements_txt_in_a_form_setuptools_reads():
    assert PYPROJECT["project"]["dynamic"] == ["dependencies", "optional-dependencies"]
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]
    assert dynamic["dependencies"] == {"file": ["requirements.txt"]}
    assert dynamic["optional-dependencies"] == {"postgresql": {"file": ["requirements-postgresql.txt"]},
                                                "s3": {"file": ["requirements-s3.txt"]},
                                                "lancedb": {"file": ["requirements-lancedb.txt"]},
                                                "qdrant": {"file": ["requirements-qdrant.txt"]},
                                                "onnx": {"file": ["requirements-onnx.txt"]},
                                                "text": {"file": ["requirements-text.txt"]},
                                                "text-static": {"file": ["requirements-text-static.txt"]},
                                                "dask": {"file": ["requirements-dask.txt"]},
                                                "ir": {"file": ["requirements-ir.txt"]},
                                                "mteb": {"file": ["requirements-mteb.txt"]}}
    for name in ("requirements.txt", "requirements-postgresql.txt", "requirements-s3.txt", "requirements-lancedb.txt",
                 "requirements-qdrant.txt", "requirements-onnx.txt", "requirements-text.txt", "requirements-text-models.txt",
                 "requirements-text-static.txt", "requirements-dask.txt", "requirements-ir.txt",
                 "requirements-mteb.txt"):
        pins = requirement_pins(name)
        assert pins and all("==" in pin and not pin.startswith("-") for pin in pins), pins  # no -r / --index-url lines


def test_console_scripts_name_the_cli_and_the_launcher():
    assert PYPROJECT["project"]["scripts"] == SCRIPTS
    for target in SCRIPTS.values():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target


def test_the_installed_distribution_is_this_checkout_with_its_scripts_and_pins():
    try:
        dist = metadata.distribution("compatlab")
    except metadata.PackageNotFoundError:
        pytest.skip("compatlab is not installed here (pip install -e .)")
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url")
    if url != ROOT.as_uri():
        pytest.skip(f"compatlab is installed from {url}, not from this checkout")
    scripts = {ep.name: ep for ep in dist.entry_points if ep.group == "console_scripts"}
    assert {name: ep.value for name, ep in scripts.items()} == SCRIPTS
    import engine.cli

    assert scripts["compatlab"].load() is engine.cli.main
    assert [r for r in dist.requires if "extra ==" not in r] == requirement_pins()
    assert [r for r in dist.requires if "extra ==" in r] == [f'{pin}; extra == "{extra}"' for extra in ("postgresql", "s3")
                                                             for pin in requirement_pins(f"requirements-{extra}.txt")]


def test_python_dash_m_engine_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "engine", "presets"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("quick-demo ")


def test_a_reader_that_leaves_early_gets_no_traceback():
    """``python -m engine presets | head -1``: the pipe closes before the list is written."""
    proc = subprocess.Popen([sys.executable, "-m", "engine", "presets"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 0 and err == ""
