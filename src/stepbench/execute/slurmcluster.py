"""Setups on a Slurm cluster the user already has (`run --slurm [PARTITION]`, `tune --slurm`):
Slurm places each setup's process; stepbench measures, as everywhere else.

One setup (one repeat) is one Slurm job, submitted through submitit (the `slurm` extra), which
writes the job's script, submits it with sbatch and runs a Python function in it:
  - the function is execute/slurmtask.py's `run`: hostside runs the setup's process (or a
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
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from stepbench import protocol
from stepbench.errors import UserError, first_line
from stepbench.execute.clusters import device_indices, find_done
from stepbench.execute.executor import (KILL_GRACE_S, STDERR_TAIL_CHARS, Job, OnMessage, Outcome,
                                        Rendezvous, now_iso, rank_verdict, torchrun_command)
from stepbench.execute.hostside import Exit, Lines
from stepbench.setup import Setup

INSTALL_HINT = "pip install 'stepbench[slurm]'"
COMMANDS = ("sbatch", "squeue", "scancel", "sinfo", "srun")
START_S = 180           # a job's time limit beyond --timeout (see the module's docstring)
POLL_S = 0.5            # how often a job's log files are read
LOOK_S = 3.0            # how often squeue is asked for the run's jobs' states
COMMAND_TIMEOUT_S = 60  # one Slurm command
STOP_WAIT_S = 2 * KILL_GRACE_S + 20     # after scancel: until the job ends
SETTLE_S = 1.0          # after a job left the queue, for its last lines to reach the log file
NODE_TMP = "/tmp"       # on the nodes: a torchrun job's rank states
FOLDER = ".stepbench-slurm"     # beside the results file: each run's job files, removed after it
# Where squeue says a job is, while it may still write (else it ended, or left Slurm's memory).
ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
         "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
# Filesystems that the nodes of a cluster mount from elsewhere (a path on another is taken for
# this machine's own disk, unless this machine exports it over NFS).
SHARED_FS = {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "fuse.ceph-fuse",
             "glusterfs", "fuse.glusterfs", "cifs", "smb3", "smbfs", "panfs", "wekafs",
             "fuse.weka", "orangefs", "pvfs2", "afs", "fuse.juicefs", "gfs2", "ocfs2", "vast"}
EXPORTS = Path("/var/lib/nfs/etab")     # the folders this machine's NFS server exports now
# A node's GPUs in sinfo's GRES column: gpu:TYPE:N or gpu:N, then (S:...) or more items.
_GPU = re.compile(r"(?:^|,)gpu(?::([^:,(]+))?:(\d+)")


def require_slurm():
    """submitit, and Slurm's commands on PATH."""
    try:
        import submitit
    except ImportError:
        raise UserError(f"--slurm needs submitit: {INSTALL_HINT}") from None
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        raise UserError(f"--slurm needs Slurm's commands on PATH, and {', '.join(missing)} "
                        "cannot be found; run stepbench on a login node of the cluster")
    return submitit


class SlurmError(Exception):
    """A Slurm command failed; the message is its one line."""


def slurm(*argv: str) -> str:
    """A Slurm command's stdout; SlurmError with its last line of stderr when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {COMMAND_TIMEOUT_S} s") from None
    except OSError as exc:
        raise SlurmError(f"{argv[0]}: {exc.strerror}") from None
    if done.returncode != 0:
        raise SlurmError(first_line(done.stderr, last=True) or f"{argv[0]} exited with code "
                                                               f"{done.returncode}")
    return done.stdout


@dataclass(frozen=True)
class Node:
    """A node of the partition, as sinfo shows it."""

    name: str
    hostname: str
    address: str
    gpus: dict                  # GPU type ("" where none is declared) -> count
    cpus: int

    @property
    def here(self) -> bool:
        """Whether it is this machine (then every path here is the node's too)."""
        return self.hostname in _my_names() or self.address in _my_names()


def _my_names() -> set[str]:
    import psutil

    name = socket.gethostname()
    names = {name, name.split(".")[0], socket.getfqdn(), "localhost"}
    for addresses in psutil.net_if_addrs().values():
        names.update(a.address.split("%")[0] for a in addresses)
    return names


def gpus_of(gres: str) -> dict:
    """{"h100": 2} from "gpu:h100:2(S:0-1)", {"": 4} from "gpu:4", {} from "(null)"."""
    found: dict = {}
    for kind, count in _GPU.findall(gres or ""):
        found[kind] = found.get(kind, 0) + int(count)
    return found


class Cluster:
    """One partition of a Slurm cluster, as sinfo shows it (a clusters.View)."""

    flag = "--slurm"
    type_names = "the gres types of its nodes, e.g. h100, a100"
    no_types = "none (its nodes declare no gpu gres type)"

    def __init__(self, partition: str | None):
        require_slurm()
        listed = [line.strip() for line in _sinfo("-o", "%P").splitlines() if line.strip()]
        names = [p.rstrip("*") for p in listed]
        default = next((p.rstrip("*") for p in listed if p.endswith("*")), None)
        if not partition:
            if default is None:
                raise UserError("--slurm: the cluster has no default partition; pass one: "
                                + ", ".join(names))
            partition = default
        elif partition not in names:
            raise UserError(f"--slurm {partition}: the cluster has no such partition; its "
                            f"partitions: {', '.join(names) or 'none'}; pass one of them (or "
                            "none, for the default one)")
        self.partition = partition
        self.what = f"the Slurm partition {partition}"
        lines = _sinfo("-N", "-p", partition, "-o", "%N|%n|%o|%G|%c").splitlines()
        nodes: dict[str, Node] = {}
        for line in lines:
            parts = line.strip().split("|")
            if len(parts) == 5 and parts[0] not in nodes:
                name, host, address, gres, cpus = parts
                nodes[name] = Node(name, host, address, gpus_of(gres),
                                   int(cpus) if cpus.isdigit() else 0)
        self.nodes = list(nodes.values())

    def gpu_types(self) -> set[str]:
        return {kind for n in self.nodes for kind in n.gpus if kind}

    def gpus(self, gpu_type: str | None = None) -> list[int]:
        """Each node's GPUs (of `gpu_type` when given: the nodes that have that type)."""
        if gpu_type is None:
            return [sum(n.gpus.values()) for n in self.nodes]
        return [n.gpus[gpu_type] for n in self.nodes if n.gpus.get(gpu_type)]

    def cpu_nodes(self) -> int:
        return sum(1 for n in self.nodes if n.cpus >= 1)

    def close(self) -> None:
        pass


def _sinfo(*args: str) -> str:
    try:
        return slurm("sinfo", "-h", *args)
    except SlurmError as exc:
        raise UserError(f"--slurm: the cluster did not answer ({exc}); run stepbench where "
                        "sinfo works, on a login node of the cluster") from None


# -- what `run --slurm` and `tune --slurm` ask (cli/run.py run_cluster) -----------------------

def require() -> None:
    require_slurm()


def precheck(settings) -> None:
    """Nothing to check before the cluster answers."""


def open_cluster(settings, note) -> Cluster:
    """The partition --slurm names ("": the cluster's default), once the paths its jobs use are
    known to be on a filesystem its nodes share."""
    cluster = Cluster(settings.slurm)
    model = settings.values["model"]
    check_shared(cluster, settings.out, settings.compile_cache,
                 model if isinstance(model, (tuple, list)) else [model])
    return cluster


def executor_for(cluster: Cluster, settings, plan: list[Setup], gpus: int, run_id: str,
                 note) -> "SlurmExecutor":
    return SlurmExecutor(cluster, settings.device, gpus=gpus, gpu_type=settings.gpu_type,
                         out=settings.out, compile_cache=settings.compile_cache, run_id=run_id,
                         start=settings.start, note=note)


# ---------------------------------------------------------------- a filesystem the nodes share

def check_shared(cluster: Cluster, out: Path, compile_cache: Path | None = None,
                 models=()) -> None:
    """A UserError, one line, where a path the jobs use is on this machine's own disk and the
    partition has nodes that are other machines: the results folder (the run's job files go
    beside the results file), this Python's environment and stepbench (the jobs run them), a
    model's config file, the compile cache."""
    far = [n.name for n in cluster.nodes if not n.here]
    if not far:
        return
    import stepbench

    package = Path(stepbench.__file__).resolve().parent
    paths = [(Path(out).expanduser().absolute().parent, "the results folder",
              "pass --out a file on a filesystem they share (your home or the cluster's scratch, "
              "usually)"),
             (Path(sys.prefix), "this Python's environment",
              "run stepbench from an environment on a filesystem they share (a venv or conda "
              "environment in your home, usually)"),
             (package, "stepbench", "install it on a filesystem they share")]
    from stepbench.measure.models import PRESETS

    for model in models:
        if model and model not in PRESETS:     # a config file (or its folder) here
            paths.append((Path(model).expanduser().absolute(), "the model config",
                          "put it on a filesystem they share"))
    if compile_cache is not None:
        paths.append((Path(compile_cache).expanduser().absolute(), "the compile cache",
                      "pass --compile-cache a folder on a filesystem they share"))
    exported = _exported()
    nodes = ", ".join(far[:3]) + (f" and {len(far) - 3} more" if len(far) > 3 else "")
    for path, what, fix in paths:
        real = _existing(path).resolve()
        mountpoint, fstype = _mount_of(real)
        if fstype in SHARED_FS or any(real == e or e in real.parents for e in exported):
            continue
        raise UserError(f"--slurm: {what} {path} is on this machine's own disk ({fstype} at "
                        f"{mountpoint}), and {cluster.what} runs its jobs on other machines "
                        f"({nodes}), which cannot read it; {fix}")


def _existing(path: Path) -> Path:
    return next(p for p in (path, *path.parents) if p.exists())


def _mount_of(path: Path) -> tuple[str, str]:
    """The mount point holding `path` and its filesystem's type."""
    import psutil

    best, fstype = "/", "unknown"
    for part in psutil.disk_partitions(all=True):
        point = Path(part.mountpoint)
        if (point == path or point in path.parents) and len(part.mountpoint) >= len(best):
            best, fstype = part.mountpoint, part.fstype
    return best, fstype


def _exported() -> list[Path]:
    """The folders this machine exports over NFS (a head node that serves /home to the others)."""
    try:
        lines = EXPORTS.read_text().splitlines()
    except OSError:
        return []
    return [Path(line.split()[0]) for line in lines if line.strip().startswith("/")]


# ---------------------------------------------------------------- the executor

class SlurmExecutor:
    """Each job a Slurm job in `cluster`'s partition; see the module's docstring."""

    host = None                 # records are tagged through their placement (placement["slurm"])

    def __init__(self, cluster: Cluster, device: str, *, gpus: int = 1,
                 gpu_type: str | None = None, out: Path, compile_cache: Path | None = None,
                 run_id: str = "", start: str = "server", note=lambda text: None):
        self.cluster, self.device, self.gpu_type = cluster, device, gpu_type
        self.run_id = run_id or None
        self.slots = [str(i) for i in range(gpus)]
        self.compile_cache = compile_cache
        self.python = sys.executable        # the job runs this very Python (a shared filesystem)
        self.name = f"stepbench-{run_id or os.getpid()}"       # every job of the run: scancel's
        self.folder = Path(out).expanduser().absolute().parent / FOLDER / self.name
        self.start = start
        self.note = note
        self.lost: str | None = None    # why the cluster could not run a job: the run's one line
        self._lock = threading.Lock()
        self._count = 0
        self._stop = threading.Event()
        self._states: dict[str, str] | None = None     # the run's jobs, as squeue last saw them
        self._looked_at = float("-inf")

    # -- what the runner asks ------------------------------------------------------------------

    def slots_needed(self, setup: Setup) -> int:
        return setup.world_size if setup.device == "cuda" else 1

    def gpu_name(self, setup: Setup, slot: str) -> str | None:
        return "cpu" if setup.device == "cpu" else self.gpu_type

    def find_done(self, job: Job, stored: list) -> object | None:
        """The stored record of `job` from a Slurm run (clusters.find_done)."""
        return find_done(job, stored, "slurm", self.gpu_type)

    # -- one job -------------------------------------------------------------------------------

    def run(self, job: Job, slot: str, timeout_s: float, on_message: OnMessage) -> Outcome:
        outcome = Outcome(started_at=now_iso())
        with self._lock:
            self._count += 1
            count = self._count
            stopping = self._stop.is_set() or self.lost is not None
        if stopping:
            outcome.stopped, outcome.finished_at = True, outcome.started_at
            return outcome
        setup = job.setup
        start = time.monotonic()
        try:
            submitted = self._submit(setup, timeout_s, self._spec(job, count))
        except Exception as exc:  # noqa: BLE001 - sbatch refused, or the cluster is gone: said once
            self._lose(f"Slurm refused the job of {setup.name} ({_reason(exc)})")
            outcome.stopped, outcome.finished_at = True, now_iso()
            return outcome
        tasks = [_Task(submitted.paths.folder, submitted.job_id, t, outcome, on_message)
                 for t in range(setup.nnodes)]
        state = self._follow(submitted.job_id, tasks, timeout_s, outcome, time.monotonic())
        lead = tasks[0]
        if not (all(t.lines.placed for t in tasks) or outcome.timed_out or outcome.stopped):
            # The job ended before the setup's process started (its Python could not start, its
            # folder was not there): nothing was measured, so nothing is recorded.
            said = [line for line in lead.said().splitlines() if line.strip()]
            # srun's own summary (a task exited with code N) says less than the line before it.
            why = [line for line in said if not line.startswith("srun: ")] or said
            hint = ("" if lead.out.exists() else f"; it wrote nothing to {self.folder}: is that "
                    "folder on a filesystem the nodes share?")
            self._lose(f"Slurm job {submitted.job_id} {_ended(state)} before its process started"
                       + (f": {first_line(why[-1])}" if why else "") + hint)
            outcome.stopped = True
        self._tell(outcome, setup, submitted.job_id, tasks)
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
            time.monotonic() - (placed_at if placed_at is not None else start)
        outcome.finished_at = now_iso()
        return outcome

    def _spec(self, job: Job, count: int) -> dict:
        """What the job's tasks run (slurmtask.run's spec)."""
        from stepbench.execute.server import imports_for
        from stepbench.execute.slurmtask import ENDPOINT

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
        host = {"env": env, "dirs": dirs, "watch_stdin": False}
        spec = {"host": host, "folder": str(self.folder)}
        ranks = f"{NODE_TMP}/{self.name}-{count}-ranks"
        if setup.nnodes > 1:
            spec["node_argvs"] = [self.node_argv(job, Rendezvous(setup.nnodes, node, ENDPOINT))
                                  for node in range(setup.nnodes)]
            host["rank_dir"] = ranks
        elif setup.distributed:
            host.update(argv=self.node_argv(job, Rendezvous()), rank_dir=ranks)
        else:
            host["argv"] = self.worker_argv(job)
            if self.start == "server":
                host.update(preload=imports_for([setup]), payload=job.payload())
        return spec

    def worker_argv(self, job: Job) -> list[str]:
        """A setup's process on its node (as LocalProcess.command runs it here)."""
        return [self.python, "-m", "stepbench.measure.worker", job.payload()]

    def node_argv(self, job: Job, rendezvous: Rendezvous) -> list[str]:
        """A torchrun job's command on one node."""
        return torchrun_command(self.python, job, rendezvous)

    def parameters(self, setup: Setup, timeout_s: float) -> dict:
        """The job's sbatch options, as submitit's SlurmExecutor takes them."""
        src = str(Path(__file__).resolve().parents[2])
        params = {
            "job_name": self.name, "partition": self.cluster.partition,
            "time": max(1, math.ceil((timeout_s + START_S) / 60)),
            "nodes": setup.nnodes, "ntasks_per_node": 1,
            # The job imports this very stepbench, also when it runs from a checkout.
            "setup": [f"export PYTHONPATH={_quote(src)}${{PYTHONPATH:+:$PYTHONPATH}}"],
            # A setup's process is measured once: never requeued (after a node failure).
            "additional_parameters": {"no_requeue": True},
        }
        if setup.device == "cuda":
            kind = f"{self.gpu_type}:" if self.gpu_type else ""
            params["gres"] = f"gpu:{kind}{setup.nproc}"
        else:
            params["exclusive"] = True
        return params

    def _submit(self, setup: Setup, timeout_s: float, spec: dict):
        submitit = require_slurm()
        from stepbench.execute.slurmtask import run

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
                             "start": "fresh", "concurrent": 1}
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
        shutil.rmtree(self.folder, ignore_errors=True)
        try:
            self.folder.parent.rmdir()         # the last run's: the folder goes too
        except OSError:
            pass

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
