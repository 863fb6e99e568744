"""The examples in docs/ are true to the code (issue 40: every example in the docs run by a test). The README's own
examples run end to end (tests/test_readme_examples.py); the docs' are commands that take minutes to hours (a study,
a reproduction over seeds, a benchmark), so here each is checked as far as it can be without running it:

- every ```toml block is a config the strict loader accepts;
- every ```bash block of docs/setup.md is one of the README's two commands (one truth for the set-up);
- every inline `python -m engine ...` with arguments is parsed by the CLI's own parser, its placeholders filled in;
  one that only names a command (`python -m engine adapter curve`, in a sentence) names one the CLI has;
- every inline `python bench/NAME.py ...` names a script that exists, and each of its ``--flags`` is one the
  script's argument parser declares (read from its source: running 25 benchmarks' imports is not needed for that).
"""
from __future__ import annotations

import argparse
import ast
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from engine.cli import build_parser
from engine.core.config import config_from_dict

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PLACEHOLDERS = {"CONFIG": "study.toml", "N": "2", "NAME": "P2-Tab2", "DIR": "out", "K": "10"}


def blocks(language: str) -> list[tuple[str, str]]:
    return [(page.name, body) for page in DOCS
            for body in re.findall(rf"```{language}\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)]


def inline(prefix: str) -> list[tuple[str, str]]:
    return sorted({(page.name, code) for page in DOCS
                   for code in re.findall(r"`([^`\n]+)`", page.read_text(encoding="utf-8")) if code.startswith(prefix)})


def argv_of(code: str, prefix: str) -> list[str]:
    """The words after ``prefix``: optional ``[...]`` groups kept (their flags are documented too), ``a|b`` choices
    reduced to the first, placeholders filled in."""
    words = shlex.split(code[len(prefix):].replace("[", " ").replace("]", " "))
    return [PLACEHOLDERS.get(w, w.split("|")[0]) for w in words]


def test_every_toml_example_is_a_config_the_strict_loader_accepts():
    found = blocks("toml")
    assert found, "docs/reference.md shows a study config"
    for page, body in found:
        config_from_dict(tomllib.loads(body))  # raises on an unknown key or a bad value


def test_the_setup_page_shows_the_readmes_two_commands():
    readme = set(re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.DOTALL))
    setup = [body for page, body in blocks("bash") if page == "setup.md"]
    assert len(setup) == 2 and set(setup) <= readme


def test_the_readmes_test_command_is_what_ci_runs():
    """The README's second command (the suite) is the one .ci/run runs, its ``-q`` flags aside."""
    readme = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.DOTALL)
    suite = next(body.strip() for body in readme if "python -m pytest" in body)
    ci = next(line for line in (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines() if "python -m pytest" in line)
    assert ci.split("#")[0].replace(" -q", "").strip() == suite


def command_path(words: list[str]) -> bool:
    """Whether ``words`` are a chain of the CLI's commands and subcommands (a command named in a sentence)."""
    parser = build_parser()
    for word in words:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            return False
        parser = subs[0].choices[word]
    return True


def test_every_engine_command_in_the_docs_is_parsed_by_the_cli():
    examples = [(page, code) for page, code in inline("python -m engine ") if "..." not in code]
    assert len(examples) >= 12
    parser, wrong = build_parser(), []
    for page, code in examples:
        argv = argv_of(code, "python -m engine ")
        if command_path(argv):
            continue
        try:
            parser.parse_args(argv)
        except SystemExit:
            wrong.append(f"{page}: {code}")
    assert not wrong, f"documented commands the CLI refuses: {wrong}"


def declared_flags(script: Path) -> set[str]:
    """Every ``--flag`` string literal passed to an ``add_argument`` call in ``script``."""
    out = set()
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            out |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return out


@pytest.mark.parametrize("page, code", inline("python bench/"))
def test_every_bench_command_in_the_docs_names_a_script_and_its_flags(page, code):
    if "<name>" in code:
        return  # the generic form: "python bench/<name>.py"
    script, *argv = argv_of(code, "python ")
    path = ROOT / script
    assert path.is_file(), f"{page}: {code}: no {script}"
    flags = {w.split("=")[0] for w in argv if w.startswith("--")}
    assert flags <= declared_flags(path), f"{page}: {code}: {sorted(flags - declared_flags(path))} not declared"
