"""The process server (execute/local/server.py and serving.py) for real: a forked setup's
process measures what a fresh one measures, and every way it can fail is reported as a fresh
process's would be. (That Ctrl-C, SIGTERM and SIGHUP leave no server and no setup's process:
tests/test_run_outcomes.py.)

The faults come from the tests' hooks (tests/hooks: SETUP_FAULT_ENV, SERVER_THREAD_ENV), which
reach a child forked from the server because they read the environment at call time.
"""

import os

import pytest

from stepbench.execute.local.process import LocalProcess
from stepbench.execute.runner import Runner
from stepbench.record import ResultsFile
from stepbench.setup import Setup

from conftest import SETUP_FAULT_ENV, SERVER_THREAD_ENV, run_cli, with_hooks
from says import names

pytestmark = pytest.mark.slow     # every test here starts child processes

TINY = dict(model="llama-tiny", seq=64, device="cpu", warmup=1, steps=3)


def runs(tmp_path, start: str, env: dict | None = None) -> dict:
    # Few steps: with torch's default threads, each step waits on the other test worker's cores.
    out = tmp_path / f"{start}.jsonl"
    proc = run_cli("run", "--device", "cpu", "--seq", "64", "--warmup", "1", "--steps", "2",
                   "--repeats", "1", "--modes", "eager", "--attn", "sdpa", "--start", start,
                   "--out", out, "--format", "json", check_json=True, env=env)
    [record] = proc.records
    return record


def test_a_forked_child_measures_what_a_fresh_one_does(tmp_path):
    # Deterministic on a CPU: the same weights, tokens and arithmetic give bit-identical losses.
    # Without OMP_NUM_THREADS, torch's own default threads in both (the server imports with one
    # OpenMP thread, and its child sets a fresh process's count again).
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    fresh, forked = runs(tmp_path, "fresh", env), runs(tmp_path, "server", env)
    assert fresh["placement"]["start"] == "fresh" and forked["placement"]["start"] == "server"
    assert forked["losses"] == fresh["losses"] and len(fresh["losses"]) == 1 + 1 + 2
    # The step's tensors, which peak memory counts on a CPU, are the same however it started.
    assert forked["peak_memory_gb"] == fresh["peak_memory_gb"] > 0
    assert forked["peak_memory_source"] == fresh["peak_memory_source"] == "tensors"
    assert forked["threads"] == fresh["threads"]
    assert forked["threads"]["intra_op"] >= 1
    # The server's one-time start is recorded; the setup's own imports are gone from its phases.
    assert forked["placement"]["server_start_s"] > 0
    assert forked["phases"]["imports"] < fresh["phases"]["imports"]


def plan():
    return [Setup(mode="eager", attn="sdpa", **TINY),
            Setup(mode="eager", attn="eager", **TINY),
            Setup(mode="eager", attn="sdpa", optimizer="foreach", **TINY),
            Setup(mode="eager", attn="sdpa", checkpointing=True, **TINY)]


def test_a_hang_a_crash_and_the_servers_death_are_reported_as_before(tmp_path, monkeypatch):
    for key, value in with_hooks(os.environ).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(SETUP_FAULT_ENV, "eager+sdpa:hang:warmup,eager+eager:segv:first_step,"
                                        "eager+sdpa+foreach:kill-parent:timed")
    notes = []
    # A server for compiled setups too: it imports inductor's compiler and still holds one thread.
    executor = LocalProcess(start="server", preload={"models": [["llama-tiny", 64]],
                                                     "compile": True}, note=notes.append)
    try:
        hung, crashed, orphan, after = Runner(executor, ResultsFile(tmp_path / "r.jsonl")).run(
            plan(), timeout_s=10)
        ready = executor._server.info
    finally:
        executor.close()
    assert ready["imports_s"]["inductor"] > 0 and len(ready["threads"]) == 1, ready
    assert (hung.status, hung.phase) == ("timeout", "warmup")
    assert names(hung.error, "10 s", "warmup")
    assert crashed.status == "crashed" and names(crashed.error, "SIGSEGV", "first_step")
    # Its parent, the server, was killed mid-step: the setup finished and said so itself.
    assert orphan.status == "ok" and orphan.placement["start"] == "server"
    # The next setup went through a new server, and that was said.
    assert after.status == "ok" and after.placement["start"] == "server"
    assert any(names(n, "process server", "died", "new one") for n in notes), notes


def test_a_server_with_two_threads_never_forks(tmp_path, monkeypatch):
    for key, value in with_hooks(os.environ).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(SERVER_THREAD_ENV, "1")
    notes = []
    executor = LocalProcess(start="server", preload={"models": []}, note=notes.append)
    try:
        first, second = Runner(executor, ResultsFile(tmp_path / "r.jsonl")).run(
            plan()[:2], timeout_s=120)
    finally:
        executor.close()
    assert [r.status for r in (first, second)] == ["ok", "ok"]
    assert [r.placement["start"] for r in (first, second)] == ["fresh", "fresh"]
    [refused] = [n for n in notes if "threads" in n]
    assert names(refused, "process server", "2 threads", "fork")


def test_a_server_whose_import_hangs_is_given_up_at_its_timeout_or_at_once_on_stop(tmp_path):
    """A user's file that hangs as the server imports it: start() ends at its timeout, and
    abort() (stop(): Ctrl-C, SIGTERM) ends it within a second, not after READY_TIMEOUT_S; the
    server is killed either way."""
    import threading
    import time

    import psutil

    from stepbench.execute.local.server import ProcessServer, ServerError

    hang = tmp_path / "hang.py"
    hang.write_text("import time\ntime.sleep(1000)\n\ndef make(batch_size, device):\n    pass\n")
    preload = {"models": [[f"{hang}:make", 1]]}
    server = ProcessServer(preload)
    with pytest.raises(ServerError, match="not ready after 4 s"):
        server.start(ready_timeout_s=4)
    assert not psutil.pid_exists(server.pid) or \
        psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE
    server = ProcessServer(preload)
    threading.Timer(2, server.abort).start()
    begun = time.monotonic()
    with pytest.raises(ServerError, match="stopped while importing"):
        server.start()
    assert time.monotonic() - begun < 30
    assert not psutil.pid_exists(server.pid) or \
        psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE
