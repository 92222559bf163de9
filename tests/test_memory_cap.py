"""--memory-limit-gb on a CPU means the same every time (issue 37, item 4): RLIMIT_DATA over
the data memory after the imports where the kernel counts mappings against it, else the address
space on one malloc arena (measure/memcap.py), which thread stacks and malloc arenas'
reservations do not move, with glibc's thresholds fixed so that freed blocks do not stay in a
layout the scheduler decides, so a step that needs more than the cap always ends oom (also where
a native library's allocation is the one refused) and one that needs less never does, also near
its need on a busy machine."""

import json
import os
import subprocess
import sys

import pytest

from stepbench.measure import memcap

# Forks children from one process that imported torch (and ran no parallel op, which would
# hang the children's first one): each caps itself, starts torch's threads and allocates
# about 2 x MB of tensors (MB 0: builds the tiny setup and runs 4 steps), then says what it came
# to. One such process serves every group of (cap, MB, times, how) it is given: each started
# alone paid for a Python and torch's import.
CHILDREN = r"""
import json, os, sys
import torch
from stepbench.measure import memcap, models
from stepbench.measure.step import build_workload
from stepbench.execute.protocol import Outcome
from stepbench.execute.runner import classify
from stepbench.measure.worker import classify_exception, limit_memory
from stepbench.setup import Setup

groups = json.loads(sys.argv[1])
tiny = Setup(model="llama-tiny", mode="eager", attn="sdpa", device="cpu", batch=2, seq=128)
if any(mb == 0 for _, mb, _, _ in groups):
    models.import_modeling(tiny.model, tiny.seq)
for group, (cap_gb, mb, times, how) in enumerate(groups):
    for _ in range(times):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            measured = {}
            try:
                if how == "asked":    # the kernel is asked whether it counts mappings
                    limit_memory(Setup(model="llama-tiny", mode="eager", attn="sdpa", device="cpu",
                                       memory_limit_gb=cap_gb),
                                 measured)
                else:                 # the other answer forced: both ways must repeat
                    measured["memory_cap"] = memcap.cap_cpu(int(cap_gb * 1e9),
                                                            count_mappings=how == "data")
                torch.set_num_threads(2)
                if mb:
                    x = torch.ones(mb * 2**20 // 4)
                    status = "ok" if float((x * 2).sum()) > 0 else "wrong"
                else:         # the tiny setup's build and 4 steps, as a setup's process runs them
                    _, step, _ = build_workload(tiny, torch.device("cpu"))
                    status = "ok" if all(float(step()) > 0 for _ in range(4)) else "wrong"
            except BaseException as exc:
                status = classify_exception(exc, capped=True)[0]
            os.write(write, json.dumps([status, measured.get("memory_cap")]).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            said = f.read()
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        # A refused allocation in oneDNN can end the process by SIGSEGV: the runner's rule says
        # what that is under a CPU cap.
        print(json.dumps([group, *(json.loads(said) if said else [classify(
            Outcome(returncode=code), "first_step", 60, capped_cpu=True)[0], None])]))
"""


def run_groups(groups: list[tuple]) -> list[list]:
    """Each group's children's [status, cap], in the groups' order, from one CHILDREN process."""
    out = subprocess.run([sys.executable, "-c", CHILDREN, json.dumps(groups)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    found = [[outcome for number, *outcome in lines if number == i] for i in range(len(groups))]
    assert [len(f) for f in found] == [times for _, _, times, _ in groups]
    return found


# Every group the first tests ask for, run in one process the first time a test asks.
GROUPS = [(cap_gb, 100, 5, how) for how in ("asked", "data", "address_space")
          for cap_gb in (0.1, 0.5)]


@pytest.fixture(scope="module")
def capped():
    """`capped(cap_gb, mb, times, how)`: the outcomes of that group's children."""
    found = run_groups(GROUPS)
    return lambda cap_gb, mb, times, how="asked": found[GROUPS.index((cap_gb, mb, times, how))]


@pytest.mark.slow
def test_the_same_cap_gives_the_same_outcome_every_time(capped):
    """About 200 MB of tensors (and two torch threads, whose stacks and arenas start after the
    cap): under 0.1 GB always oom, under 0.5 GB always ok, five times each; the kernel's answer
    and the mechanism the record names agree with what a mapping over the cap does here."""
    over = capped(0.1, 100, 5)
    assert [status for status, _ in over] == ["oom"] * 5
    under = capped(0.5, 100, 5)
    assert [status for status, _ in under] == ["ok"] * 5
    cap = under[0][1]
    assert cap["mechanism"] == ("rlimit_data" if kernel_counts_mappings() else "rlimit_as")
    assert cap["limit_gb"] == 0.5 and cap["baseline_gb"] > 0
    assert cap["timed_steps_capped"] is False     # the Setup's warm-up steps: lifted after them


@pytest.mark.slow
@pytest.mark.parametrize("how", ["data", "address_space"])
def test_either_mechanism_repeats(capped, how):
    """Each mechanism forced (the other kernel's answer): the same outcomes five times each."""
    assert [status for status, _ in capped(0.1, 100, 5, how)] == ["oom"] * 5
    under = capped(0.5, 100, 5, how)
    assert [status for status, _ in under] == ["ok"] * 5
    assert under[0][1]["mechanism"] == {"data": "rlimit_data", "address_space": "rlimit_as"}[how]


@pytest.mark.slow
def test_a_step_near_its_need_ends_the_same_beside_a_busy_cpu():
    """The tiny setup's build and 4 steps (batch 2 x 128, two torch threads started after the
    cap, OMP_NUM_THREADS=1 as conftest sets it) need 0.065-0.0675 GB over the data memory after
    the imports (bisected on the 2-core CPU, torch 2.13: benchmarks/results/
    cpu-2core-2026-12-05-memcap-tiny-need.txt). With a busy loop on a CPU beside them, 3
    processes each at about 8% under and over that: all oom, then all ok. Before glibc's
    thresholds were fixed in capped processes, how the threads were scheduled moved a step's
    data memory by as much (benchmarks/README.md, section j3)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        over, under = run_groups([(0.06, 0, 3, "asked"), (0.073, 0, 3, "asked")])
    finally:
        busy.kill()
        busy.wait()
    assert [status for status, _ in over] == ["oom"] * 3
    assert [status for status, _ in under] == ["ok"] * 3
    assert under[0][1]["malloc_thresholds_kb"] == 128


def kernel_counts_mappings() -> bool:
    """Whether this kernel refuses a mapping over RLIMIT_DATA, asked in a forked child (64 MB
    over its data memory, then a 128 MB mapping)."""
    import mmap
    import resource

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            base = memcap.status_bytes("VmData")
            resource.setrlimit(resource.RLIMIT_DATA, (base + (64 << 20), base + (64 << 20)))
            try:
                mmap.mmap(-1, 128 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS).close()
                code = 0
            except OSError:
                code = 2
        finally:
            os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    assert code in (0, 2)
    return code == 2


@pytest.mark.slow
def test_a_capped_tiny_setup_ends_the_same_in_every_process(tmp_path):
    """The real thing: `run` of one tiny setup under a cap it needs more than (0.02 GB), five
    processes forked by the server and three fresh ones, and under one it needs less than
    (0.3 GB), five forked: every one oom, then every one ok. With one torch thread (conftest)
    the refused allocation is often oneDNN's, which raises "could not create a primitive" or
    dies by SIGSEGV: both are the cap's oom. Each record that reached the cap names it."""
    from conftest import run_cli

    outcomes = {}
    for cap, start, repeats in (("0.02", "server", 5), ("0.02", "fresh", 3), ("0.3", "server", 5)):
        out = tmp_path / f"cap-{cap}-{start}.jsonl"
        run_cli("run", "--device", "cpu", "--model", "llama-tiny", "--modes", "eager",
                "--attn", "sdpa", "--batch", "1", "--seq", "64", "--warmup", "0", "--steps",
                "2", "--repeats", repeats, "--start", start, "--memory-limit-gb", cap,
                "--out", out, timeout=600)
        records = [json.loads(line) for line in out.read_text().splitlines()]
        outcomes[cap, start] = [r["status"] for r in records]
        caps = [r["memory_cap"] for r in records if r.get("memory_cap")]
        assert {c["mechanism"] for c in caps} <= {"rlimit_data", "rlimit_as"}
        assert all(c["limit_gb"] == float(cap) for c in caps)
        assert all(c["timed_steps_capped"] for c in caps)     # --warmup 0: the timed ones capped
    assert outcomes == {("0.02", "server"): ["oom"] * 5, ("0.02", "fresh"): ["oom"] * 3,
                        ("0.3", "server"): ["ok"] * 5}


def test_a_refused_allocation_in_a_native_library_is_oom_under_a_cpu_cap():
    """Where the cap refused oneDNN's allocation rather than torch's: its RuntimeError, or a
    SIGSEGV after the imports, is oom under a CPU cap, and stays error or crashed without one
    (or before the cap applied, in the imports)."""
    import signal

    from stepbench.execute.protocol import Outcome
    from stepbench.execute.runner import classify
    from stepbench.measure.worker import classify_exception

    primitive = RuntimeError("could not create a primitive")
    assert classify_exception(primitive, capped=True)[0] == "oom"
    assert classify_exception(primitive)[0] == "error"
    segv = Outcome(returncode=-signal.SIGSEGV)
    status, error = classify(segv, "first_step", 60, capped_cpu=True)
    assert status == "oom" and "SIGSEGV" in error and "--memory-limit-gb" in error
    assert classify(segv, "first_step", 60)[0] == "crashed"
    assert classify(segv, "starting", 60, capped_cpu=True)[0] == "crashed"
    killed = Outcome(returncode=-signal.SIGKILL)
    assert classify(killed, "first_step", 60, capped_cpu=True)[0] == "crashed"


@pytest.mark.parametrize("count_mappings", [True, False])
def test_the_cap_holds_the_steps_and_is_lifted_after_them(count_mappings):
    """The cap is a soft limit over what the process holds now, which the process lifts after
    its warm-up steps (memcap.release; after the timed ones where none ran; always before the
    profiler's and the FLOP counter's extra steps);
    a second release, or one without a cap, changes nothing. Here, in the test's own process,
    with a cap far above what it holds."""
    import resource

    which = resource.RLIMIT_DATA if count_mappings else resource.RLIMIT_AS
    before = resource.getrlimit(which)
    cap = memcap.cap_cpu(int(64e9), count_mappings=count_mappings)
    try:
        soft, hard = resource.getrlimit(which)
        assert soft == pytest.approx(cap["baseline_gb"] * 1e9 + 64e9, abs=1e5)
        assert hard == before[1]
        assert cap["malloc_thresholds_kb"] == 128
    finally:
        memcap.release()
    assert resource.getrlimit(which) == before
    memcap.release()
    assert resource.getrlimit(which) == before
