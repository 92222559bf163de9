"""A partition of a Slurm cluster the user already has (`run --slurm [PARTITION]`, `tune
--slurm`), as sinfo shows it (`Cluster`, a clusters.View); the filesystem its nodes must share
with this machine (`check_shared`); and what the backend asks of it (clusters.ClusterBackend).
Each setup is one Slurm job: jobs.py.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from stepbench.errors import UserError, first_line

INSTALL_HINT = "pip install 'stepbench[slurm]'"
COMMANDS = ("sbatch", "squeue", "scancel", "sinfo", "srun")
COMMAND_TIMEOUT_S = 60  # one Slurm command
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


# -- what `run --slurm` and `tune --slurm` ask (clusters.ClusterBackend) ---------------------

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
                 model if isinstance(model, (tuple, list)) else [model],
                 getattr(settings, "workload_dir", None))
    return cluster


# ---------------------------------------------------------------- a filesystem the nodes share

def check_shared(cluster: Cluster, out: Path, compile_cache: Path | None = None,
                 models=(), workload_dir: Path | None = None) -> None:
    """A UserError, one line, where a path the jobs use is on this machine's own disk and the
    partition has nodes that are other machines: the results folder (the run's job files go
    beside the results file), this Python's environment and stepbench (the jobs run them), a
    model's config file, a factory's file (or its --workload-dir folder: the jobs import it
    there, from this working folder), the compile cache. A `package.module:FUNCTION` is
    imported as this Python has it."""
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
    from stepbench.execute.bundle import factory_files
    from stepbench.measure.models import PRESETS
    from stepbench.workload.loader import is_factory

    for model in models:
        if model and model not in PRESETS and not is_factory(model):   # a config file here
            paths.append((Path(model).expanduser().absolute(), "the model config",
                          "put it on a filesystem they share"))
    for file in factory_files(list(models)):
        held = workload_dir is not None and Path(workload_dir).resolve() in \
            Path(file).resolve().parents
        paths.append((Path(workload_dir if held else file).expanduser().absolute(),
                      "the workload folder" if held else "the factory's file",
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


