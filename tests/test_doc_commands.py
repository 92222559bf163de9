"""The commands the docs tell a user to type name flags the commands take, and every flag of
every command is named in its docs: a flag renamed or added without its docs fails here.
(`stepbench run`'s flag table itself is generated and checked in test_settings_declared.py.)"""

import json
import re
from pathlib import Path

import pytest

from stepbench.cli import build_parser

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
# Where each command's flags are described, beside docs/cli.md.
PAGES = {"run": [], "tune": ["tune.md"], "report": ["report.md"], "compare": ["report.md"],
         "predict": ["predict.md"], "peak": ["mfu.md"], "prices": ["remote.md"]}
# architecture.md adds a made-up axis, `--norm`, to show how an axis is added.
MADE_UP = {("architecture.md", "--norm")}


def commands() -> dict:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices


def flags(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def command_lines(path: Path) -> list[str]:
    """Each line of a code block, each inline code span, and an example's docstring lines."""
    text = path.read_text()
    if path.suffix == ".py":
        text = "```\n" + text.split('"""')[1].replace("\\\\\n", " ") + "```"
    lines = []
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S):
        lines += re.sub(r"\\\n\s*", " ", block).splitlines()
    lines += re.findall(r"`([^`\n]*stepbench [a-z]+[^`\n]*)`", text)
    return lines


def documented_uses() -> list[tuple[str, str, str]]:
    """(file, command, flag) for each flag after `stepbench COMMAND` in the docs."""
    paths = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted((ROOT / "examples").glob("*.py"))]
    uses = []
    for path in paths:
        for line in command_lines(path):
            for command, rest in re.findall(r"stepbench ([a-z]+)\b(.*?)(?=$|;|&&|\s\|\s|\s#)", line):
                uses += [(path.name, command, f) for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest)]
    return uses


def test_the_docs_find_command_lines_to_check():
    uses = documented_uses()
    assert len(uses) > 100
    assert ("report.md", "compare", "--fail-above") in uses and ("workloads.md", "run", "--param") in uses


def test_every_flag_a_documented_command_line_gives_exists():
    known = {name: flags(parser) for name, parser in commands().items()}
    unknown = sorted({(f, c, flag) for f, c, flag in documented_uses()
                      if c in known and flag not in known[c] and (f, flag) not in MADE_UP})
    assert unknown == []


@pytest.mark.parametrize("command", sorted(PAGES))
def test_every_flag_of_a_command_is_named_in_its_docs(command):
    text = "\n".join((DOCS / page).read_text() for page in ["cli.md", *PAGES[command]])
    missing = {flag for flag in flags(commands()[command]) - {"--help"}
               if not re.search(re.escape(flag) + r"(?![\w-])", text)}
    assert missing == set()


def test_the_top_level_flags_are_named_in_cli_md():
    text = (DOCS / "cli.md").read_text()
    assert {f for f in flags(build_parser()) - {"--help"} if f"stepbench {f}" not in text} == set()


def test_every_command_has_docs_and_its_help_shows_no_doubled_percent():
    assert set(commands()) == set(PAGES)
    for name, parser in commands().items():
        assert "%%" not in parser.format_help(), name


def test_tune_md_names_every_key_of_tunes_json():
    from stepbench.search.tune.results import TuneResult

    empty = TuneResult("tokens", 60.0, 0.0, None, None, [], [], None, None, False)
    text = (DOCS / "tune.md").read_text().split("`--format json`: one object")[1][:3000]
    assert {k for k in empty.to_dict() if f"`{k}`" not in text} == set()


def test_predict_md_names_every_key_of_predicts_json(capsys):
    from stepbench.cli import main

    data = ROOT / "tests" / "data" / "predict" / "h200-profile-matrix.jsonl"
    assert main(["predict", str(data), "--gpu", "L40S", "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    keys = set(found) | set().union(*found["rows"]) | set().union(*found["sources"])
    text = (DOCS / "predict.md").read_text()
    assert {k for k in keys if f"`{k}`" not in text and f'"{k}"' not in text} == set()
