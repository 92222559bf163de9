"""Where a setup's process runs. An Executor runs one job with a timeout and reports what it saw.

The runner (runner.py) only talks to this seam: `run(job, slot, timeout_s, on_message)` returns an
Outcome built from the child's JSON lines (stepbench.protocol), its exit code and the clock, and
`stop()` ends everything in flight. LocalProcess runs children on this host; a torchrun or SSH
executor (execute/ssh.py) carries the same lines from elsewhere and plugs in without touching the
runner.

A slot is a place where one setup runs at a time (this host's one GPU or CPU here; one GPU of
several, or one remote host, later): the runner keeps one job in flight per slot.
"""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Protocol

from stepbench import protocol
from stepbench.setup import Setup

STDERR_TAIL_CHARS = 2000
KILL_GRACE_S = 5.0      # SIGTERM, then SIGKILL after this long
WAKE_S = 1.0            # while waiting for a line, look at the child's exit this often


@dataclass(frozen=True)
class Job:
    """One process to run: a setup, which repeat, and what the child needs beyond the setup."""

    setup: Setup
    repeat: int = 0
    peak_tflops_measured: float | None = None   # the device's matmul rate, for mfu_measured

    def payload(self) -> str:
        return json.dumps({"setup": self.setup.to_dict(),
                           "peak_tflops_measured": self.peak_tflops_measured})


@dataclass
class Outcome:
    """What the parent saw of one child."""

    start: dict | None = None          # the child's "start" message: machine, software
    progress: dict = field(default_factory=dict)   # its last "progress" message
    result: dict | None = None         # its "result" message: status, error, measured
    returncode: int | None = None
    timed_out: bool = False
    stopped: bool = False              # ended by stop() (Ctrl-C, SIGTERM): not a result
    stderr_tail: str = ""
    started_at: str = ""
    finished_at: str = ""
    wall_s: float = 0.0


OnMessage = Callable[[dict], None]


class Executor(Protocol):
    slots: list[str]
    host: str | None     # the SSH host it runs on (tags records, part of the resume key); None here

    def gpu_name(self, setup: Setup, slot: str) -> str | None:
        """The GPU `setup` would run on in `slot` ("cpu" on the CPU): part of the resume key."""

    def measure_peak(self, dtype: str, slot: str) -> float | None:
        """The matmul rate in TFLOP/s of the GPU in `slot`, measured in a child, or None."""

    def run(self, job: Job, slot: str, timeout_s: float, on_message: OnMessage) -> Outcome:
        """Run `job` in `slot`; call `on_message` with each protocol message as it arrives."""

    def stop(self) -> None:
        """End every job in flight now (their outcomes come back with stopped=True)."""

    def close(self) -> None:
        """Remove what the executor made (temporary folders)."""


class LocalProcess:
    """Each job in a fresh `python -m stepbench.measure.worker` process on this host.

    The child gets a new session, so it and everything it starts (inductor's compile workers)
    form one process group that is killed whole on a timeout, on stop() and after a normal exit.
    Its stderr goes to a file whose tail the parent keeps. Compiled setups get an inductor cache
    each (cold on the first process, warm on later repeats) unless `compile_cache` names a folder
    that every setup shares.
    """

    def __init__(self, compile_cache: Path | None = None, python: str = sys.executable):
        self.slots = ["0"]
        self.host = None
        self.compile_cache = compile_cache
        self.python = python
        self.workdir = Path(tempfile.mkdtemp(prefix="stepbench-"))
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._stopping = False

    def gpu_name(self, setup: Setup, slot: str) -> str | None:
        from stepbench.measure.machine import gpu_name

        return gpu_name(setup.device)

    def command(self, job: Job) -> list[str]:
        return [self.python, "-m", "stepbench.measure.worker", job.payload()]

    def environment(self, job: Job | None) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # The child imports this very stepbench, also when it runs from a checkout.
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        if job is not None and job.setup.mode == "compile":
            cache, kind = self._cache_for(job.setup)
            env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
            # Triton kernels cache beside inductor's, so "cold" really is cold on a GPU.
            env["TRITON_CACHE_DIR"] = str(cache / "triton")
            env[protocol.CACHE_KIND_ENV] = kind
        return env

    def _cache_for(self, setup: Setup) -> tuple[Path, str]:
        if self.compile_cache is not None:
            self.compile_cache.mkdir(parents=True, exist_ok=True)
            return self.compile_cache, "shared"
        folder = self.workdir / "inductor" / hashlib.sha1(setup.key().encode()).hexdigest()[:12]
        folder.mkdir(parents=True, exist_ok=True)
        return folder, "private"

    def measure_peak(self, dtype: str, slot: str) -> float | None:
        command = [self.python, "-m", "stepbench", "peak", "--device", "cuda", "--dtype", dtype,
                   "--format", "json"]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=300,
                                  env=self.environment(None), start_new_session=True)
            return float(json.loads(proc.stdout)["measured_tflops"])
        except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
            return None

    def run(self, job: Job, slot: str, timeout_s: float, on_message: OnMessage) -> Outcome:
        outcome = Outcome(started_at=now_iso())
        stderr_path = self.workdir / f"stderr-{threading.get_ident()}-{time.monotonic_ns()}.log"
        start = time.monotonic()
        with open(stderr_path, "wb") as stderr:
            # A new session: one process group to kill whole; it also keeps Ctrl-C away from
            # the child, so that only the parent decides what happens to it.
            proc = subprocess.Popen(self.command(job), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=stderr,
                                    env=self.environment(job), start_new_session=True)
            with self._lock:
                self._running.add(proc)
                stopping = self._stopping
            try:
                if stopping:   # stop() came between this job's start and its registration
                    kill_group(proc)
                outcome.timed_out = read_messages(proc, start + timeout_s, outcome, on_message)
            finally:
                kill_group(proc)
                with self._lock:
                    self._running.discard(proc)
                    outcome.stopped = self._stopping
        outcome.returncode = proc.returncode
        outcome.stderr_tail = tail(stderr_path)
        stderr_path.unlink(missing_ok=True)
        outcome.wall_s = time.monotonic() - start
        outcome.finished_at = now_iso()
        return outcome

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            running = list(self._running)
        for proc in running:
            kill_group(proc)

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


def read_messages(proc: subprocess.Popen, deadline: float, outcome: Outcome,
                  on_message: OnMessage) -> bool:
    """Read the child's protocol lines until it closes its stdout or exits; True when the deadline
    passed first. Blocks in select(), waking at most once a second to look at the child's exit
    (a grandchild could hold the pipe open after the child died)."""
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    fd, pending = proc.stdout.fileno(), b""
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            if selector.select(timeout=min(remaining, WAKE_S)):
                chunk = os.read(fd, 65536)
                if not chunk:
                    return False
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    _take(protocol.decode(line), outcome, on_message)
            elif proc.poll() is not None:
                return False
    finally:
        selector.close()
        proc.stdout.close()


def _take(message: dict | None, outcome: Outcome, on_message: OnMessage) -> None:
    if message is None:
        return
    if message["event"] == "start":
        outcome.start = message
    elif message["event"] == "progress":
        outcome.progress = message
    else:
        outcome.result = message
    on_message(message)


def kill_group(proc: subprocess.Popen) -> None:
    """End the child's whole process group: SIGTERM, then SIGKILL after a grace period.

    Also called after a normal exit, to end compile workers the child may have left behind.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=KILL_GRACE_S)  # returns at once when the leader is already gone
        except subprocess.TimeoutExpired:
            pass
    proc.wait()


def tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    try:
        data = path.read_bytes()[-chars:]
    except OSError:
        return ""
    return data.decode("utf-8", "replace").strip()


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
