"""Setups on a Slurm cluster (slurm/cluster.py): Slurm places each setup's process; stepbench
measures, as everywhere else.

One setup (one repeat) is one Slurm job, submitted through submitit (the `slurm` extra), which
writes the job's script, submits it with sbatch and runs a Python function in it:
  - the function is execute/slurm/task.py's `run`: hostside runs the setup's process (or a
    torchrun job of `--nproc` processes) in its own process group, as on an SSH host or in a Ray
    job, its lines written to the task's log file in the run's folder;
  - `--gpu-type NAME` asks for `--gres=gpu:NAME:N` (N: the setup's --nproc), without it
    `gpu:N`; a CPU setup takes a whole node (`--exclusive`), as a local run has the machine;
  - `--nnodes M`: M nodes, one task per node, each running torchrun for its node rank;
  - the job's time limit is --timeout plus START_S (the job's Python, its process server's
    imports, the kill's grace); the run's own clock stops the setup at --timeout, counted from
    the placed line, not while the job waits in the queue;
  - the log files are read as they grow (the protocol's lines: live progress, the result);
    what is not a protocol line, and the task's stderr file, are the stderr tail.
The run's folder is beside the results file, so it must be on a filesystem the nodes share; so
must this Python and stepbench (the job runs them). Both are checked before anything is
submitted (`check_shared`).

Three things go to Slurm's commands directly rather than through submitit: a job's state comes
from squeue (submitit asks sacct, which fails where the cluster keeps no accounting database:
its state then reads UNKNOWN forever); scancel runs with its output captured (submitit's cancel
lets scancel's complaints about a job that just ended reach the live progress); and the
partitions, nodes and GPUs come from sinfo (submitit has no such query).

Every way out (timeout, Ctrl-C, SIGTERM, SIGHUP, an error) cancels the job (scancel), and the run
ends by cancelling whatever of its jobs is still queued (by the run's job name) and removing its
folder. The runner, the protocol and the records are the local run's (execute/runner.py);
records carry the Slurm job and node in their placement.
"""

from __future__ import annotations

import codecs
import hashlib
import math
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from stepbench import protocol
from stepbench.errors import first_line
from stepbench.execute.clusters import ClusterExecutor, Refused, Submitted, device_indices
from stepbench.execute.hosts.hostside import Exit, Lines
from stepbench.execute.local import FRESH, SERVER, uses_server
from stepbench.execute.protocol import (KILL_GRACE_S, STDERR_TAIL_CHARS, Job, OnMessage,
                                        Outcome, Rendezvous, rank_verdict, worker_command)
from stepbench.execute.slurm.cluster import Cluster, SlurmError, require_slurm, slurm
from stepbench.setup import Setup

START_S = 180           # a job's time limit beyond --timeout (see the module's docstring)
POLL_S = 0.5            # how often a job's log files are read
LOOK_S = 3.0            # how often squeue is asked for the run's jobs' states
STOP_WAIT_S = 2 * KILL_GRACE_S + 20     # after scancel: until the job ends
SETTLE_S = 1.0          # after a job left the queue, for its last lines to reach the log file
NODE_TMP = "/tmp"       # on the nodes: a torchrun job's rank states
FOLDER = ".stepbench-slurm"     # beside the results file: each run's job files, removed after it
# Where squeue says a job is, while it may still write (else it ended, or left Slurm's memory).
ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
         "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}


def gres(gpu_type: str | None, count: int) -> str:
    """The --gres a job of `count` GPUs (of `gpu_type`, else any) asks for: per node, the form
    GPU partitions' submit rules read as a GPU job (`--gpus=N`, per job, some refuse as a CPU
    job)."""
    return f"gpu:{gpu_type}:{count}" if gpu_type else f"gpu:{count}"


class SlurmExecutor(ClusterExecutor):
    """Each job a Slurm job in `cluster`'s partition; see the module's docstring."""

    engine = "slurm"            # records are tagged through their placement (placement["slurm"])

    def __init__(self, cluster: Cluster, device: str, *, gpus: int = 1,
                 gpu_type: str | None = None, out: Path, compile_cache: Path | None = None,
                 run_id: str = "", start: str = SERVER, note=lambda text: None):
        super().__init__(cluster, device, gpus, gpu_type, compile_cache, run_id, start, note)
        self.python = sys.executable        # the job runs this very Python (a shared filesystem)
        self.name = f"stepbench-{run_id or os.getpid()}"       # every job of the run: scancel's
        self.folder = Path(out).expanduser().absolute().parent / FOLDER / self.name
        self.cwd = os.getcwd()
        self._stop = threading.Event()
        self._states: dict[str, str] | None = None     # the run's jobs, as squeue last saw them
        self._looked_at = float("-inf")

    # -- one job (clusters.ClusterExecutor.run) ------------------------------------------------

    def stopping(self) -> bool:
        return self._stop.is_set() or self.lost is not None

    def submit_job(self, job: Job, count: int, timeout_s: float) -> Submitted:
        start = time.monotonic()
        try:
            submitted = self._submit(job.setup, timeout_s, self._spec(job, count))
        except Exception as exc:  # noqa: BLE001 - sbatch refused, or the cluster is gone: said once
            raise Refused(f"Slurm refused the job of {job.setup.name} ({_reason(exc)})") from None
        return Submitted(submitted.job_id, start, submitted)

    def follow_job(self, submitted: Submitted, job: Job, timeout_s: float, outcome: Outcome,
                   on_message: OnMessage) -> tuple[list["_Task"], str | None]:
        """Its tasks' log files as they grew, and the state squeue gave a job that ended
        without its tasks' exit lines (else None)."""
        tasks = [_Task(submitted.handle.paths.folder, submitted.job_id, t, outcome, on_message)
                 for t in range(job.setup.nnodes)]
        return tasks, self._follow(submitted.job_id, tasks, timeout_s, outcome, time.monotonic())

    def job_placed(self, followed) -> bool:
        return all(t.lines.placed for t in followed[0])

    def why_not_started(self, submitted: Submitted, followed) -> str:
        tasks, state = followed
        lead = tasks[0]
        said = [line for line in lead.said().splitlines() if line.strip()]
        # srun's own summary (a task exited with code N) says less than the line before it.
        why = [line for line in said if not line.startswith("srun: ")] or said
        hint = ("" if lead.out.exists() else f"; it wrote nothing to {self.folder}: is that "
                "folder on a filesystem the nodes share?")
        return (f"Slurm job {submitted.job_id} {_ended(state)} before its process started"
                + (f": {first_line(why[-1])}" if why else "") + hint)

    def finish_job(self, submitted: Submitted, followed, job: Job, outcome: Outcome) -> None:
        tasks, state = followed
        lead = tasks[0]
        self._tell(outcome, job.setup, submitted.job_id, tasks)
        if (outcome.returncode is None and state is not None
                and not (outcome.timed_out or outcome.stopped)):
            outcome.detail = (f"Slurm job {submitted.job_id} {_ended(state)} without its exit "
                              "line (a node failure, the time limit, or a scancel from elsewhere)")
        # As the node's clock measured them (the log files are read every POLL_S), else this one's.
        end = lead.lines.exit or Exit()
        if end.exit_s is not None:
            outcome.exit_s = end.exit_s
        elif outcome.result_at is not None:
            outcome.exit_s = (end.at or time.monotonic()) - outcome.result_at
        placed_at = lead.lines.placed_at
        outcome.wall_s = end.wall_s if end.wall_s is not None else \
            time.monotonic() - (placed_at if placed_at is not None else submitted.start)

    def _spec(self, job: Job, count: int) -> dict:
        """What the job's tasks run (slurm/task.py run's spec)."""
        from stepbench.execute.local.server import imports_for
        from stepbench.execute.slurm.task import ENDPOINT

        setup = job.setup
        env, dirs = {"PYTHONUNBUFFERED": "1"}, []
        if setup.mode == "compile":
            if self.compile_cache is not None:
                cache, kind = str(self.compile_cache), "shared"
            else:   # the setup's own, in the run's folder: cold first, warm on its later repeats
                name = hashlib.sha1(setup.key().encode()).hexdigest()[:12]
                cache, kind = str(self.folder / "inductor" / name), "private"
            env.update({"TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": f"{cache}/triton",
                        protocol.CACHE_KIND_ENV: kind})
            dirs.append(cache)
        # In this very folder (the nodes share it): a factory's relative path resolves there.
        host = {"env": env, "dirs": dirs, "watch_stdin": False, "cwd": self.cwd}
        spec = {"host": host, "folder": str(self.folder)}
        ranks = f"{NODE_TMP}/{self.name}-{count}-ranks"
        if setup.nnodes > 1:
            spec["node_argvs"] = [self.command(job, Rendezvous(setup.nnodes, node, ENDPOINT))
                                  for node in range(setup.nnodes)]
            host["rank_dir"] = ranks
        elif setup.distributed:
            host.update(argv=self.command(job, Rendezvous()), rank_dir=ranks)
        else:
            host["argv"] = self.command(job)
            if uses_server(self.start):
                host.update(preload=imports_for([setup]), payload=job.payload())
        return spec

    def command(self, job: Job, rendezvous: Rendezvous | None = None) -> list[str]:
        """A setup's process on its node, or a torchrun job's command on one node (as
        LocalProcess.command runs them here)."""
        return worker_command(self.python, job, rendezvous)

    def parameters(self, setup: Setup, timeout_s: float) -> dict:
        """The job's sbatch options, as submitit's SlurmExecutor takes them."""
        params = {
            "job_name": self.name, "partition": self.cluster.partition,
            "time": max(1, math.ceil((timeout_s + START_S) / 60)),
            "nodes": setup.nnodes, "ntasks_per_node": 1,
            "setup": [this_stepbench()],
            # A setup's process is measured once: never requeued (after a node failure).
            "additional_parameters": {"no_requeue": True},
        }
        if setup.device == "cuda":
            params["gres"] = gres(self.gpu_type, setup.nproc)
        else:
            params["exclusive"] = True
        return params

    def _submit(self, setup: Setup, timeout_s: float, spec: dict):
        submitit = require_slurm()
        from stepbench.execute.slurm.task import run

        self.folder.mkdir(parents=True, exist_ok=True)
        executor = submitit.SlurmExecutor(folder=self.folder / "%j", python=_quote(self.python))
        executor.update_parameters(**self.parameters(setup, timeout_s))
        return executor.submit(run, spec)

    def _follow(self, job_id: str, tasks: list["_Task"], timeout_s: float,
                outcome: Outcome, submitted_at: float) -> str | None:
        """Read the job's log files until every task said how its command ended, or the job
        ended without that; cancel it at the timeout (counted from the moment every task runs)
        or on stop(). The state squeue gave a job that ended without its tasks' exit lines
        ("": it left the controller's memory), else None."""
        look_at = time.monotonic() + LOOK_S
        state = None
        while True:
            for task in tasks:
                task.read()
            if all(t.lines.exit for t in tasks):
                return None
            now = time.monotonic()
            if all(t.lines.placed for t in tasks):
                started = max(t.lines.placed_at for t in tasks)
                if now >= started + timeout_s:
                    outcome.timed_out = True
                    break
            if self._stop.wait(POLL_S):
                outcome.stopped = True
                break
            if now >= look_at:
                look_at = now + LOOK_S
                state = self._state(job_id, submitted_at)
                if state is not None and state not in ALIVE:
                    time.sleep(SETTLE_S)       # its last lines, through a shared filesystem
                    for task in tasks:
                        task.read()
                    return state
        cancel(job_id)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            for task in tasks:
                task.read()
            if all(t.lines.exit for t in tasks):
                break
            state = self._state(job_id, submitted_at)
            if state is not None and state not in ALIVE:
                break
            time.sleep(POLL_S)
        for task in tasks:
            task.read()
        return None

    def _state(self, job_id: str, submitted_at: float) -> str | None:
        """The job's state as squeue gives it (the controller keeps an ended job a while:
        MinJobAge); "" once the controller no longer knows it; None where squeue cannot tell
        (then it is asked again later). One squeue every LOOK_S for all of the run's jobs, however
        many run at once (and one more where the last is older than the job)."""
        with self._lock:
            if (time.monotonic() - self._looked_at >= LOOK_S
                    or self._looked_at < submitted_at):
                self._looked_at = time.monotonic()
                try:
                    listed = slurm("squeue", "-h", "--me", "-t", "all", "--name", self.name,
                                   "-o", "%i %T")
                    self._states = dict(line.split()[:2] for line in listed.splitlines()
                                        if len(line.split()) >= 2)
                except SlurmError:
                    self._states = None
            return None if self._states is None else self._states.get(job_id, "")

    def _tell(self, outcome: Outcome, setup: Setup, job_id: str, tasks: list["_Task"]) -> None:
        """Where the job ran, and how it ended (over several nodes: the first node that
        failed)."""
        lead = tasks[0]
        placed = lead.lines.placed or {}
        devices = placed.get("cuda_visible_devices") if setup.device == "cuda" else None
        where = {"job_id": job_id, "node": placed.get("node") or placed.get("hostname"),
                 "partition": self.cluster.partition, "gpu_type": self.gpu_type}
        if len(tasks) > 1:
            where["nodes"] = [(t.lines.placed or {}).get("node") for t in tasks]
        outcome.placement = {"slurm": where, "gpus": device_indices(devices),
                             "cuda_visible_devices": devices, "compile_threads": None,
                             "start": FRESH, "concurrent": 1}
        ends = [t.lines.exit for t in tasks if t.lines.exit]
        failed = next((e for e in ends if e.returncode not in (0, None)), None)
        (failed or lead.lines.exit or Exit()).tell(outcome)
        outcome.stderr_tail = lead.said()
        if setup.distributed:
            rank_verdict(outcome, sorted((s for t in tasks for s in t.lines.ranks),
                                         key=lambda s: s.get("rank", 0)))

    def _lose(self, reason: str) -> None:
        """The cluster cannot run this run's jobs: no job starts after this one."""
        with self._lock:
            self.lost = self.lost or reason
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """Wait until the run's jobs have left the queue (a job whose setup ended still ends its
        process server, and Slurm its job), cancel what is left after STOP_WAIT_S (a job whose
        submission a stop interrupted, say), and remove the run's folder."""
        try:
            if self._left(STOP_WAIT_S):
                slurm("scancel", "--me", "--name", self.name)
                if self._left(STOP_WAIT_S):
                    self.note(f"the run's Slurm jobs are still in the queue after scancel; see "
                              f"`squeue --me --name {self.name}`")
        except SlurmError as exc:
            self.note(f"could not make sure the run's Slurm jobs ended ({exc}); see "
                      f"`squeue --me --name {self.name}`")
        remove_folder(self.folder)

    def _left(self, wait_s: float) -> list[str]:
        """The run's jobs still in the queue after waiting up to `wait_s` for them to leave."""
        deadline = time.monotonic() + wait_s
        while True:
            left = slurm("squeue", "-h", "--me", "--name", self.name, "-o", "%i").split()
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(POLL_S)


class _Task:
    """One task of a job: its log files in the job's folder, read as they grow."""

    def __init__(self, folder: Path, job_id: str, task: int, outcome: Outcome,
                 on_message: OnMessage):
        self.out = Path(folder) / f"{job_id}_{task}_log.out"
        self.err = Path(folder) / f"{job_id}_{task}_log.err"
        # Only the first node's process reports (the lead rank); the others' lines are theirs.
        self.lines = Lines(outcome, on_message) if task == 0 else \
            Lines(Outcome(), lambda message: None)
        self.offset = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def read(self) -> None:
        """What the log file gained since the last read (opened anew each time: a shared
        filesystem shows another machine's writes at open)."""
        try:
            with open(self.out, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        if data:
            self.lines.feed(self.decoder.decode(data))

    def said(self) -> str:
        """The end of what the task wrote that is not hostside's or the protocol's: its stderr
        file, then its log's other lines, without submitit's own log lines."""
        try:
            with open(self.err, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 8 * STDERR_TAIL_CHARS))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        lines = text.splitlines() + list(self.lines.other)
        kept = [line for line in lines if not line.startswith("submitit ")]
        return "\n".join(kept)[-STDERR_TAIL_CHARS:].strip()


def _ended(state: str | None) -> str:
    """'ended FAILED'; 'ended' where the controller had forgotten the job."""
    return f"ended {state}" if state else "ended"


def cancel(job_id: str) -> None:
    """scancel the job; a job that ended meanwhile is no error."""
    try:
        slurm("scancel", job_id)
    except SlurmError:
        pass


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _reason(exc: BaseException) -> str:
    return first_line(str(exc), last=True) or type(exc).__name__


def executor_for(cluster: Cluster, settings, plan: list[Setup], gpus: int, run_id: str,
                 note) -> SlurmExecutor:
    return SlurmExecutor(cluster, settings.device, gpus=gpus, gpu_type=settings.gpu_type,
                         out=settings.out, compile_cache=settings.compile_cache, run_id=run_id,
                         start=settings.start, note=note)


def this_stepbench() -> str:
    """A job's setup line: the job imports this very stepbench, also when it runs from a
    checkout."""
    src = str(Path(__file__).resolve().parents[3])
    return f"export PYTHONPATH={_quote(src)}${{PYTHONPATH:+:$PYTHONPATH}}"


def remove_folder(folder: Path) -> None:
    """A run's job folder, and the folder of such folders once it is empty (the last run's)."""
    shutil.rmtree(folder, ignore_errors=True)
    try:
        folder.parent.rmdir()
    except OSError:
        pass
