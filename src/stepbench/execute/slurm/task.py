"""What one task of a Slurm job runs: execute/slurm/jobs.py submits `run(spec)` through submitit,
which calls it in the job's Python (this very Python and stepbench, from the filesystem that the
nodes share).

A job is one process of one setup: one task, or one per node for `--nnodes`. Each task runs
hostside (execute/hosts/hostside.py) in this process, as an SSH host or a Ray job does: the setup's
process (or a torchrun job) in its own process group, its protocol lines passed through to the
task's log file, a first "placed" line (the job, the node: the setup's timeout starts there) and
an "exit" line. With `--start server`, hostside forks the setup's process from a process server
of its own, started before the placed line, as a local run's server starts before the setup's
clock; a Slurm job's processes end with it, so no server outlives a job to serve the next.

Slurm ends a cancelled job by SIGTERM to its tasks (SIGKILL after its KillWait): hostside ends
the setup's process group, which a proctrack/pgid cluster would not find (it is a session of its
own). SIGUSR2, which submitit asks Slurm to send before the time limit so that a job can requeue
itself, is ignored: a setup's process is never requeued, and the run's own clock stops it first.

Over several nodes, node 0 picks a free port and writes HOST:PORT into the job's folder (shared
by the nodes); every node reads it there and runs torchrun with that static rendezvous.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from stepbench.execute.hosts import hostside

ENDPOINT = "{endpoint}"     # in a node's argv: node 0's HOST:PORT, known once the job runs
RENDEZVOUS_WAIT_S = 300     # how long a node waits for node 0's address


def run(spec: dict) -> int:
    """One task: hostside runs the spec's command (for a job over several nodes, this node's),
    its placed line naming the Slurm job and node."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    node = int(os.environ.get("SLURM_NODEID", "0"))
    host = dict(spec["host"], placed={"job_id": job_id, "node": os.environ.get("SLURMD_NODENAME"),
                                      "node_rank": node})
    argvs = spec.get("node_argvs")
    if argvs:
        endpoint = rendezvous(Path(spec["folder"]) / job_id / "rendezvous", node)
        host["argv"] = [arg.replace(ENDPOINT, endpoint) for arg in argvs[node]]
        host["rank_dir"] = f"{host['rank_dir']}-{node}"     # each node's own
    return hostside.run(host)


def rendezvous(path: Path, node: int) -> str:
    """Node 0's HOST:PORT, written there by node 0 (a free port of its own) and read by the
    others."""
    if node == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            endpoint = f"{socket.gethostname()}:{s.getsockname()[1]}"
        written = path.with_name(path.name + ".part")
        written.write_text(endpoint)
        os.replace(written, path)
        return endpoint
    deadline = time.monotonic() + RENDEZVOUS_WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"stepbench: node 0 of the job did not write its address to {path} "
                             f"within {RENDEZVOUS_WAIT_S} s")
        time.sleep(0.2)
    return path.read_text().strip()


def signatures(models: list[str]) -> tuple[str, dict]:
    """The signature job's task (execute/slurm/signatures.py): this node's name, and each
    factory's answer as workload/sigreader.py reads it in this job's Python and folder, as the
    setups' processes see their packages."""
    from stepbench.workload import sigreader

    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    return node, {model: sigreader.answer(sigreader.read(model)) for model in models}
