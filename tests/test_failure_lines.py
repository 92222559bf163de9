"""The line the live progress prints for a setup that failed (execute/progress.summary)."""

import io

import pytest

from stepbench.execute.protocol import Job
from stepbench.execute.progress import Display
from stepbench.record import Record
from stepbench.setup import Setup

from says import names

SETUP = Setup(model="llama-tiny", mode="eager", attn="eager", batch=8, seq=2048, device="cpu")
CPU_OOM = ("RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
           "can't allocate memory: you tried to allocate 268435456 bytes. Error code 12 (Cannot "
           "allocate memory)")
CUDA_OOM = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 139.81 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this "
            "process has 138.74 GiB memory in use.")
KILLED = ("killed by the kernel's out-of-memory killer (SIGKILL; last phase: first_step; the "
          "kernel log: Out of memory: Killed process 4242 (python))")


def failure_line(status, phase, error, in_use) -> str:
    """The line the display ends a failed process with."""
    stream = io.StringIO()
    display = Display(stream)
    job = Job(SETUP)
    display.start(job, label="1/1")
    record = Record(run_id="r", repeat=0, setup=SETUP, status=status, error=error, phase=phase,
                    oom_memory_gb=in_use, wall_s=3.0)
    display.finish(job, record, after="")     # (the time left: tests/test_progress.py)
    return stream.getvalue().splitlines()[-1]


def test_a_failed_setups_line_golden():
    # The family's golden line, word for word; the cases below check the facts each names.
    assert failure_line("oom", "first_step", CPU_OOM, 0.41) == (
        "stepbench: [1/1] eager+eager batch 8 seq 2048: "
        "OOM in first step: could not allocate 0.27 GB (0.41 GB in use) (3 s)")


@pytest.mark.parametrize("status, phase, error, in_use, tokens", [
    # the size asked for (268435456 bytes), in GB, and what was in use
    ("oom", "first_step", CPU_OOM, 0.41, ("OOM", "first step", "0.27 GB", "0.41 GB")),
    # torch's own unit kept; what was in use from the record
    ("oom", "warmup", CUDA_OOM, 137.2, ("OOM", "warm-up", "2.00 GiB", "137 GB")),
    ("oom", "first_step", KILLED, None, ("OOM", "first step", "out-of-memory killer")),
    ("error", "building", "ValueError: " + "word " * 60, None, ("ERROR", "ValueError", "...")),
])
def test_a_failed_setups_line_is_short_and_never_cut_mid_word(status, phase, error, in_use,
                                                              tokens):
    last = failure_line(status, phase, error, in_use)
    head = "stepbench: [1/1] eager+eager batch 8 seq 2048: "
    assert last.startswith(head) and last.endswith(" (3 s)")
    said = last.removeprefix(head).removesuffix(" (3 s)")
    assert names(said, *tokens), said
    if status == "error":
        # The error's start, 160 characters at most, cut after a whole word (29 of 60 fit).
        kept = said.split(": ", 1)[1]
        assert kept.endswith("...") and len(kept) <= 160
        assert kept.removesuffix("...") == " ".join(error.split()[:1 + 29])
