"""stepbench's side of an SSH host: what execute/hosts/ssh.py runs there, in the prepared environment.

`python -m stepbench.execute.hosts.hostside probe DEVICE` prints one JSON line: the device `DEVICE`
(auto, cuda, cpu) resolves to there, the GPU's name (the one the resume key uses, found by the
same route as a setup's own process), and the software versions; or {"error": ...}.

`python -m stepbench.execute.hosts.hostside run SPEC` runs one command (a setup's process, or `stepbench
peak`) the way LocalProcess runs it here: in a new session, so that it and everything it starts
is one process group, killed whole after it exits, on SIGTERM/SIGHUP, and when this process's
stdin reaches its end. The parent never writes to stdin: it reaches its end when the parent
closes it (a timeout, Ctrl-C) or when the SSH connection is gone, so no setup outlives the run
that started it. The command's stdout (the protocol's JSON lines) is passed through as it comes,
its stderr goes to this process's stderr, and a last line {"event": "exit", "returncode": N,
"start": "server"|"fresh", "oom_killed": ...} gives its exit code (negative: the signal that
killed it), how it started (forked by a process server: the host's, when SPEC names its socket
("server"), or one of its own that SPEC's "preload" asks for (a Slurm job's); else fresh) and,
for a SIGKILL, why the host's kernel took it for its out-of-memory killer's victim, or null
(execute/oom.py). A first line {"event": "placed", ...} says where it runs (host,
CUDA_VISIBLE_DEVICES, and what SPEC's "placed" adds), for a cluster that chose the place
(execute/ray/jobs.py, execute/slurm/jobs.py): a setup's timeout counts from there, after
its own process server (if any) started. Lines pass through whole, so that they
stay whole where stdout and stderr share one log (a Ray job's). When SPEC names a `rank_dir` (a
torchrun job), the ranks' state files are written there and sent back on one line
{"event": "ranks", "states": [...]} before the exit line. `Lines` reads that output on the
other side.

`python -m stepbench.execute.hosts.hostside serve PATH PRELOAD [CWD]` is that server for one run
(execute/local/serving.py `serve_at`): it listens at PATH, prints one "ready" JSON line, and ends (its
children with it) when its stdin ends: when the SSH channel that started it closes.
"""

from __future__ import annotations

import collections
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from stepbench import protocol
from stepbench.execute import oom
from stepbench.execute.local import FRESH, SERVER
from stepbench.execute.local.process import WAKE_S, kill_group
from stepbench.execute.protocol import OnMessage, Outcome, read_rank_states, take
from stepbench.measure.distributed import RANK_DIR_ENV
from stepbench.process import die_with_parent

MODULE = "stepbench.execute.hosts.hostside"   # what the other side runs: `python -m MODULE ...`
EXIT_EVENT = "exit"
PLACED_EVENT = "placed"
RANKS_EVENT = "ranks"


def command(python: str, *args: str) -> list[str]:
    """`python -m stepbench.execute.hosts.hostside ARGS...`: this module there."""
    return [python, "-m", MODULE, *args]


def event_of(line: str | bytes) -> dict | None:
    """A line of hostside's output as the JSON object it holds (an event), or None."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


@dataclass
class Exit:
    """How the command that `hostside run` ran ended, as its exit line says."""

    returncode: int | None = None
    start: str | None = None            # server (forked by a process server) or fresh
    oom_killed: str | None = None       # why the host's kernel took it for the OOM killer's victim
    server_start_s: float | None = None  # its own process server's start, where it had one
    # As the host's clock measured them (LocalProcess's wall_s and exit_s): from the process's
    # start to its end (its group killed), and from its result line to its end.
    wall_s: float | None = None
    exit_s: float | None = None
    at: float | None = None             # time.monotonic() when the line was read

    @classmethod
    def of(cls, message: dict) -> "Exit":
        return cls(message.get("returncode"), message.get("start"), message.get("oom_killed"),
                   message.get("server_start_s"), message.get("wall_s"), message.get("exit_s"),
                   time.monotonic())

    def tell(self, outcome: Outcome) -> None:
        """Put what it says into `outcome`: the exit code, the OOM killer's verdict, and how
        the process started (its placement)."""
        outcome.returncode, outcome.oom_killed = self.returncode, self.oom_killed
        if self.start:
            outcome.placement["start"] = self.start
        if self.server_start_s is not None:
            outcome.placement["server_start_s"] = self.server_start_s


class Lines:
    """The other side of `hostside run`: its output as it arrives, in chunks cut anywhere (a Ray
    job's log, a Slurm job's log file) or line by line (an SSH channel). The protocol's messages
    go to the outcome and `on_message`; hostside's own lines are kept (`placed`, `ranks`,
    `exit`); any other line is kept in `other` (what shares the log: stderr, a launcher's)."""

    def __init__(self, outcome: Outcome, on_message: OnMessage):
        self.outcome, self.on_message = outcome, on_message
        self.pending = ""
        self.placed: dict | None = None     # the placed line
        self.placed_at: float | None = None  # time.monotonic() when it came: the timeout's start
        self.ranks: list[dict] = []
        self.exit: Exit | None = None
        self.other: collections.deque = collections.deque(maxlen=200)

    def feed(self, chunk: str) -> None:
        *lines, self.pending = (self.pending + chunk).split("\n")
        for line in lines:
            self.line(line)

    def line(self, line: str | bytes) -> str | None:
        """Take one whole line; the event of hostside's own line, else None."""
        message = event_of(line)
        event = message.get("event") if message else None
        if event == PLACED_EVENT:
            if self.placed is None:
                self.placed_at = time.monotonic()
            self.placed = message
        elif event == RANKS_EVENT:
            self.ranks = message.get("states") or []
        elif event == EXIT_EVENT:
            self.exit = Exit.of(message)
        else:
            said = protocol.decode(line)
            if said is not None:
                take(said, self.outcome, self.on_message)
            else:
                if isinstance(line, bytes):
                    line = line.decode("utf-8", "replace")
                if line.strip():
                    self.other.append(line.rstrip("\n"))
            return None
        return event


def probe(device: str) -> dict:
    try:
        import torch

        from stepbench.measure.machine import gpu_name, software_info
    except ImportError as exc:
        return {"error": f"cannot import {exc.name or exc} there ({exc}); install it for the "
                         "remote Python, or pass --remote-python the Python that has torch"}
    available = torch.cuda.is_available()
    if device == "cuda" and not available:
        return {"error": "--device cuda was asked for, but torch there sees no CUDA GPU "
                         f"(torch {torch.__version__}); use --device cpu or a CUDA build of torch"}
    if device == "auto":
        device = "cuda" if available else "cpu"
    return {"device": device, "gpu": gpu_name(device), "software": software_info()}


class _Stop(Exception):
    pass


def _raise_stop(signum, frame):
    raise _Stop(signum)


def run(spec: dict) -> int:
    if spec.get("cwd"):     # relative: to where this runs (a Ray job's working_dir)
        spec = dict(spec, cwd=os.path.abspath(spec["cwd"]))
        os.makedirs(spec["cwd"], exist_ok=True)     # an empty folder may not travel
    for folder in spec.get("dirs", []):
        os.makedirs(folder, exist_ok=True)
    env = dict(os.environ, **spec.get("env", {}))
    rank_dir = spec.get("rank_dir")
    if rank_dir:
        os.makedirs(rank_dir, exist_ok=True)
        env[RANK_DIR_ENV] = rank_dir
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _raise_stop)
    out = sys.stdout.buffer
    proc = own = watch = result_at = None
    start, began = FRESH, time.monotonic()
    try:
        # Its own server starts before the placed line: its imports are the run's, not the
        # setup's (a local run's server starts before the setup's clock too).
        own = _own_server(spec)
        _send(out, {"event": PLACED_EVENT, "hostname": socket.gethostname(),
                    "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
                    **spec.get("placed", {})})
        watch = oom.Watch()
        began = time.monotonic()
        proc, start = _forked(spec, env, own), SERVER
        if proc is None:
            proc, start = subprocess.Popen(spec["argv"], stdin=subprocess.DEVNULL,
                                           stdout=subprocess.PIPE, env=env, cwd=spec.get("cwd"),
                                           start_new_session=True,
                                           preexec_fn=die_with_parent), FRESH
        result_at = _pass_through(proc, out, watch_stdin=spec.get("watch_stdin", True))
    except (_Stop, BrokenPipeError):
        pass
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)      # already stopping: finish the clean-up
        if proc is not None:
            kill_group(proc)
    ended = time.monotonic()
    try:
        if rank_dir:
            _send(out, {"event": RANKS_EVENT, "states": read_rank_states(Path(rank_dir))})
            shutil.rmtree(rank_dir, ignore_errors=True)
        for folder in spec.get("cleanup", []):      # this process's own folders (a Ray job's)
            shutil.rmtree(folder, ignore_errors=True)
        killed = None
        if watch is not None:
            if proc is not None and proc.returncode == -signal.SIGKILL:
                killed = watch.verdict(proc.pid)
            watch.close()
        _send(out, {"event": EXIT_EVENT, "returncode": proc.returncode if proc else None,
                    "start": start if proc else None, "oom_killed": killed,
                    "server_start_s": round(own.ready_s, 3) if own and own.ready_s else None,
                    "wall_s": round(ended - began, 3) if proc else None,
                    "exit_s": round(ended - result_at, 3) if result_at else None})
    finally:
        if own is not None:     # after the exit line: the setup's process has ended already
            own.close()
    return 0


def _send(out, message: dict) -> None:
    try:
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()
    except BrokenPipeError:
        pass


def _own_server(spec: dict):
    """A process server of this process's own, where SPEC asks for one ("preload": what it
    imports) for a setup's process (a Slurm job's, where no server outlives its job), or None
    (then the process starts fresh; stderr says why)."""
    if spec.get("preload") is None or not spec.get("payload") or spec.get("server"):
        return None
    from stepbench.execute.local.server import ProcessServer, ServerError

    try:
        return ProcessServer(spec["preload"]).start()
    except ServerError as exc:
        print(f"stepbench: no process server ({exc}); the setup's process starts fresh",
              file=sys.stderr, flush=True)
        return None


def _forked(spec: dict, env: dict, own=None):
    """The setup's process forked by this host's process server (`serve`) or by this process's
    own, or None where the spec names none or it cannot (then the process starts fresh;
    stderr says why)."""
    if not (spec.get("server") or own) or not spec.get("payload"):
        return None
    from stepbench.execute.local.server import ProcessServer, ServerError

    try:
        server = own or ProcessServer.connect(spec["server"])
        return server.spawn(spec["payload"], env, sys.stderr.fileno(), cwd=spec.get("cwd"))
    except (OSError, ServerError) as exc:
        print(f"stepbench: the host's process server could not start this setup ({exc}); it "
              "starts fresh", file=sys.stderr, flush=True)
        return None


def serve(path: str, preload: str, cwd: str | None = None) -> NoReturn:
    """This host's process server for one run, listening at `path` (execute/local/serving.py);
    this process ends once it has ended what it forked (serving.ended). `cwd`: the folder it
    runs in (a user's workload files, which its preload imports from there, as the setups'
    processes it forks do), first on sys.path as `python -m` puts the folder it starts in."""
    from stepbench.execute.local.serving import ended, serve_at

    if cwd:
        started = os.getcwd()
        os.chdir(cwd)
        sys.path = [os.getcwd() if p in (started, "") else p for p in sys.path]

    ended(lambda: serve_at(path, json.loads(preload)))


def _pass_through(proc: subprocess.Popen, out, watch_stdin: bool = True) -> float | None:
    """Copy the command's stdout to ours, whole lines at a time, until it ends; return early
    when stdin ends, where it is watched (not in a Ray or Slurm job, which has no parent on
    stdin: the cluster stops it with SIGTERM). When its result line passed (time.monotonic()),
    or None."""
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ, "child")
    if watch_stdin:
        selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    pending, result_at = b"", None
    try:
        while True:
            for key, _ in selector.select(timeout=WAKE_S):
                data = os.read(key.fd, 65536)
                if key.data == "parent":
                    if not data:
                        return result_at    # the parent closed stdin, or its connection is gone
                    continue
                if not data:
                    return result_at
                whole, _, pending = (pending + data).rpartition(b"\n")
                if whole:
                    out.write(whole + b"\n")
                    out.flush()
                    if result_at is None and any(
                            (protocol.decode(line) or {}).get("event") == "result"
                            for line in whole.split(b"\n")):
                        result_at = time.monotonic()
            if proc.poll() is not None and not selector.select(timeout=0):
                return result_at        # exited; a grandchild may hold its stdout open
    finally:
        if pending:
            out.write(pending + b"\n")
            out.flush()
        selector.close()


def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"]:
        print(json.dumps(probe(argv[1] if len(argv) > 1 else "auto")), flush=True)
        return 0
    if argv[:1] == ["run"] and len(argv) == 2:
        return run(json.loads(argv[1]))
    if argv[:1] == ["serve"] and len(argv) in (3, 4):
        serve(*argv[1:])
    print("usage: python -m stepbench.execute.hosts.hostside probe DEVICE | run SPEC | serve PATH "
          "PRELOAD [CWD]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
