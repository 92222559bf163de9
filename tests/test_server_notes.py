"""The goldens of the process server's notes, made without a server: a server that refuses to
fork (it holds two threads), one that died, one that could not start. tests/test_server.py
produces each for real (slow) and checks the facts they name."""

import os
import socket

import pytest

from stepbench.execute.local import process, serving
from stepbench.execute.local.process import LocalProcess
from stepbench.execute.local.server import ServerError, _receive
from stepbench.execute.protocol import Job
from stepbench.setup import Setup

JOB = Job(Setup(model="llama-tiny", mode="eager", attn="sdpa", seq=64, device="cpu"))


@pytest.fixture
def notes():
    """A LocalProcess that would use a process server, and the notes it says."""
    said = []
    executor = LocalProcess(start="server", note=said.append)
    yield executor, said
    executor.close()


def test_a_server_with_two_threads_refuses_and_the_run_goes_on_fresh(notes, monkeypatch):
    executor, said = notes
    monkeypatch.setattr(serving.signal, "signal", lambda *args: None)   # keep pytest's handlers
    monkeypatch.setattr(serving, "thread_names", lambda: ["python3", "stepbench-extra"])
    ours, theirs = socket.socketpair()
    with ours, theirs:
        serving.Server(threads=[1, 1]).start({"id": 7}, [], theirs)
        reply, _ = _receive(ours)
    assert reply["op"] == "refused" and reply["id"] == 7

    class Refusing:
        def spawn(self, payload, env, stderr_fd):
            raise ServerError(reply["error"])

    started = []
    monkeypatch.setattr(process.subprocess, "Popen", lambda *a, **k: started.append(a) or "fresh")
    placement = {}
    with open(os.devnull, "w") as stderr:
        assert executor._spawn(JOB, {}, stderr, Refusing(), placement) == "fresh"
    assert placement["start"] == "fresh" and executor.start == "fresh" and len(started) == 1
    # The golden of the thread refusal's note, word for word.
    assert said == ["the process server holds 2 threads (python3, stepbench-extra); forking it "
                    "is not safe; every setup's process starts fresh from here"]


def test_a_dead_server_is_said_and_one_that_cannot_start_leaves_fresh_processes(notes,
                                                                                monkeypatch):
    executor, said = notes

    class Dead:
        dead = True

        class _proc:
            @staticmethod
            def poll():
                return -9

        def close(self):
            pass

    class CannotStart:
        aborted = False

        def __init__(self, preload, log=None):
            pass

        def start(self, ready_timeout_s):
            raise ServerError("CUDA was started while importing; the server cannot fork")

    monkeypatch.setattr(process, "ProcessServer", CannotStart)
    executor._server = Dead()
    assert executor._server_for(JOB, {}) is None
    assert executor.start == "fresh"
    # The goldens of a dead server's note and of one that could not start, word for word.
    assert said == ["the process server died (exit code -9); starting a new one",
                    "CUDA was started while importing; the server cannot fork; every setup's "
                    "process starts fresh"]
