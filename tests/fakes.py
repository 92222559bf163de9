"""Stand-ins the tests share: an executor whose children run a short script instead of a setup.

The children are real processes (a new session, pipes, a timeout, the group killed), so the
executor and the runner run for real; only the model is missing. `ProtocolChild` is a child that
speaks stepbench's protocol (stepbench.protocol) the way a setup's process does and logs when it
ran; HANG, QUICK_OK and SEGFAULT are children that misbehave or finish at once. `InProcess` is
an executor without children, for what the runner decides.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Callable

from stepbench.execute.local.process import LocalProcess
from stepbench.execute.protocol import Executor, Job, Outcome


class ScriptedProcesses(LocalProcess):
    """A LocalProcess whose child for a job runs `script(job)`: the argv after `python -c` (the
    source first), or None for the real worker. `slots`: that many slots without GPUs; `gpus`:
    a pool; `gpu_name`: the GPU the resume key names."""

    def __init__(self, script: Callable[[Job], list[str] | None], *, slots: int | None = None,
                 gpus: list[int] | None = None, gpu_name: str | None = None):
        super().__init__(gpus=gpus)
        if slots is not None:
            self.slots = [str(i) for i in range(slots)]
        self.script, self.fixed_gpu_name = script, gpu_name

    def command(self, job: Job) -> list[str]:
        argv = self.script(job)
        return super().command(job) if argv is None else [sys.executable, "-c", *map(str, argv)]

    def gpu_name(self, setup, slot):
        return self.fixed_gpu_name or super().gpu_name(setup, slot)


PROTOCOL_CHILD = """
import json, os, sys, time
from stepbench import protocol
job, log, sleep_s, folder, together, gpu = (json.loads(sys.argv[1]), sys.argv[2],
                                            float(sys.argv[3]), sys.argv[4], int(sys.argv[5]),
                                            sys.argv[6])
batch = job["setup"]["batch"]
seen = os.environ.get("CUDA_VISIBLE_DEVICES")
start = time.time()
print(protocol.encode("start", machine={"gpu": gpu, "hostname": "fake"}, software={}), end="")
print(protocol.encode("progress", phase="timed", args=[3]), end="", flush=True)
print("a stray line from a library", flush=True)
# A barrier: the first `together` children wait for each other, so that children running at
# once are told by what happened, not by how fast the machine is.
met = None
if together:
    open(os.path.join(folder, str(batch)), "w").close()
    if len(os.listdir(folder)) <= together:
        deadline = time.monotonic() + 60
        while len(os.listdir(folder)) < together and time.monotonic() < deadline:
            time.sleep(0.05)
        met = len(os.listdir(folder)) >= together
time.sleep(sleep_s)
with open(log, "a") as f:
    f.write(json.dumps({"batch": batch, "nproc": job["setup"].get("nproc", 1), "seen": seen,
                        "start": start, "end": time.time(), "met": met,
                        "threads": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")}) + "\\n")
print(protocol.encode("result", status="ok", error=None,
                      measured={"phase": "done", "step_ms": 10.0 * batch,
                                "loss_last": float((seen or "-1").replace(",", "")),
                                "not_a_field": 1}), end="", flush=True)
"""


def overlapping(a, b) -> bool:
    """Two ProtocolChild log entries ran at once."""
    return a["start"] < b["end"] and b["start"] < a["end"]


def check_two_gpus_then_a_third_waits(log: list[dict]) -> None:
    """A cluster chose the GPUs of three ProtocolChild jobs (log entries in start order): the
    first two met at their barrier, running at once on GPUs 0 and 1; the third waited for one of
    them to be free; no two jobs ever shared a GPU."""
    assert len(log) == 3, log
    assert {e["seen"] for e in log[:2]} == {"0", "1"} and [e["met"] for e in log[:2]] == [True] * 2
    assert log[2]["seen"] in ("0", "1") and log[2]["start"] >= min(e["end"] for e in log[:2])
    for a in log:
        for b in log:
            if a is not b and overlapping(a, b):
                assert a["seen"] != b["seen"]


class ProtocolChild:
    """`ScriptedProcesses`' script of PROTOCOL_CHILD: it reports a step time of 10 ms x its batch
    (and its CUDA_VISIBLE_DEVICES as loss_last), so a record that got another job's result shows
    it; logs batch, devices seen, start and end into `log` (JSON lines, `entries()`)."""

    def __init__(self, folder: Path, sleep_s: float = 0.0, together: int = 0,
                 gpu: str = "cpu"):
        self.log = Path(folder) / "children.jsonl"
        self.barrier = Path(folder) / "barrier"
        self.barrier.mkdir(parents=True, exist_ok=True)
        self.sleep_s, self.together, self.gpu = sleep_s, together, gpu

    def __call__(self, job: Job) -> list[str]:
        return [PROTOCOL_CHILD, job.payload(), self.log, self.sleep_s, self.barrier,
                self.together, self.gpu]

    def entries(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


HANG = """
import subprocess, sys, time, pathlib
# A grandchild in the same process group, as inductor's compile workers are.
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
if len(sys.argv) > 1:
    pathlib.Path(sys.argv[1]).write_text(str(p.pid))
print("hanging", flush=True)
time.sleep(600)
"""

# A child that reports a finished setup at once, so that the setup after a hang needs no real
# model and the hang's timeout can be short.
QUICK_OK = """
from stepbench import protocol
print(protocol.encode("start", machine={"gpu": "cpu", "hostname": "quick"}, software={}), end="")
print(protocol.encode("result", status="ok", error=None,
                      measured={"phase": "done", "step_ms": 1.0}), end="", flush=True)
"""

SEGFAULT = """
import ctypes, sys
print("about to crash", file=sys.stderr, flush=True)
ctypes.string_at(0)
"""


class InProcess(Executor):
    """An Executor (stepbench.execute.protocol) that starts no process: each job's
    outcome is made here, with `step_times(job)` as its timed steps (None: the job was stopped,
    as by Ctrl-C or a lost host) and `wall_s(job)` as its wall time. `ran` lists (batch,
    repeat) in the order the jobs ran. For the runner's own decisions (which jobs, in which
    order) in the fast loop."""

    host = None

    def __init__(self, step_times: Callable[[Job], list[float] | None],
                 wall_s: Callable[[Job], float] | None = None):
        self.slots = ["0"]
        self.step_times = step_times
        self.wall_s = wall_s or (lambda job: 0.0)
        self.ran: list[tuple[int, int]] = []

    def slots_needed(self, setup) -> int:
        return 1

    def gpu_name(self, setup, slot) -> str:
        return "cpu"

    def run(self, job: Job, slot: str, timeout_s: float, on_message) -> Outcome:
        self.ran.append((job.setup.batch, job.repeat))
        times = self.step_times(job)
        if times is None:
            return Outcome(stopped=True)
        measured = {"phase": "done", "step_times_ms": times, "step_ms": statistics.fmean(times),
                    "step_ms_median": statistics.median(times)}
        return Outcome(result={"status": "ok", "error": None, "measured": measured},
                       returncode=0, wall_s=self.wall_s(job))

    def stop(self) -> None: ...

    def close(self) -> None: ...
