"""A factory's signature read on a compute node of the Slurm partition before any setup's job
(execute/elsewhere.py), for a package the nodes have and this machine does not: one short job,
submitted as the setups' jobs are (jobs.py: submitit's sbatch, the run's partition, this very
Python with this stepbench on its PYTHONPATH, this folder as its working folder), that reads
every such factory with workload/sigreader.py. It asks one CPU for the shortest time, and, where
the run's jobs ask for GPUs, one GPU of theirs (`parameters`): a GPU partition's submit rules may
refuse a job that asks none (a job_submit plugin, a QOS's minimum GPUs), and a job of the run's
GPU type lands on the nodes the setups will, with what is installed there.

A job the queue does not start (or finish) within READ_TIMEOUT_S is cancelled: its factories go
unchecked, each setup's job checks what it is given, and the line says why and what to do."""

from __future__ import annotations

import math
import sys
import time
import uuid
from pathlib import Path

from stepbench.execute.clusters import cluster_device
from stepbench.execute.slurm.cluster import SlurmError, require_slurm, slurm
from stepbench.execute.slurm.jobs import (ALIVE, FOLDER, LOOK_S, POLL_S, SETTLE_S, STOP_WAIT_S,
                                          _ended, _quote, _reason, cancel, gres, remove_folder,
                                          this_stepbench)
from stepbench.workload import sigreader

WHERE = "in a short Slurm job on the run's partition"
READ_TIMEOUT_S = 120        # the job waits in the queue first; past this it is cancelled


def read_signatures(cluster, settings, models: list[str]) -> dict:
    """model -> (where, sigreader's fields) for each model the job read; else model -> why it
    was not read (the job was refused, ended without an answer, or did not start in time)."""
    submitit = require_slurm()
    from stepbench.execute.slurm.task import signatures

    name = f"stepbench-signature-{uuid.uuid4().hex[:12]}"
    folder = Path(settings.out).expanduser().absolute().parent / FOLDER / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        executor = submitit.SlurmExecutor(folder=folder / "%j", python=_quote(sys.executable))
        params = parameters(cluster, settings, name)
        executor.update_parameters(**params)
        try:
            job = executor.submit(signatures, list(models))
        except Exception as exc:  # noqa: BLE001 - sbatch refused: unchecked, said
            return dict.fromkeys(models, f"Slurm refused the job that reads it ({_reason(exc)})")
        try:
            return _answers(job, cluster.partition, models,
                            "a free GPU" if "gres" in params else "a free CPU")
        finally:
            cancel(job.job_id)
            _left(job.job_id)
    finally:
        remove_folder(folder)


def parameters(cluster, settings, name: str) -> dict:
    """The read job's sbatch options (submitit's names): one task of one CPU for the shortest
    time; one GPU of the run's type where the run's jobs ask for GPUs."""
    params = {"job_name": name, "partition": cluster.partition, "nodes": 1,
              "ntasks_per_node": 1, "cpus_per_task": 1,
              "time": max(1, math.ceil(READ_TIMEOUT_S / 60)) + 1, "setup": [this_stepbench()],
              "additional_parameters": {"no_requeue": True}}
    if cluster_device(cluster, settings.device, settings.gpu_type) == "cuda":
        params["gres"] = gres(settings.gpu_type, 1)
    return params


def _answers(job, partition: str, models: list[str], free: str = "a free CPU") -> dict:
    """What the job returned, once its result is there; why not, where it is not."""
    deadline = time.monotonic() + READ_TIMEOUT_S
    look_at, state = time.monotonic() + LOOK_S, "PENDING"
    while not job.paths.result_pickle.exists():
        now = time.monotonic()
        if now >= deadline:
            return dict.fromkeys(models, (
                f"the Slurm job that reads it ({job.job_id}) was still {state} after "
                f"{READ_TIMEOUT_S} s and was cancelled; run when partition {partition} has "
                f"{free} to have it read first"))
        if now >= look_at:
            found = _state(job.job_id)
            look_at, state = now + LOOK_S, state if found is None else found
            if state not in ALIVE:
                time.sleep(SETTLE_S)        # its result, through a shared filesystem
                if job.paths.result_pickle.exists():
                    break
                return dict.fromkeys(models, f"the Slurm job that reads it ({job.job_id}) "
                                             f"{_ended(state)} without an answer")
        time.sleep(POLL_S)
    try:
        node, answers = job.result()
    except Exception as exc:  # noqa: BLE001 - the job's Python failed: unchecked, said
        return dict.fromkeys(models, f"the Slurm job that reads it ({job.job_id}) failed "
                                     f"({_reason(exc)})")
    where = f"on Slurm node {node} (job {job.job_id})"
    found = {model: sigreader.parse(line) for model, line in answers.items()}
    return {model: (where, fields) if fields is not None else f"the Slurm job that reads it "
            f"({job.job_id}) gave no answer" for model, fields in found.items()}


def _left(job_id: str) -> None:
    """Until the job has left the queue (its Python exits after writing the result), at most
    STOP_WAIT_S: no job of the run's is left behind it."""
    deadline = time.monotonic() + STOP_WAIT_S
    while _state(job_id) in ALIVE and time.monotonic() < deadline:
        time.sleep(POLL_S)


def _state(job_id: str) -> str | None:
    """The job's state as squeue says it; "" once it has left the queue; None where squeue
    cannot tell now."""
    try:
        listed = slurm("squeue", "-h", "--me", "-t", "all", "-j", job_id, "-o", "%T").split()
    except SlurmError as exc:
        return "" if "Invalid job id" in str(exc) else None
    return listed[0] if listed else ""
