"""A run stopped by Ctrl-C prints the table of what finished (stdout) before its one line
(stderr), as a finished run would: `run` and `run --max-batch`, in a table or as JSON. The
executor starts no process (fakes.InProcess) and raises KeyboardInterrupt where Ctrl-C would
land; tests/test_run_outcomes.py stops a real run."""

import json

import pytest

from stepbench.cli import main
from stepbench.execute.protocol import Outcome

from fakes import InProcess
from says import names

CPU = ["--device", "cpu", "--seq", "64", "--warmup", "2", "--steps", "5", "--repeats", "1"]


def stopping_at(ctrl_c_at: int, oom_above: int | None = None):
    """A LocalProcess stand-in: each process ok (out of memory above `oom_above`), and Ctrl-C
    as the process numbered `ctrl_c_at` (from 1) starts."""

    class StopsAt(InProcess):
        def __init__(self, **kwargs):
            super().__init__(lambda job: [100.0, 101.0, 99.0], lambda job: 3.0)

        def run(self, job, slot, timeout_s, on_message) -> Outcome:
            if len(self.ran) + 1 == ctrl_c_at:
                raise KeyboardInterrupt
            outcome = super().run(job, slot, timeout_s, on_message)
            if oom_above is not None and job.setup.batch > oom_above:
                outcome.result = {"status": "oom", "error": "out of memory",
                                  "measured": {"phase": "first_step"}}
            return outcome

    return StopsAt


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_stopped_run_prints_the_setups_that_finished(local_executor, monkeypatch, capsys, tmp_path, fmt):
    local_executor(stopping_at(3))
    out = tmp_path / "r.jsonl"
    code = main(["run", *CPU, "--modes", "eager", "--attn", "sdpa,eager", "--batch", "1,2",
                 "--out", str(out), "--format", fmt])
    said = capsys.readouterr()
    assert code == 130
    assert said.err.strip().splitlines()[-1] == (
        f"stepbench run: interrupted; the running setup was stopped, finished setups are kept "
        f"in {out}; run the same command again to resume")
    if fmt == "json":
        assert [(r["setup"]["name"], r["setup"]["batch"]) for r in json.loads(said.out)] == [
            ("eager+sdpa", 1), ("eager+eager", 1)]
        return
    rows = [line.split()[:3] for line in said.out.splitlines() if line.strip().startswith("eager")]
    assert rows == [["eager+sdpa", "1", "64"], ["eager+eager", "1", "64"]]
    assert "results:" not in said.err          # the stopped line says where they are
    # Resumed: the setups found in the results file are in the table of a stopped run too.
    local_executor(stopping_at(2))
    assert main(["run", *CPU, "--modes", "eager", "--attn", "sdpa,eager", "--batch", "1,2",
                 "--out", str(out)]) == 130
    rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines()
            if line.strip().startswith("eager")]
    assert rows == [["eager+sdpa", "1"], ["eager+eager", "1"], ["eager+sdpa", "2"]]


def test_a_run_stopped_before_any_setup_finished_prints_no_table(local_executor, monkeypatch, capsys, tmp_path):
    local_executor(stopping_at(1))
    assert main(["run", *CPU, "--modes", "eager", "--attn", "sdpa",
                 "--out", str(tmp_path / "r.jsonl")]) == 130
    said = capsys.readouterr()
    assert said.out == "" and "interrupted" in said.err


def test_a_stopped_max_batch_run_prints_the_searches_that_finished(local_executor, monkeypatch, capsys,
                                                                   tmp_path):
    # The first search: batch 4 and 8 fit, 16, 12, 10 and 9 do not, measured at 8 (7
    # processes); Ctrl-C in the second search's second probe.
    local_executor(stopping_at(9, oom_above=8))
    args = ["run", *CPU, "--modes", "eager", "--attn", "sdpa,eager", "--batch", "4",
            "--memory-limit-gb", "4", "--max-batch"]
    assert main([*args, "--out", str(tmp_path / "r.jsonl")]) == 130
    said = capsys.readouterr()
    table = said.out.splitlines()
    rows = [line.split()[:2] for line in table if line.strip().startswith("eager+")]
    # The full measurement in the table; the searches' probes (the second's first one too)
    # under their details.
    assert rows[0] == ["eager+sdpa", "8"]
    assert any("search" in line.lower() for line in table), said.out
    assert "eager+eager" in said.out
    assert names(said.err.strip().splitlines()[-1], "stepbench run", "interrupted")
    assert main([*args, "--out", str(tmp_path / "j.jsonl"), "--format", "json"]) == 130
    finals = json.loads(capsys.readouterr().out)
    assert [(r["setup"]["name"], r["setup"]["batch"], r["search"]["role"]) for r in finals] == [
        ("eager+sdpa", 8, "final")]


def test_a_command_that_caught_ctrl_c_after_it_left_an_exec_ends_with_its_own_code(monkeypatch):
    # Ctrl-C can land in a lazy import that builds a dataclass or namedtuple (an exec() of a
    # string), as in a real tune between two processes: CPython 3.11 marks it never caught
    # though the command catches it, and `python -m stepbench` would end by SIGINT (-2), not 130.
    import ctypes

    import stepbench.cli.report

    try:
        mark = ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt")
    except ValueError:
        pytest.skip("this Python keeps that mark where ctypes cannot read it (3.12 and later)")
    marked = []

    def stopped_in_an_exec(args) -> int:
        try:
            exec("raise KeyboardInterrupt")
        except KeyboardInterrupt:
            marked.append(mark.value)
            return 130

    monkeypatch.setattr(stepbench.cli.report, "cmd_report", stopped_in_an_exec)
    try:
        assert (main(["report", "r.jsonl"]), marked, mark.value) == (130, [1], 0)
    finally:
        exec("pass")        # this worker's own exit is never marked


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_a_stopped_tune_prints_what_it_measured_and_no_winner(local_executor, monkeypatch, capsys, tmp_path, fmt):
    base = stopping_at(4)

    class Measured(base):
        def run(self, job, slot, timeout_s, on_message) -> Outcome:
            outcome = base.run(self, job, slot, timeout_s, on_message)
            s = job.setup
            outcome.result["measured"].update(tokens_per_s=s.batch * s.seq / 0.1,
                                              loss_first=6.9,
                                              losses=[6.9] * (1 + s.warmup + s.steps))
            return outcome

    local_executor(Measured)
    out = tmp_path / "t.jsonl"
    code = main(["tune", "--device", "cpu", "--seq", "64", "--budget", "20m", "--out", str(out),
                 "--format", fmt])
    said = capsys.readouterr()
    assert code == 130
    last = said.err.strip().splitlines()[-1]
    assert names(last, "interrupted", str(out), "resume")
    # The golden of tune's stopped line, word for word.
    assert last == (f"stepbench tune: interrupted; what it measured is kept in {out}; run the same "
                    "command again to resume")
    stored = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(stored) == 3
    if fmt == "json":
        result = json.loads(said.out)
        assert result["stopped"] is True and result["winner"] is None
        assert [r["setup"]["name"] for r in result["tried"]] == [r["setup"]["name"]
                                                                 for r in stored]
        return
    rows = [line.split()[:2] for line in said.out.splitlines() if line.strip().startswith("ladder")]
    assert rows == [["ladder", r["setup"]["name"]] for r in stored]
    assert names(said.out, "no winner")
    assert "Winner" not in said.out
