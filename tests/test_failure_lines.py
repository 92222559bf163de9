"""The line the live progress prints for a setup that failed (execute/progress.summary)."""

import io

import pytest

from stepbench.execute.protocol import Job
from stepbench.execute.progress import Display
from stepbench.record import Record
from stepbench.setup import Setup

SETUP = Setup(model="llama-tiny", mode="eager", attn="eager", batch=8, seq=2048, device="cpu")
CPU_OOM = ("RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
           "can't allocate memory: you tried to allocate 268435456 bytes. Error code 12 (Cannot "
           "allocate memory)")
CUDA_OOM = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 139.81 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this "
            "process has 138.74 GiB memory in use.")
KILLED = ("killed by the kernel's out-of-memory killer (SIGKILL; last phase: first_step; the "
          "kernel log: Out of memory: Killed process 4242 (python))")


@pytest.mark.parametrize("status, phase, error, in_use, said", [
    ("oom", "first_step", CPU_OOM, 0.41,
     "OOM in first step: could not allocate 0.27 GB (0.41 GB in use) (3 s)"),
    ("oom", "warmup", CUDA_OOM, 137.2,
     "OOM in warm-up: could not allocate 2.00 GiB (137 GB in use) (3 s)"),
    ("oom", "first_step", KILLED, None,
     "OOM in first step: killed by the kernel's out-of-memory killer (3 s)"),
    ("error", "building", "ValueError: " + "word " * 60, None,
     # 160 characters at most, cut after a whole word.
     "ERROR: ValueError: " + ("word " * 29).strip() + "... (3 s)"),
])
def test_a_failed_setups_line_is_short_and_never_cut_mid_word(status, phase, error, in_use, said):
    stream = io.StringIO()
    display = Display(stream)
    job = Job(SETUP)
    display.start(job, label="1/1")
    record = Record(run_id="r", repeat=0, setup=SETUP, status=status, error=error, phase=phase,
                    oom_memory_gb=in_use, wall_s=3.0)
    display.finish(job, record, after="")     # (the time left: tests/test_progress.py)
    last = stream.getvalue().splitlines()[-1]
    assert last == f"stepbench: [1/1] eager+eager batch 8 seq 2048: {said}"
