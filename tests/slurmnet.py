"""A real Slurm for the tests (Debian's slurm-wlm and munge): a controller and two slurmd nodes on
this machine, the first with two fake GPUs (gres gpu:h100, on device files made with mknod), in
network, PID and mount namespaces of their own with loopback only.

Why the namespaces: Slurm's daemons listen on every interface; inside `unshare --net` the only
one is loopback, so nothing reaches or leaves them. Every process Slurm starts (its daemons
daemonize; a job's tasks are slurmstepd's children) is in the PID namespace, so the tests look
for leftovers there, and killing the namespace's first process ends them all; no `scancel` of
everything or `killall`.

Slurm 22.05 asks getaddrinfo for IPv4 with AI_ADDRCONFIG, which finds nothing where loopback is
the only interface; with IPv6 enabled (CommunicationParameters=EnableIPv6) it asks for any family,
and 127.0.0.1 resolves. No accounting (no slurmdbd): sacct fails, as on many small clusters, and
stepbench reads a job's end without it. A second partition, `far`, holds one node that is another
machine (a TEST-NET address that nothing answers): a run there finds its results folder on this
machine's own disk and is refused. A task prolog puts tests/nodes_only on every task's PYTHONPATH:
a package the nodes import and the clients cannot.

The namespaces are held by a small Python process (HOLDER, as tests/raynet.py's): the daemons
enter the network, PID and mount namespaces (nsenter); a client (stepbench run, submitit) only
the network namespace, so it stays this process's child and signals reach it directly. Clients
find the cluster through SLURM_CONF (`env`).
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from raynet import HOLDER, NODES_ONLY, Namespaced

GPU_TYPE = "h100"
DAEMONS = ("munged", "slurmctld", "slurmd")
NODES = ("sb1", "sb2")      # sb1: 4 CPUs and the GPUs; sb2: 2 CPUs (a job's second node)
READY_S = 60
CONF = """ClusterName=stepbench
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
CommunicationParameters=EnableIPv6
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
GresTypes=gpu
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
TaskProlog={d}/task_prolog.sh
InactiveLimit=0
NodeName=sb1 NodeHostname={host} NodeAddr=127.0.0.1 Port=16818 CPUs=4 Gres=gpu:{gpu}:2 State=UNKNOWN
NodeName=sb2 NodeHostname={host} NodeAddr=127.0.0.1 Port=16819 CPUs=2 State=UNKNOWN
NodeName=far1 NodeHostname=far1 NodeAddr=192.0.2.1 CPUs=2 State=UNKNOWN
PartitionName=main Nodes=sb1,sb2 Default=YES MaxTime=INFINITE State=UP
PartitionName=far Nodes=far1 MaxTime=INFINITE State=UP
"""


def unavailable() -> str | None:
    """Why no Slurm can be started here, or None."""
    missing = [c for c in ("munged", "slurmctld", "slurmd", "sbatch", "srun")
               if shutil.which(c) is None and not Path("/usr/sbin", c).exists()]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing: apt-get install "
                "slurm-wlm munge)")
    try:
        import submitit  # noqa: F401
    except ImportError:
        return "submitit cannot be imported (pip install 'stepbench[slurm]')"
    if not shutil.which("unshare") or not shutil.which("nsenter") or not shutil.which("ip"):
        return "unshare, nsenter or ip is missing (util-linux, iproute2)"
    if os.geteuid() != 0:
        return "network namespaces, and Slurm's daemons, need root here"
    with tempfile.TemporaryDirectory() as folder:
        try:
            os.mknod(Path(folder) / "gpu", 0o600 | stat.S_IFCHR, os.makedev(195, 0))
        except OSError as exc:
            return f"the fake GPUs are device files, and mknod is not allowed here ({exc.strerror})"
    return None


def _daemon(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmCluster(Namespaced):
    """The cluster; `env` is what a client needs to reach it (SLURM_CONF)."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="sbslurm-"))    # short: Unix socket paths
        d = self.folder
        for i in range(2):      # the fake GPUs: character devices of NVIDIA's major number
            os.mknod(d / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(195, i))
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        host = socket.gethostname().split(".")[0]
        (d / "slurm.conf").write_text(CONF.format(host=host, d=d, gpu=GPU_TYPE))
        # Every task sees tests/nodes_only, the clients do not (a package only the nodes have).
        prolog = d / "task_prolog.sh"
        prolog.write_text(f'#!/bin/sh\necho "export PYTHONPATH={NODES_ONLY}'
                          '${PYTHONPATH:+:$PYTHONPATH}"\n')
        prolog.chmod(0o755)
        (d / "gres.conf").write_text(f"NodeName=sb1 Name=gpu Type={GPU_TYPE} "
                                     f"File={d}/nvidia[0-1]\n")
        self.env = dict(os.environ, SLURM_CONF=str(d / "slurm.conf"))
        self.holder = subprocess.Popen(["unshare", "--net", "--pid", "--fork", "--mount-proc",
                                        "--kill-child", sys.executable, "-c", HOLDER],
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       text=True)
        try:
            assert self.holder.stdout.readline().strip() == "ready", "the namespace holder failed"
            self.pid = psutil.Process(self.holder.pid).children()[0].pid
            conf = str(d / "slurm.conf")
            for argv in ([_daemon("munged"), f"--key-file={key}", f"--socket={d}/munge.sock",
                          f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                          f"--seed-file={d}/munged.seed", "--force"],
                         [_daemon("slurmctld"), "-f", conf],
                         *([_daemon("slurmd"), "-f", conf, "-N", node] for node in NODES)):
                done = subprocess.run(self.enter(["-n", "-p", "-m"]) + argv, env=self.env,
                                      capture_output=True, text=True, timeout=60)
                assert done.returncode == 0, f"{argv[0]} failed:\n{done.stderr[-3000:]}"
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def wait_ready(self) -> None:
        """Until both nodes are idle (slurmd registered with the controller)."""
        deadline = time.monotonic() + READY_S
        while True:
            done = subprocess.run(self.client_argv(["sinfo", "-h", "-N", "-p", "main", "-o",
                                                    "%N %t"]),
                                  env=self.env, capture_output=True, text=True, timeout=60)
            states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
            if all(states.get(node) == "idle" for node in NODES):
                return
            assert time.monotonic() < deadline, (f"Slurm's nodes are not idle after {READY_S} s: "
                                                 f"{done.stdout}{done.stderr}{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        return "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                       for p in sorted(self.folder.glob("*.log")))

    def jobs(self) -> list[str]:
        """The jobs Slurm still runs or queues: `JOBID STATE NAME` lines."""
        done = subprocess.run(self.client_argv(["squeue", "-h", "-o", "%i %T %j"]),
                              env=self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.split("\n")[:-1]
