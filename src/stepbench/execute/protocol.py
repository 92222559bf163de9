"""The seam between the runner and where a setup's process runs: what every backend implements.

The runner (runner.py) only talks to an `Executor`: `run(job, slot, timeout_s, on_message)`
returns an Outcome built from the child's JSON lines (stepbench.protocol), its exit code and the
clock, and `stop()` ends everything in flight. The local backend (local/) runs children on this
host; SSH hosts (hosts/), rented machines (rent/), Ray (ray/) and Slurm (slurm/) carry the same
lines from elsewhere. A backend is chosen by name (registry.py); everything the runner and the
CLI ask of one is declared on `Executor`, with the defaults most backends keep.

A slot is a place where one process runs at a time: this host's one GPU or CPU, or one GPU of a
pool (`--gpus`). A job takes `slots_needed(setup)` slots at once (a torchrun job of N processes
takes N GPUs), and the runner never gives one slot to two jobs.

A setup's process is `worker_command`: the worker (measure/worker.py), or torchrun with a rank
worker (measure/rank.py) per process of a distributed setup, wherever it runs.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from stepbench.setup import Setup

if TYPE_CHECKING:
    from stepbench.record import Record

STDERR_TAIL_CHARS = 2000
KILL_GRACE_S = 5.0      # SIGTERM, then SIGKILL after this long
WORKER_MODULE = "stepbench.measure.worker"    # a setup's process
RANK_MODULE = "stepbench.measure.rank"        # one rank of a torchrun job


@dataclass(frozen=True)
class Job:
    """One process to run: a setup, which repeat, and what the child needs beyond the setup."""

    setup: Setup
    repeat: int = 0
    measure_peak: bool = True       # the child measures (or finds cached) the GPU's matmul rate
    profile: str | None = None      # where the child writes one step's profile (a path stem)
    # A search's measurement before its finals (runner.before_finals): the GPU's matmul rate
    # and the FLOP counter's cross-check come from their caches only, never measured in it.
    probe: bool = False
    pin_cpus: str = "off"           # --pin-cpus: "auto" binds the process to its GPU's cores

    def payload(self) -> str:
        job = {"setup": self.setup.to_dict(), "measure_peak": self.measure_peak}
        if self.pin_cpus != "off":
            job["pin_cpus"] = str(self.pin_cpus)
        if self.profile:
            job["profile"] = self.profile
        if self.probe:
            job["probe"] = True
        return json.dumps(job)


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
    exit_s: float | None = None        # from the result message to the child's end
    result_at: float | None = None     # time.monotonic() when the result message arrived
    placement: dict = field(default_factory=dict)   # the record's `placement`: GPUs, threads
    detail: str | None = None          # what the executor adds to a timeout's or crash's error
    # Why a process that died of SIGKILL is taken for the kernel's OOM killer's victim (oom.py).
    oom_killed: str | None = None


@dataclass(frozen=True)
class Rendezvous:
    """Where a torchrun job's ranks meet (torchrun's --nnodes, --node-rank, --rdzv-endpoint).

    One node and no endpoint: `--standalone`, a rendezvous on a free port of this host, so jobs
    on one host never collide. Several nodes: node 0's host:port (torchrun's static rendezvous;
    every node runs the same command with its own --node-rank).
    """

    nnodes: int = 1
    node_rank: int = 0
    endpoint: str | None = None


OnMessage = Callable[[dict], None]

class Executor:
    """Where the runner's jobs run: one backend's executor. A backend subclasses this and
    implements `gpu_name`, `run` and `stop`; the rest has the defaults that fit a backend whose
    jobs take one slot each and whose records are found by their resume key."""

    slots: list[str] = ["0"]
    host: str | None = None         # the SSH host it runs on (tags records, part of the resume key)
    rental: dict | None = None      # a rented machine's provider and price, kept with each record
    run_id: str | None = None       # the run's id, where the backend named its jobs after it
    lost: str | None = None         # why the backend could not run the rest: the run's one line

    def slots_needed(self, setup: Setup) -> int:
        """How many slots a job of `setup` takes at once."""
        return 1

    def gpu_name(self, setup: Setup, slot: str) -> str | None:
        """The GPU `setup` would run on in `slot` ("cpu" on the CPU): part of the resume key."""
        raise NotImplementedError

    def find_done(self, job: Job, stored: list[Record],
                  by_key: dict[str, Record] | None = None) -> Record | None:
        """The stored record that is `job`'s, or None (`by_key`: `stored` by resume key, where
        the caller has it). Done on any slot's GPU counts (a host's GPUs are normally all of one
        kind); a backend that places jobs itself (a cluster) finds them otherwise."""
        from stepbench.record import resume_key

        if by_key is None:
            by_key = {r.resume_key(): r for r in stored}
        keys = {resume_key(job.setup, job.repeat, self.gpu_name(job.setup, s), self.host)
                for s in self.slots}
        return next((by_key[k] for k in keys if k in by_key), None)

    def where(self, job: Job, slot: str) -> str | None:
        """Where a job runs, for its progress line ('GPU 1'); None where that says nothing."""
        return None

    def run(self, job: Job, slot: str, timeout_s: float, on_message: OnMessage) -> Outcome:
        """Run `job` in `slot`; call `on_message` with each protocol message as it arrives."""
        raise NotImplementedError

    def stop(self) -> None:
        """End every job in flight now (their outcomes come back with stopped=True)."""
        raise NotImplementedError

    def close(self) -> None:
        """Remove what the executor made (temporary folders)."""


def worker_command(python: str, job: Job, rendezvous: Rendezvous | None = None,
                   payload: str | None = None) -> list[str]:
    """The command of `job`'s process under `python`: the worker, or for a distributed setup
    torchrun with a rank worker per process (`rendezvous`: where its ranks meet, default one
    node). `payload`: the job as the process reads it, where it differs from `job.payload()`
    (a host's copy of a model config)."""
    if job.setup.distributed:
        return torchrun_command(python, job, rendezvous or Rendezvous(), payload)
    return [python, "-m", WORKER_MODULE, payload or job.payload()]


def torchrun_command(python: str, job: Job, rdzv: Rendezvous,
                     payload: str | None = None) -> list[str]:
    """torchrun (torch.distributed.run) with one rank worker per process of the job."""
    s = job.setup
    command = [python, "-m", "torch.distributed.run", f"--nproc-per-node={s.nproc}",
               f"--nnodes={s.nnodes}", "--max-restarts=0"]
    if s.nnodes == 1 and rdzv.endpoint is None:
        command.append("--standalone")
    else:
        command += [f"--node-rank={rdzv.node_rank}", f"--rdzv-endpoint={rdzv.endpoint}"]
    return command + ["-m", RANK_MODULE, payload or job.payload()]



def take(message: dict | None, outcome: Outcome, on_message: OnMessage) -> None:
    """One protocol message of a setup's process into `outcome`, then to `on_message`."""
    if message is None:
        return
    if message["event"] == "start":
        outcome.start = message
    elif message["event"] == "progress":
        outcome.progress = message
    else:
        outcome.result = message
        outcome.result_at = time.monotonic()
    on_message(message)



def read_rank_states(folder: Path) -> list[dict]:
    """The state files of a torchrun job's ranks (measure/distributed.RankState), by rank."""
    states = []
    for path in folder.glob("rank-*.json"):
        try:
            states.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
    return sorted(states, key=lambda s: s.get("rank", 0))


# torchrun's summary of a failed job names the first rank that failed ("Root Cause").
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def rank_verdict(outcome: Outcome, states: list[dict]) -> None:
    """Say which rank failed and why: the first rank (by the time it wrote) that reported a
    failure; else, for a job that timed out, the phase each rank was in; else torchrun's root
    cause for a rank that died without a word."""
    failed = sorted((s for s in states if s.get("status") not in (None, "ok")),
                    key=lambda s: s.get("at", 0))
    if failed and not outcome.timed_out:
        first = failed[0]
        later = [str(s["rank"]) for s in failed[1:]]
        error = (f"rank {first['rank']} ({first.get('host')}) failed first: {first.get('error')}"
                 + (f"; rank(s) {', '.join(later)} failed after it" if later else "")
                 + "; torchrun stopped the other ranks")
        measured = dict((outcome.result or {}).get("measured") or {})
        measured["phase"] = first.get("phase", measured.get("phase", "starting"))
        if first.get("oom_memory_gb") is not None:
            measured["oom_memory_gb"] = first["oom_memory_gb"]
        outcome.result = {"event": "result", "status": first["status"], "error": error,
                          "measured": measured}
        # The failing rank's traceback, not torchrun's summary of the failure, ends the error.
        outcome.stderr_tail = (first.get("traceback") or "").strip()
        return
    if outcome.result is not None and outcome.result.get("status") == "ok":
        return
    phases = ", ".join(f"rank {s['rank']} in {_phase(s)}" for s in states)
    if outcome.timed_out:
        outcome.detail = f"ranks at the timeout: {phases}" if phases else None
        return
    match = _ROOT_CAUSE.search(outcome.stderr_tail or "")
    if match:
        rank = int(match.group(1))
        where = next((_phase(s) for s in states if s.get("rank") == rank), "an unknown phase")
        outcome.detail = (f"rank {rank} exited with code {match.group(2)} in {where} (torchrun's "
                          "root cause); torchrun stopped the other ranks")
    elif phases:
        outcome.detail = f"ranks: {phases}"


def _phase(state: dict) -> str:
    args = state.get("args") or []
    return f"{state.get('phase')}" + (f" {'/'.join(map(str, args))}" if args else "")



def tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    try:
        data = path.read_bytes()[-chars:]
    except OSError:
        return ""
    return data.decode("utf-8", "replace").strip()


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
