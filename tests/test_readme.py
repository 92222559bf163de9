"""What the README promises a new user stays true: the command `run` ends with reports its
results file; the test command is the one CI runs; the pandas one-liner reads a real results
file; every link in the README and docs/ leads somewhere; and the README stays an outline."""

import json
import re
import shlex
from pathlib import Path

import pytest

from stepbench.cli import main

from fakes import InProcess

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


class Quick(InProcess):
    """LocalProcess's stand-in: each setup ok at once, no process started."""

    def __init__(self, **kwargs):
        super().__init__(lambda job: [100.0, 101.0, 99.0], lambda job: 3.0)


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_run_ends_with_the_command_that_reports_its_results(local_executor, monkeypatch, capsys, tmp_path, fmt):
    local_executor(Quick)
    out = tmp_path / "my results.jsonl"
    assert main(["run", "--device", "cpu", "--modes", "eager", "--seq", "64", "--repeats", "1",
                 "--out", str(out), "--format", fmt]) == 0
    said = capsys.readouterr()
    if fmt == "json":       # stdout stays the records alone
        assert [r["setup"]["name"] for r in json.loads(said.out)] == ["eager+sdpa", "eager+eager"]
    html = tmp_path / "my results.html"
    command = (f"stepbench report {shlex.quote(str(out))} --format html --out "
               f"{shlex.quote(str(html))}")
    assert said.err.strip().splitlines()[-2:] == [
        f"results: {out}", f"report, with findings and plots: {command}"]
    # The command it prints works as printed.
    assert main(shlex.split(command)[1:]) == 0
    assert "eager+sdpa" in html.read_text()


def test_the_readme_test_command_is_the_one_ci_runs():
    commands = [line for line in README.read_text().splitlines()
                if line.startswith("python3 -m venv .venv && ")]
    assert len(commands) == 2, commands
    main_job, tests = commands
    assert main_job.endswith("&& .venv/bin/stepbench run")
    assert tests.endswith("&& .venv/bin/ruff check && .venv/bin/pytest")
    # CI runs it as written, with pip told to be quiet.
    ci = [line.replace("pip install -q ", "pip install ")
          for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests in ci


def test_the_pandas_one_liner_reads_a_real_results_file(tmp_path, monkeypatch):
    import statistics

    pytest.importorskip("pandas", reason="pandas comes with the test extra (pip install -e '.[test]')")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    [code] = [b for b in blocks if "import pandas" in b]
    *body, last = code.strip().splitlines()
    stored = ROOT / "benchmarks" / "results" / "h200-2026-11-30-repeats3.jsonl"
    (tmp_path / "stepbench-results.jsonl").write_bytes(stored.read_bytes())
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec("\n".join(body), scope)
    table = eval(last, scope)
    records = [json.loads(line) for line in stored.read_text().splitlines()]
    assert len(scope["df"]) == len(records)
    names = sorted({r["setup"]["name"] for r in records})
    assert len(names) == 4 and len(table) == 4
    for name in names:
        means = [r["step_ms"] for r in records if r["setup"]["name"] == name]
        assert len(means) == 3
        assert table.loc[("NVIDIA H200", name, 4, 2048), "step_ms"] == pytest.approx(
            statistics.median(means))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("page", ["README.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_every_link_leads_to_a_file_and_heading_that_exist(page):
    path = ROOT / page
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue            # a web address
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        assert linked.exists(), f"{page}: {target}: no such file"
        if anchor:
            assert anchor in anchors(linked), f"{page}: {target}: no such heading"


def test_the_readme_stays_an_outline():
    lines = README.read_text().splitlines()
    assert len(lines) < 250, "the reference belongs in docs/, linked from the README"
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[:5] == ["## Contents", "## Two commands", "## Example output", "## Next steps",
                            "## The results"], headings
