"""The settings `run` and `tune` share, declared once (declare.py): where the setups run and how
their processes start, the results file, timeouts, the output format. RunSettings and
TuneSettings extend `Common` with their own."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar, Mapping

from stepbench.errors import UserError
from stepbench.record_checks import out_problem
from stepbench.settings.choices import Device, PinCpus, Start
from stepbench.settings.declare import (RUN, TUNE, Backend, Group, chosen_backends, setting)

DEFAULT_OUT = "stepbench-results.jsonl"
DEFAULT_TUNE_OUT = "stepbench-tune.jsonl"
DEVICE_CHOICES = tuple(d.value for d in Device)

# The backends a setting chooses (execute/ runs each); a cluster engine places the setups itself.
RAY = Backend("ray", "Ray", "--ray ADDRESS", cluster=True)
SLURM = Backend("slurm", "Slurm", "--slurm [PARTITION]", cluster=True)
HOSTS = Backend("hosts", "SSH hosts", "--host NAME")
RENT = Backend("rent", "rented machines", "--rent PROVIDER:GPU")

# The flags' groups in --help, in this order after the ungrouped ones.
GROUPS = {
    "max_batch": Group(
        "the largest batch that fits (docs/tune.md)",
        "Short probes, each its own process, double the batch from --batch until one runs out "
        "of memory, then bisect; the full measurement (--warmup, --steps, --repeats) runs at "
        "the batch found. Rerunning the same command resumes the search."),
    "cluster": Group(
        "a cluster: Ray (needs the ray extra: pip install 'stepbench[ray]'; docs/ray.md) or "
        "Slurm (the slurm extra; docs/slurm.md)",
        {command: "Each setup runs as a job of the cluster, which chooses its node and GPUs; "
                  "records carry the job and node. " + more for command, more in (
                      (RUN, "--gpus N: at most N of the cluster's GPUs at once (default: all "
                            "of them)."),
                      (TUNE, "Probes run one at a time, on one GPU."))}),
    "remote": Group(
        "remote machines over SSH (needs the fleet extra: pip install 'stepbench[fleet]')",
        "Run the matrix on every host at once, each setup in its own process there, into the "
        "one results file here; records are tagged with the host's name. Device, model and "
        "sequence defaults are worked out on each host; --compile-cache names a folder there."),
    "rent": Group(
        "rented GPUs (needs the runcrate extra: pip install 'stepbench[runcrate]')",
        "Create one machine per --rent, run the matrix there as on an SSH host, and delete it "
        "whatever happens (done, failed, timed out, Ctrl-C, SIGTERM). API key from "
        "RUNCRATE_API_KEY. Records carry the provider's hourly price."),
}


def _ray_address(value: str, name: str) -> None:
    if not value.strip() or any(c.isspace() for c in value):
        raise UserError(f"{name} takes the Jobs API address (http://HEAD:8265), auto or local, "
                        f"got {value!r}", kind="bad_value")


def _partition(value: str, name: str) -> None:
    if value and (value.startswith("-") or any(c.isspace() or c == "," for c in value)):
        raise UserError(f"{name} takes one partition's name (or none, for the default one), "
                        f"got {value!r}", kind="bad_value")


def _results_file(value: Path, name: str) -> None:
    """An --out that cannot take records (a folder, a file of notes) is refused with the other
    settings, before anything is read or run, a dry run included."""
    problem = out_problem(value)
    if problem:
        raise UserError(f"{problem}; pass {name} a new file or a results file",
                        kind="results_file")


def frozen(values: Mapping) -> Mapping:
    return MappingProxyType(dict(values))


@dataclass(frozen=True, kw_only=True)
class Common:
    """What `run` and `tune` both take. `command` names the command whose defaults and help a
    subclass's declarations take (Setting.per)."""

    command: ClassVar[str] = RUN

    device: Device = setting(
        Device.AUTO, "where to run: auto (CUDA when torch sees a GPU), cuda or cpu", plan=True,
        doc="`cuda` or `cpu`; `auto` picks CUDA when torch sees a GPU")
    start: Start = setting(
        Start.SERVER, "how each setup's process starts: server (forked by a process server "
        "that imported torch and transformers once for the run) or fresh (a new Python that "
        "imports them itself)", plan=True,
        doc="how each setup's process starts: `server` (forked from the run's process server, "
            "which imported torch, transformers and the models' code once) or `fresh` (a new "
            "Python that imports them itself, as stepbench did before); torchrun jobs "
            "(`--parallel`) always start fresh. Recorded as `placement.start`, not part of a "
            "setup's identity")
    # Off by default: no measurement has shown it helps (benchmarks/README.md, section l).
    pin_cpus: PinCpus = setting(
        PinCpus.OFF, "bind each setup's process to its GPU's NUMA-local cores (auto), as "
        "torchrun's --numa-binding does, or leave it to the scheduler (off, the default)",
        plan=True,
        doc="`auto` binds each setup's process (every thread) to the cores local to its GPU "
            "(`/sys/bus/pci/devices/<bus id>/local_cpulist`, else NVML's CPU affinity), as "
            "torchrun's `--numa-binding` does; `off` leaves it to the scheduler. Recorded as "
            "`cpu_pinning` (which cores, or why not). On a host of one NUMA node (the H200 "
            "machine measured: 16 vCPUs, GPU0's affinity 0-15) `auto` changes nothing. The "
            "default is `off` because no measurement has shown pinning steadies or speeds a "
            "step (benchmarks/README.md, section l); a GPU setup on a host of several NUMA "
            "nodes is where `auto` may matter. Torchrun jobs (`--parallel`) are not pinned")
    # None: 2 processes per setup, and a third where they disagree (execute/runner.py).
    repeats: int | None = setting(
        None, "processes per setup, interleaved across setups (default: 2, and a third where "
        "their step times disagree; 1 runs each setup once)", plan=True, least=1,
        doc_default="2, and a third where they disagree",
        doc="processes per setup, interleaved across setups (A B C, A B C, then the third "
            "processes); `--repeats N` runs exactly N, `--repeats 1` one process per setup",
        per={TUNE: {"default": 3, "plan": False, "doc": "", "doc_default": None,
                    "help": "the most processes of each of the two best setups: the final "
                            "test adds them only while it cannot tell the two apart"}})
    # None: the device's default (setup.TIMEOUT_S), until `resolved`.
    timeout_s: float | None = setting(
        None, "seconds per setup before its process group is killed (default 1800 on a GPU, "
        "600 on the CPU; tune: at most the budget left)", key="timeout", plan=True, least=0,
        unit="seconds", doc_default="1800 s (GPU) / 600 s (CPU)",
        doc="per setup; the whole process group is killed after it")
    compile_cache: Path | None = setting(
        None, "share this inductor cache folder across setups and runs (run's default: a fresh "
        "folder per setup, so the first compile is cold; tune's: ~/.cache/stepbench/inductor)",
        plan=True, metavar="DIR", doc_default="fresh per setup",
        doc="share one inductor cache across setups and runs (default: each compiled setup "
            "starts cold, later repeats of it are warm)",
        per={TUNE: {"doc_default": "`~/.cache/stepbench/inductor`"}})
    out: Path = setting(
        Path(DEFAULT_OUT), "results file, JSON Lines, appended; rerun to resume", plan=True,
        check=_results_file,
        doc="results file, appended as each setup ends; rerun the same command to resume",
        per={TUNE: {"default": Path(DEFAULT_TUNE_OUT)}})
    format: str = setting(
        "table", "table (default), markdown, or json (the records, alone on stdout)",
        choices=("table", "markdown", "json"),
        doc="`table`, `markdown`, or `json` (the records as a JSON array, alone on stdout)",
        per={TUNE: {"choices": ("table", "markdown", "csv", "json", "html"), "doc": "",
                    "help": "table (default), markdown, csv, html (what it tried and its "
                            "verdict, as the report prints a table), or json: one object with "
                            "winner, runner_up, tried and command"}})
    # A cluster: Ray (execute/raycluster.py) or Slurm (execute/slurmcluster.py).
    ray: str | None = setting(
        None, "run each setup as a Ray job on this cluster: its Jobs API address "
        "(http://HEAD:8265), auto (RAY_ADDRESS), or local (a Ray started for this run and "
        "stopped after it)", metavar="ADDRESS|auto|local", backend=RAY, check=_ray_address,
        group="cluster",
        doc="run each setup as a job of a Ray cluster (`tune` takes it too); with `--ray`, "
            "`--gpus N` is how many of the cluster's GPUs the run uses at once: see "
            "[ray.md](ray.md)")
    # "" (the flag without a value): the cluster's default partition.
    slurm: str | None = setting(
        None, "run each setup as a Slurm job of this cluster, in PARTITION (default: the "
        "cluster's default partition); the results folder and this Python must be on a "
        "filesystem its nodes share", metavar="PARTITION", backend=SLURM, check=_partition,
        group="cluster", argparse={"nargs": "?", "const": ""},
        doc="run each setup as a Slurm job in the partition (default: the cluster's default "
            "one; `tune` takes it too); `--gpus N` as with `--ray`: see [slurm.md](slurm.md)")
    gpu_type: str | None = setting(
        None, "with --ray or --slurm: run on this GPU type, as the cluster names it (Ray's "
        "accelerator_type, e.g. H100; Slurm's gres type, e.g. h100)", metavar="NAME",
        needs=("ray", "slurm"), needs_why="chooses a GPU type of a cluster", group="cluster")

    @property
    def cluster(self) -> str | None:
        """The flag of the cluster engine that places the setups (--ray, --slurm), or None."""
        return next((s.flag_name for s, b in chosen_backends(self) if b.cluster), None)

    @property
    def backends(self) -> tuple[str, ...]:
        """The names of the backends these settings choose (ray, slurm, hosts, rent); () runs
        the setups on this machine."""
        return tuple(b.name for _, b in chosen_backends(self))


__all__ = ["Common", "GROUPS", "DEFAULT_OUT", "DEFAULT_TUNE_OUT", "DEVICE_CHOICES", "RAY",
           "SLURM", "HOSTS", "RENT", "frozen"]
