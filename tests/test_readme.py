"""What the README promises a new user stays true: the command `run` ends with reports its
results file; the test command is the one CI runs; the pandas one-liner reads a real results
file; every link in the README and docs/ leads somewhere; and the README stays an outline."""

import json
import shlex
from pathlib import Path

import pytest

from stepbench.cli import main
from stepbench.execute import executor as executor_module

from fakes import InProcess

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


class Quick(InProcess):
    """LocalProcess's stand-in: each setup ok at once, no process started."""

    def __init__(self, **kwargs):
        super().__init__(lambda job: [100.0, 101.0, 99.0], lambda job: 3.0)


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_run_ends_with_the_command_that_reports_its_results(monkeypatch, capsys, tmp_path, fmt):
    monkeypatch.setattr(executor_module, "LocalProcess", Quick)
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
