"""Asserting on what a message must name (the flag, the file, the value) and on its kind, not
on its wording: a reworded message keeps these tests green. Each family's exact wording is
pinned once, in its golden test (test_cli_errors.py's GOLDEN, test_report_wording.py)."""

from __future__ import annotations

import re

import pytest

from stepbench.cli import build_parser
from stepbench.errors import UserError


def missing(text: str, *tokens: str) -> list[str]:
    """The tokens `text` does not contain; [] when it names them all."""
    return [token for token in tokens if token not in text]


def names(text: str, *tokens: str) -> bool:
    """Whether `text` contains every one of `tokens` (a flag, a path, a value, a number)."""
    return not missing(text, *tokens)


def user_error(argv: list[str]) -> UserError:
    """The UserError that `stepbench ARGV` stops with, raised from its handler (cli.main turns
    it into its one line and exit code): its `kind` and text, for the test to check."""
    args = build_parser().parse_args(argv)
    with pytest.raises(UserError) as caught:
        args.handler(args)
    return caught.value


def table_rows(text: str) -> list[list[str]]:
    """Every row of the Markdown tables in `text` as its cells, stripped (header rows included,
    separator rows not): a test asserts a row's values, not the table's spacing."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines()
            if line.strip().startswith("|") and not set(line.strip()) <= set("|-: ")]


def lines_naming(text: str, *tokens: str) -> list[str]:
    """The lines of `text` that name every one of `tokens`: how many setups a run said it
    skipped, say, counted by what the line names rather than by its sentence."""
    return [line for line in text.splitlines() if names(line, *tokens)]


def error_line(text: str, command: str) -> bool:
    """Whether `text` is one line that reads as a user error of `stepbench COMMAND`: the
    command's name, then "error: " (cli/base.py's format), and no more lines."""
    return len(text.strip().splitlines()) == 1 and text.startswith(f"stepbench {command}: error: ")


def process_lines(text: str) -> list[str]:
    """The progress lines of `text` that name one process by its number: `[3/8] eager+sdpa
    ...`, `alpha: [1/2] ...`, `[search 1/2, probe 3] ...`."""
    return [line for line in text.splitlines() if re.search(r"\[[^\]]*\d\] \S", line)]
