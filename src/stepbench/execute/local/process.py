"""The local backend's executor: each setup's process on this host, forked by a process server
(local/server.py) or started fresh, in a session of its own whose group is killed whole.

A child sees only its slots' GPUs (CUDA_VISIBLE_DEVICES, with `--gpus`); every other variable,
NCCL's included, passes through untouched. A distributed setup runs as a torchrun job
(protocol.worker_command), whose ranks report through the same protocol (measure/distributed.py).
"""

from __future__ import annotations

import hashlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from stepbench import protocol
from stepbench.execute import oom
from stepbench.execute.local import FRESH, SERVER, uses_server
from stepbench.execute.local.server import (READY_FLOOR_S, READY_TIMEOUT_S, ForkedChild,
                                           ProcessServer, ServerError)
from stepbench.execute.protocol import (KILL_GRACE_S, Executor, Job, OnMessage, Outcome,
                                        Rendezvous, now_iso, rank_verdict, read_rank_states,
                                        tail, take, worker_command)
from stepbench.measure.distributed import RANK_DIR_ENV
from stepbench.setup import Setup

WAKE_S = 1.0            # while waiting for a line, look at the child's exit this often


class LocalProcess(Executor):
    """Each job in a fresh `python -m stepbench.measure.worker` process on this host.

    The child gets a new session, so it and everything it starts (inductor's compile workers)
    form one process group that is killed whole on a timeout, on stop() and after a normal exit.
    Its stderr goes to a file whose tail the parent keeps. Compiled setups get an inductor cache
    each (cold on the first process, warm on later repeats) unless `compile_cache` names a folder
    that every setup shares.

    `gpus` (CUDA indices as this process sees them) makes a pool: one slot per GPU, and each
    child sees only its slots' GPUs through CUDA_VISIBLE_DEVICES. None (the default) is one slot
    whose child sees what this process sees. A distributed setup runs as a torchrun job (its
    `command`), whose ranks report through the same protocol (measure/distributed.py).
    """

    def __init__(self, compile_cache: Path | None = None, python: str = sys.executable,
                 gpus: list[int] | None = None, rendezvous: Rendezvous | None = None,
                 start: str = FRESH, preload: dict | None = None,
                 note: Callable[[str], None] = lambda text: None):
        self.start = start              # SERVER (forked by a process server) or FRESH
        self.preload = preload or {"models": [], "compile": True}
        self.note = note
        self._server = None             # the ProcessServer, started by the first job that needs it
        self._server_lock = threading.Lock()
        self._server_starts = 0
        self.gpus = list(gpus) if gpus is not None else None
        self.slots = [str(g) for g in self.gpus] if self.gpus else ["0"]
        self.compile_cache = compile_cache
        self.python = python
        self.rendezvous = rendezvous or Rendezvous()
        self.workdir = Path(tempfile.mkdtemp(prefix="stepbench-"))
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._stopping = False
        self._starting = None           # a ProcessServer whose start() is in progress

    def slots_needed(self, setup: Setup) -> int:
        # A torchrun job needs one GPU per local process; on the CPU its ranks share the host.
        return setup.nproc if self.gpus is not None and setup.device == "cuda" else 1

    def where(self, job: Job, slot: str) -> str | None:
        """'GPU 1', 'GPUs 0,1' where a pool was given; None otherwise."""
        if self.gpus is None or job.setup.device != "cuda":
            return None
        return f"GPU{'s' if ',' in slot else ''} {slot}"

    def gpu_name(self, setup: Setup, slot: str) -> str | None:
        from stepbench.measure.machine import gpu_name

        return gpu_name(setup.device, int(slot.split(",")[0]) if self.gpus is not None else 0)

    def command(self, job: Job) -> list[str]:
        return worker_command(self.python, job, self.rendezvous)

    def visible_devices(self, slot: str) -> str:
        """CUDA_VISIBLE_DEVICES for a child in `slot`, through this process's own list when set
        (--gpus 0,1 under CUDA_VISIBLE_DEVICES=2,3 gives the child "2,3")."""
        outer = os.environ.get("CUDA_VISIBLE_DEVICES")
        entries = [e.strip() for e in outer.split(",")] if outer else None
        return ",".join(entries[int(i)] if entries else i for i in slot.split(","))

    def compile_threads(self, setup: Setup) -> int | None:
        """inductor's compile threads per process when several processes compile at once: the
        host's CPUs split evenly, so that concurrent compiles do not fight over them; None (its
        own default) when one process runs alone or the user set TORCHINDUCTOR_COMPILE_THREADS."""
        at_once = max(len(self.slots) if self.gpus is not None else 1, setup.nproc)
        if at_once <= 1 or "TORCHINDUCTOR_COMPILE_THREADS" in os.environ:
            return None
        return max(1, len(os.sched_getaffinity(0)) // at_once)

    def environment(self, job: Job, slot: str | None = None) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # The child imports this very stepbench, also when it runs from a checkout.
        src = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        if slot is not None and self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible_devices(slot)
        threads = self.compile_threads(job.setup)
        if threads:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
        if job.setup.mode == "compile":
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

    def run(self, job: Job, slot: str, timeout_s: float, on_message: OnMessage) -> Outcome:
        outcome = Outcome(started_at=now_iso())
        name = f"{threading.get_ident()}-{time.monotonic_ns()}"
        stderr_path = self.workdir / f"stderr-{name}.log"
        env = self.environment(job, slot)
        outcome.placement = self.placement(job, slot, env)
        rank_dir = None
        if job.setup.distributed:
            rank_dir = self.workdir / f"ranks-{name}"
            rank_dir.mkdir()
            env[RANK_DIR_ENV] = str(rank_dir)
        # Before the clock starts: the server's one-time start is the run's, not this setup's
        # (recorded in the placement of the job that waited for it).
        server = self._server_for(job, outcome.placement, timeout_s)
        watch = oom.Watch()     # the kernel log and OOM-kill counts as the process starts
        start = time.monotonic()
        try:
            with open(stderr_path, "wb") as stderr:
                proc = self._spawn(job, env, stderr, server, outcome.placement)
                with self._lock:
                    self._running.add(proc)
                    stopping = self._stopping
                try:
                    if stopping:   # stop() came between this job's start and its registration
                        kill_group(proc)
                    outcome.timed_out = read_messages(proc, start + timeout_s, outcome,
                                                      on_message)
                finally:
                    kill_group(proc)
                    if outcome.result_at is not None:
                        outcome.exit_s = time.monotonic() - outcome.result_at
                    with self._lock:
                        self._running.discard(proc)
                        outcome.stopped = self._stopping
            outcome.returncode = proc.returncode
            if isinstance(proc, ForkedChild) and proc.exit_unknown:
                outcome.detail = "its exit status is unknown: the process server died while it ran"
            elif was_killed(outcome):
                outcome.oom_killed = watch.verdict(proc.pid)
        finally:
            watch.close()
        outcome.stderr_tail = tail(stderr_path)
        stderr_path.unlink(missing_ok=True)
        if rank_dir is not None:
            rank_verdict(outcome, read_rank_states(rank_dir))
            shutil.rmtree(rank_dir, ignore_errors=True)
        outcome.wall_s = time.monotonic() - start
        outcome.finished_at = now_iso()
        return outcome

    def _spawn(self, job: Job, env: dict[str, str], stderr, server, placement: dict):
        """The job's process: forked by the server, or started fresh. Either way in a new
        session (one process group to kill whole, and Ctrl-C kept away from it, so that only the
        parent decides what happens to it)."""
        if server is not None:
            try:
                child = server.spawn(job.payload(), env, stderr.fileno())
                placement["start"] = SERVER
                return child
            except ServerError as exc:
                with self._server_lock:
                    if uses_server(self.start):
                        self.note(f"{exc}; every setup's process starts fresh from here")
                        self.start = FRESH
        placement["start"] = FRESH
        return subprocess.Popen(self.command(job), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=stderr, env=env,
                                start_new_session=True)

    def _server_for(self, job: Job, placement: dict, timeout_s: float = READY_TIMEOUT_S):
        """The running process server for `job` (started, or started again, here, within the
        setups' `timeout_s`, READY_FLOOR_S at least), or None: fresh start asked for, a torchrun
        job, a server that could not start, or stop() came while it started."""
        if not uses_server(self.start) or job.setup.distributed:
            return None
        with self._server_lock:
            if self._server is not None and not self._server.dead:
                return self._server
            if self._server is not None:
                code = self._server._proc.poll() if self._server._proc else None
                self.note(f"the process server died (exit code {code}); starting a new one")
                self._server.close()
            log = self.workdir / f"server-{self._server_starts + 1}.log"
            server = ProcessServer(self.preload, log=log)
            with self._lock:
                if self._stopping:
                    return None
                self._starting = server
            try:
                self._server = server.start(min(READY_TIMEOUT_S, max(timeout_s, READY_FLOOR_S)))
            except ServerError as exc:
                if not server.aborted:
                    self.note(f"{exc}; every setup's process starts fresh")
                self.start, self._server = FRESH, None
                return None
            finally:
                with self._lock:
                    self._starting = None
            self._server_starts += 1
            placement["server_start_s"] = round(self._server.ready_s, 3)
            if self._server_starts == 1:
                imports = self._server.info.get("imports_s") or {}
                self.note(f"process server ready in {self._server.ready_s:.1f} s (imports: "
                          + ", ".join(f"{k} {v:.1f} s" for k, v in imports.items()) + ")")
            return self._server

    def placement(self, job: Job, slot: str, env: dict[str, str]) -> dict:
        """Where the job ran, for its record: its GPUs (CUDA indices as stepbench was given them,
        and the CUDA_VISIBLE_DEVICES its processes got), and inductor's compile threads."""
        pinned = self.gpus is not None and job.setup.device == "cuda"
        return {"gpus": [int(i) for i in slot.split(",")] if pinned else None,
                "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES") if pinned else None,
                "compile_threads": int(env["TORCHINDUCTOR_COMPILE_THREADS"])
                if "TORCHINDUCTOR_COMPILE_THREADS" in env else None,
                "concurrent": 1}

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            running = list(self._running)
            if self._starting is not None:
                self._starting.abort()
        for proc in running:
            kill_group(proc)

    def close(self) -> None:
        with self._server_lock:
            if self._server is not None:
                self._server.close()
                self._server = None
        shutil.rmtree(self.workdir, ignore_errors=True)


def was_killed(outcome: Outcome) -> bool:
    """Whether a process died of a SIGKILL that stepbench did not send (a timeout or a stop
    ends the group with SIGTERM, then SIGKILL) before it sent its result."""
    return (outcome.returncode == -signal.SIGKILL and outcome.result is None
            and not outcome.timed_out and not outcome.stopped)


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
                    take(protocol.decode(line), outcome, on_message)
            elif proc.poll() is not None:
                return False
    finally:
        selector.close()
        proc.stdout.close()


def kill_group(proc: subprocess.Popen) -> None:
    """End the child's whole process group and every process below it: SIGTERM, then SIGKILL
    after a grace period.

    torchrun starts each rank in a session of its own, outside the child's group, so the
    descendants are listed (while the child still holds them) and signalled one by one, each with
    its own group (a rank's compile workers). Also called after a normal exit, to end compile
    workers the child may have left behind.
    """
    family = _descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        group_gone = False
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            group_gone = True
        alive = _signal_all(family, sig)
        if group_gone and not alive:
            break
        try:
            proc.wait(timeout=KILL_GRACE_S)  # returns at once when the leader is already gone
        except subprocess.TimeoutExpired:
            pass
        if alive:
            import psutil

            _, alive = psutil.wait_procs(alive, timeout=KILL_GRACE_S)
            family = alive
    proc.wait()


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_all(processes: list, sig: int) -> list:
    """Send `sig` to each process (and to its group, where it leads one); return those alive."""
    import psutil

    alive = []
    for p in processes:
        try:
            if not p.is_running():
                continue
            if os.getpgid(p.pid) == p.pid:
                os.killpg(p.pid, sig)
            else:
                p.send_signal(sig)
            alive.append(p)
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass
    return alive


