"""What the cluster engines share (ray/ for `--ray`, slurm/ for `--slurm`): the backend and its
site (registry.py), the device a run takes there, how many of the cluster's GPUs it may use at
once, which stored record a job resumes from, and one job's run loop (`ClusterExecutor`). The
cluster places each job (its node and GPUs); stepbench measures, as everywhere else.

A cluster is seen through a few answers (`View`): its nodes' GPUs (of a type), its GPU types and
how many nodes have a CPU; and how its errors name it.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from stepbench.errors import UserError
from stepbench.execute.protocol import Executor, Job, OnMessage, Outcome, now_iso
from stepbench.execute.registry import Backend, Note, Site
from stepbench.setup import Setup


class View(Protocol):
    what: str           # how an error names it: "the Ray cluster", "the Slurm partition gpu"
    flag: str           # the flag that chose it: "--ray", "--slurm"
    type_names: str     # what a GPU type is called there, for --gpu-type's error
    no_types: str       # what its GPU types read as where it declares none

    def gpu_types(self) -> set[str]:
        """The GPU types its nodes declare."""

    def gpus(self, gpu_type: str | None = None) -> list[int]:
        """Each node's GPUs (of `gpu_type` when given)."""

    def cpu_nodes(self) -> int:
        """How many nodes have a CPU a setup can take."""


def cluster_device(cluster: View, device: str, gpu_type: str | None) -> str:
    """--device auto on a cluster: cuda where it has GPUs (of --gpu-type), else cpu."""
    if device != "auto":
        return device
    return "cuda" if gpu_type is not None or sum(cluster.gpus()) > 0 else "cpu"


def check_cluster(cluster: View, device: str, gpu_type: str | None, gpus: str | None,
                  plan: list[Setup]) -> int:
    """How many GPUs this run may use at once (1 on the CPU: one setup at a time); a UserError
    for a GPU type, a count or a job the cluster cannot place."""
    if gpu_type is not None:
        types = cluster.gpu_types()
        if gpu_type not in types:
            have = ", ".join(sorted(types)) or cluster.no_types
            raise UserError(f"--gpu-type {gpu_type}: {cluster.what} has no such GPU; its GPU "
                            f"types: {have}; pass one of them ({cluster.type_names}) or drop "
                            "--gpu-type")
    if device != "cuda":
        if gpus is not None:
            raise UserError("--gpus needs CUDA setups, and this run is on the CPU; drop --gpus "
                            "(or pass --device cuda)")
        nodes = cluster.cpu_nodes()
        for setup in plan:
            if setup.nnodes > nodes:
                raise UserError(f"--nnodes {setup.nnodes} needs a node each, and {cluster.what} "
                                f"has {nodes} with a CPU; lower --nnodes")
        return 1
    per_node = cluster.gpus(gpu_type)
    total = sum(per_node)
    kind = f" {gpu_type}" if gpu_type else ""
    if total == 0:
        raise UserError(f"{cluster.what} has no{kind} GPU; pass --device cpu, or add GPU nodes")
    if gpus is None:
        limit = total
    elif gpus.isdigit() and 1 <= int(gpus) <= total:
        limit = int(gpus)
    else:
        raise UserError(f"--gpus with {cluster.flag} takes how many of the cluster's {total}{kind} "
                        f"GPUs this run uses at once: a number from 1 to {total}, got {gpus!r}")
    for setup in plan:
        fits = [g for g in per_node if g >= setup.nproc]
        if len(fits) < setup.nnodes or setup.world_size > limit:
            raise UserError(f"{setup.name} needs {setup.nnodes} node(s) with {setup.nproc}"
                            f"{kind} GPU(s) each, and the run may use {limit} of the cluster's "
                            f"nodes' {per_node}; lower --nproc/--nnodes or raise --gpus")
    return limit


def find_done(job, stored: list, engine: str, gpu_type: str | None):
    """The stored record of `job` from a run on a cluster of `engine` (the record's placement
    key: "ray", "slurm"): the same setup and repeat, on the GPU type asked for (any GPU when none
    was asked); the latest, or None."""
    key = job.setup.key()
    for record in reversed(stored):
        placed = (record.placement or {}).get(engine)
        if (placed is not None and record.setup.key() == key and record.repeat == job.repeat
                and (gpu_type is None or placed.get("gpu_type") == gpu_type)):
            return record
    return None


def device_indices(devices: str | None) -> list[int] | None:
    """The GPU indices in a job's CUDA_VISIBLE_DEVICES ("0,1"), as the cluster gave them."""
    try:
        return [int(d) for d in devices.split(",")] if devices else None
    except ValueError:
        return None


class ClusterBackend(Backend):
    """A cluster engine as a backend: `engine` names its module, which holds `require()`,
    `precheck(settings)` and `open_cluster(settings, note)` (a View with close()); `jobs` the
    module with `executor_for(cluster, settings, plan, gpus, run_id, note)`."""

    remote = True
    engine = ""
    jobs = ""
    flag = ""               # the flag that chooses it (RunSettings.cluster's value)
    # The module whose read_signatures(cluster, settings, models) reads a factory's signature
    # there before any job (execute/elsewhere.py), and its WHERE; "": the engine cannot.
    signatures = ""

    def module(self):
        return importlib.import_module(self.engine)

    def chosen(self, settings) -> bool:
        return settings.cluster == self.flag

    def require(self) -> None:
        self.module().require()

    def dry_run_device(self, settings) -> tuple[str, str | None]:
        """Nothing is contacted: a GPU's defaults are shown for `auto`; and what each job is
        sent, where the engine's module says (`travels`: Ray's jobs carry a factory's file)."""
        shown = "cuda" if settings.device == "auto" else settings.device
        said = [f"the cluster's device decides the defaults (its GPUs, else the CPU); shown: "
                f"{shown}'s"] if settings.device == "auto" else []
        travels = getattr(self.module(), "travels", None)
        carried = travels(self._prechecked(settings)) if travels else None
        return shown, "; ".join(said + ([carried] if carried else [])) or None

    def precheck(self, settings) -> None:
        # What the engine's precheck found (Ray: the workload's files, read once), for
        # dry_run_device: kept with the settings it was found for.
        self._checked = (settings, self.module().precheck(settings))

    def _prechecked(self, settings):
        checked = getattr(self, "_checked", None)
        if checked is not None and checked[0] is settings:
            return checked[1]
        return self.module().precheck(settings)

    def reads_signatures(self, settings) -> str | None:
        return importlib.import_module(self.signatures).WHERE if self.signatures else None

    def open(self, settings, note: Note) -> "ClusterSite":
        return ClusterSite(importlib.import_module(self.jobs),
                           self.module().open_cluster(settings, note), self.signatures)


class ClusterSite(Site):
    """An opened cluster: its device, the GPUs a run may use at once (check_cluster)."""

    def __init__(self, jobs, cluster, signatures: str = ""):
        self.jobs, self.cluster = jobs, cluster
        self.signatures = signatures
        self.gpus = 1

    def read_signatures(self, settings, models: list[str]) -> dict | None:
        if not self.signatures:
            return None
        return importlib.import_module(self.signatures).read_signatures(self.cluster, settings,
                                                                        models)

    def device(self, settings) -> str:
        return cluster_device(self.cluster, settings.device, settings.gpu_type)

    def check(self, settings, plan: list) -> None:
        self.gpus = check_cluster(self.cluster, settings.device, settings.gpu_type,
                                  settings.gpus, plan)

    def executor(self, settings, plan: list, note: Note):
        from stepbench.execute.runner import new_run_id

        return self.jobs.executor_for(self.cluster, settings, plan, self.gpus, new_run_id(),
                                        note)

    def check_tune(self, settings, base) -> None:
        # One GPU at a time: tune's probes are compared with each other.
        check_cluster(self.cluster, settings.device, settings.gpu_type,
                      "1" if settings.device == "cuda" else None, [base])

    def tune_executor(self, settings, kinds: list, note: Note):
        from stepbench.execute.runner import new_run_id

        return self.jobs.executor_for(self.cluster, settings, kinds, 1, new_run_id(), note)

    def close(self) -> None:
        self.cluster.close()


class Refused(Exception):
    """The cluster refused a job's submission; the message is the run's one line."""


@dataclass
class Submitted:
    """A job the cluster took: its id there, when it was submitted, what the engine keeps."""

    job_id: str
    start: float
    handle: object = None


class ClusterExecutor(Executor):
    """What the cluster engines' executors share (ray/jobs.py, slurm/jobs.py): slots are GPUs
    (`--gpus N` of the cluster's at once), each job takes its setup's, and one job's run loop:
    submit it, follow its log until it ends, and tell the outcome. A job the cluster refused,
    or one that ended before its setup's process started, measured nothing: it is not
    recorded, and no job starts after it (`lost`, the run's one line)."""

    engine = ""             # the record's placement key: "ray", "slurm"

    def __init__(self, cluster, device: str, gpus: int, gpu_type: str | None,
                 compile_cache: Path | None, run_id: str, start: str, note):
        self.cluster, self.device, self.gpu_type = cluster, device, gpu_type
        self.run_id = run_id or None
        self.slots = [str(i) for i in range(gpus)]
        self.compile_cache = compile_cache
        self.start = start
        self.note = note
        self.lost: str | None = None
        self._lock = threading.Lock()
        self._count = 0

    def slots_needed(self, setup: Setup) -> int:
        return setup.world_size if setup.device == "cuda" else 1

    def gpu_name(self, setup: Setup, slot: str) -> str | None:
        return "cpu" if setup.device == "cpu" else self.gpu_type

    def find_done(self, job: Job, stored: list, by_key: dict | None = None) -> object | None:
        """The stored record of `job` from a run on this engine (clusters.find_done)."""
        return find_done(job, stored, self.engine, self.gpu_type)

    def run(self, job: Job, slot: str, timeout_s: float, on_message: OnMessage) -> Outcome:
        outcome = Outcome(started_at=now_iso())
        with self._lock:
            self._count += 1
            count = self._count
            stopping = self.stopping()
        if stopping:
            outcome.stopped, outcome.finished_at = True, outcome.started_at
            return outcome
        try:
            submitted = self.submit_job(job, count, timeout_s)
        except Refused as exc:
            self._lose(str(exc))
            outcome.stopped, outcome.finished_at = True, now_iso()
            return outcome
        followed = self.follow_job(submitted, job, timeout_s, outcome, on_message)
        if not (self.job_placed(followed) or outcome.timed_out or outcome.stopped):
            # The job ended before the setup's process started (its Python or runtime could not
            # start, the cluster lost its node): nothing was measured, so nothing is recorded.
            self._lose(self.why_not_started(submitted, followed))
            outcome.stopped = True
        self.finish_job(submitted, followed, job, outcome)
        outcome.finished_at = now_iso()
        return outcome

    # -- what each engine does -----------------------------------------------------------------

    def stopping(self) -> bool:
        """Whether no job may start now (stop() came, or the cluster was lost); under the lock."""
        raise NotImplementedError

    def submit_job(self, job: Job, count: int, timeout_s: float) -> Submitted:
        """Submit the run's `count`th job; Refused where the cluster does not take it."""
        raise NotImplementedError

    def follow_job(self, submitted: Submitted, job: Job, timeout_s: float, outcome: Outcome,
                   on_message: OnMessage):
        """Follow the job until it ended (stopped at the timeout, counted from its placed line,
        or on stop()), its protocol lines into `outcome`; what was seen, for the hooks below."""
        raise NotImplementedError

    def job_placed(self, followed) -> bool:
        """Whether the setup's process started (its placed line came)."""
        raise NotImplementedError

    def why_not_started(self, submitted: Submitted, followed) -> str:
        raise NotImplementedError

    def finish_job(self, submitted: Submitted, followed, job: Job, outcome: Outcome) -> None:
        """Where the job ran (the placement) and how it ended, its wall time, into `outcome`."""
        raise NotImplementedError

    def _lose(self, reason: str) -> None:
        raise NotImplementedError
