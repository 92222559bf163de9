"""The runner's handling of children that hang, crash or fail, with real processes.

These children are not benchmarks: a LocalProcess subclass swaps the command line for a process
that hangs or dies, so that the executor's timeout, process group kill and the runner's
classification are exercised for real.
"""


import io

import psutil
import pytest

from stepbench.execute.local import process as executor
from stepbench.execute.protocol import Outcome
from stepbench.execute.runner import Runner, classify
from stepbench.measure.worker import classify_exception
from stepbench.execute.progress import Display
from stepbench.record import Machine, Record, ResultsFile
from stepbench.setup import Setup

from conftest import read_jsonl
from fakes import HANG, QUICK_OK, SEGFAULT, InProcess, ScriptedProcesses
from says import names

TINY = dict(model="llama-tiny", attn="sdpa", seq=64, device="cpu", warmup=0, steps=2)


def test_resume_retries_a_stored_timeout_error_or_crash_but_not_an_oom(tmp_path):
    # A timeout, an error, a crash are of their moment: the same command measures them again,
    # and says so once; an oom or unsupported setup is the setup's own and stays done. The
    # failed line stays in the file; the new record is the one that counts.
    statuses = ["ok", "timeout", "error", "crashed", "oom", "unsupported"]
    setups = [Setup(mode="eager", batch=b, **TINY) for b in range(1, len(statuses) + 1)]
    out = ResultsFile(tmp_path / "r.jsonl")
    for setup, status in zip(setups, statuses):
        out.append(Record(run_id="old", repeat=0, setup=setup, status=status,
                          error=None if status == "ok" else "x", step_ms=50.0 if status == "ok"
                          else None, machine=Machine(gpu="cpu")))

    def resume(**kw) -> tuple[list, list[str]]:
        executor, stream = InProcess(lambda job: [70.0, 70.0]), io.StringIO()
        Runner(executor, out).run(setups, repeats=1, timeout_s=60, **kw,
                                  display=Display(stream, clock=lambda: 0.0))
        return executor.ran, [line for line in stream.getvalue().splitlines() if "retry" in line]

    ran, said = resume()
    assert ran == [(2, 0), (3, 0), (4, 0)]
    assert len(said) == 1 and names(said[0], "retrying 3 setups", "timeout/error/crashed",
                                    "--rerun")
    latest = {r.setup.batch: r for r in out.latest()}
    assert [latest[b].status for b in range(1, 7)] == ["ok", "ok", "ok", "ok", "oom",
                                                       "unsupported"]
    assert len(out.read()) == 9 and len(out.latest()) == 6
    # Measured now, nothing is left to retry; a search that counts stored failures as done
    # (tune: retry=False) measures none of them either.
    assert resume() == ([], [])
    out.append(Record(run_id="later", repeat=0, setup=setups[1], status="timeout", error="x",
                      machine=Machine(gpu="cpu")))
    assert resume(retry=False) == ([], [])
    assert resume()[0] == [(2, 0)]


def scripted(script: str, *args, others: str | None = None) -> ScriptedProcesses:
    """Runs `script` (Python source) for the setups whose mode is 'compile'; the others run the
    real worker, or `others` (Python source) when given."""
    def argv(job):
        if job.setup.mode == "compile":
            return [script, *args]
        return [others] if others is not None else None
    return ScriptedProcesses(argv)


def run_plan(plan, out, timeout_s, executor):
    try:
        return Runner(executor, ResultsFile(out)).run(plan, timeout_s=timeout_s)
    finally:
        executor.close()


def plan():
    return [Setup(mode="compile", **TINY), Setup(mode="eager", **TINY)]


@pytest.mark.slow
def test_a_hang_is_killed_by_the_timeout_with_its_whole_group(tmp_path, monkeypatch):
    # The setup after the hang is a quick protocol child, so the timeout need not leave room for
    # a real model (the real worker runs after a crash below).
    monkeypatch.setattr(executor, "KILL_GRACE_S", 1.0)
    out = tmp_path / "r.jsonl"
    records = run_plan(plan(), out, timeout_s=5, executor=scripted(HANG, others=QUICK_OK))
    hung, ok = records
    assert hung.status == "timeout"
    assert names(hung.error, "5 s", "--timeout")
    assert hung.wall_s >= 5
    # The setup after the hang still ran, and both records are in the file.
    assert ok.status == "ok" and ok.machine.hostname == "quick"
    assert [r["status"] for r in read_jsonl(out)] == ["timeout", "ok"]


@pytest.mark.slow
def test_the_grandchild_of_a_hung_child_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(executor, "KILL_GRACE_S", 1.0)
    pid_file = tmp_path / "grandchild.pid"
    run_plan(plan()[:1], tmp_path / "r.jsonl", timeout_s=4, executor=scripted(HANG, pid_file))
    pid = int(pid_file.read_text())
    # Gone, or a zombie waiting for init to reap it: either way no longer running. (The kill
    # was sent before run_plan returned; waiting here is only for the kernel to finish it.)
    try:
        psutil.Process(pid).wait(timeout=30)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
def test_a_segfault_is_recorded_as_crashed_with_the_stderr_tail(tmp_path):
    records = run_plan(plan(), tmp_path / "r.jsonl", timeout_s=60, executor=scripted(SEGFAULT))
    crashed, ok = records
    assert crashed.status == "crashed"
    # the signal, the phase (the crash's golden: below, from classify itself)
    assert names(crashed.error.split(";")[0], "SIGSEGV", "starting")
    assert names(crashed.error, "about to crash")       # the process's own last words
    assert ok.status == "ok"


@pytest.mark.slow
def test_a_non_zero_exit_without_result_is_crashed(tmp_path):
    records = run_plan(plan()[:1], tmp_path / "r.jsonl", timeout_s=60,
                       executor=scripted("import sys; sys.stderr.write('boom'); sys.exit(3)"))
    assert records[0].status == "crashed"
    assert names(records[0].error.split(";")[0], "code 3")
    assert records[0].error.endswith("boom")


def test_classify_prefers_the_childs_own_verdict():
    outcome = Outcome(result={"status": "oom", "error": "OutOfMemoryError: x"}, returncode=0)
    assert classify(outcome, "warmup", 10) == ("oom", "OutOfMemoryError: x")
    outcome.timed_out = True
    assert classify(outcome, "warmup", 10)[0] == "timeout"
    # A tune's timeout is what its budget has left: said in three digits.
    assert names(classify(outcome, "warmup", 1.03071)[1], "after 1.03 s", "phase: warmup")
    assert names(classify(outcome, "warmup", 1800)[1], "after 1800 s", "raise --timeout")
    assert names(classify(outcome, "warmup", 9, fix="--budget or --timeout")[1], "--budget")
    # An error keeps the stderr tail after its line; a user's factory's, whose traceback is a
    # field of its own (docs/results-schema.md), keeps only its line.
    tail = "Traceback (most recent call last):\nValueError: no"
    hf = Outcome(result={"status": "error", "error": "ValueError: no"}, stderr_tail=tail)
    assert classify(hf, "building", 10) == ("error", f"ValueError: no\n{tail}")
    hf.result["measured"] = {"traceback": tail}
    assert classify(hf, "building", 10) == ("error", "ValueError: no")


def test_the_parents_words_for_a_timeout_an_oom_kill_and_a_crash():
    """The goldens of the errors the parent writes where the process gave no result, word for
    word (the real processes: the slow tests here, test_oom_kill.py, conftest's cluster check)."""
    assert classify(Outcome(timed_out=True), "warmup", 1) == ("timeout", (
        "no result after 1 s (last phase: warmup); the process group was killed; raise "
        "--timeout if it needs longer"))
    killed = Outcome(returncode=-9, oom_killed="the kernel log says: Killed process 42 (python)")
    assert classify(killed, "first_step", 60) == ("oom", (
        "killed by the kernel's out-of-memory killer (last phase: first_step; the kernel log "
        "says: Killed process 42 (python))"))
    assert classify(Outcome(returncode=3), "building", 60) == ("crashed", (
        "exited with code 3 and no result (last phase: building); it wrote nothing to stderr"))


def test_exceptions_are_classified():
    import torch

    assert classify_exception(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))[0] == "oom"
    assert classify_exception(RuntimeError(
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 536870912 bytes"))[0] == "oom"
    assert classify_exception(NotImplementedError("FlexAttention does not support backward on CPU")) == (
        "unsupported", "NotImplementedError: FlexAttention does not support backward on CPU")
    assert classify_exception(ImportError("flash_attn is not installed"))[0] == "unsupported"
    # stepbench's own Unsupported is its reason alone, said once (not "Unsupported: ...").
    from stepbench.errors import Unsupported
    assert classify_exception(Unsupported("--compile-scope layer: no repeated block")) == (
        "unsupported", "--compile-scope layer: no repeated block")
    assert classify_exception(ValueError("shapes do not match")) == ("error", "ValueError: shapes do not match")
    # torch.compile wraps errors from inside the compiler: the cause chain decides.
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("backend compiler failed") from inner
    except RuntimeError as wrapped:
        assert classify_exception(wrapped)[0] == "oom"
