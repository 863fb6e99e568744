"""Every flag the reference documents for a command is one its parser takes (issue 40: a documented flag form was
refused by the CLI). Read from the command table of docs/reference.md: a row's command is the first word(s) of its
first cell; every ``--flag`` in the row must be an option of that command (or of one of its subcommands)."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from engine.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its subcommands, all the way down."""
    out = {s for a in parser._actions for s in a.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= options(sub)
    return out


def commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_documented_flag_is_taken_by_its_command():
    table = commands()
    rows = [line for line in (ROOT / "docs" / "reference.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")]
    assert len(rows) >= 15
    wrong = []
    for row in rows:
        first = row.split("|")[1]
        name = re.match(r"\s*`([a-z-]+)", first).group(1)
        if name not in table:
            continue
        known = options(table[name])
        for flag in set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", first)):
            if flag not in known:
                wrong.append(f"{name} {flag}")
    assert not wrong, f"documented but not taken: {sorted(wrong)}"
