"""A command's settings as one frozen, typed value, built and checked once: defaults, then the plan
file, then the flags. Every command and executor takes it; nothing below the CLI sees argparse.

The setups' own fields (the axes) are declared in the registry (axes.py); this module declares
the rest of what `run` and `tune` take (repeats, timeout, the results file, where the setups run)
in OPTIONS, from which the CLI makes its flags and the plan file takes its settings. Defaults
that depend on the device (model, sequence, timeout) are filled in by `resolved(device)`, once
the device is known: on this machine, or on each SSH host.
"""

from __future__ import annotations

import dataclasses
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from stepbench.axes import AXES, Axis, by_key
from stepbench.errors import UserError
from stepbench.setup import TIMEOUT_S, matrix

DEFAULT_OUT = "stepbench-results.jsonl"
DEFAULT_TUNE_OUT = "stepbench-tune.jsonl"
DEVICE_CHOICES = ("auto", "cuda", "cpu")


@dataclass(frozen=True)
class Option:
    """A setting of a command that is not a field of the setups it runs."""

    key: str
    kind: type                  # int, float, str, Path or bool (a switch)
    help: str
    defaults: Mapping[str, Any]  # command -> default; a command not named has no such flag
    plan: bool = False          # may be written in a plan file
    least: float | None = None  # numbers: the smallest value it takes (floats: above it)
    metavar: str | None = None
    choices: tuple = ()

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    def check(self, value, where: str | None = None):
        """`value`, checked; `where`: how an error names it (a plan's key), else its flag."""
        name = where or self.flag
        if self.choices and value is not None and value not in self.choices:
            raise UserError(f"{name} takes one of {', '.join(self.choices)}, got {value!r}")
        if value is None or self.least is None:
            return value
        if self.kind is int and value < self.least:
            raise UserError(f"{name} must be an integer >= {self.least:g}, got {value}")
        if self.kind is float and not value > self.least:
            raise UserError(f"{name} must be > {self.least:g} seconds, got {value:g}"
                            if self.key == "timeout" else
                            f"{name} must be > {self.least:g}, got {value:g}")
        return value


RUN, TUNE = "run", "tune"
OPTIONS = [
    Option("device", str, "where to run: auto (CUDA when torch sees a GPU), cuda or cpu",
           {RUN: "auto", TUNE: "auto"}, plan=True, choices=DEVICE_CHOICES),
    Option("start", str, "how each setup's process starts: server (forked by a process server "
           "that imported torch and transformers once for the run) or fresh (a new Python "
           "that imports them itself)", {RUN: "server", TUNE: "server"}, plan=True,
           choices=("server", "fresh")),
    # None: 2 processes per setup, and a third where they disagree (execute/runner.py).
    Option("repeats", int, "processes per setup, interleaved across setups (default: 2, and a "
           "third where their step times disagree; 1 runs each setup once)",
           {RUN: None}, plan=True, least=1),
    Option("repeats", int, "the most processes of each of the two best setups: the final test "
           "adds them only while it cannot tell the two apart", {TUNE: 3}, least=1),
    Option("timeout", float, "seconds per setup before its process group is killed (default "
           "1800 on a GPU, 600 on the CPU; tune: at most the budget left)",
           {RUN: None, TUNE: None}, plan=True, least=0),
    Option("compile_cache", Path, "share this inductor cache folder across setups and runs "
           "(run's default: a fresh folder per setup, so the first compile is cold; tune's: "
           "~/.cache/stepbench/inductor)", {RUN: None, TUNE: None}, plan=True),
    Option("out", Path, "results file, JSON Lines, appended; rerun to resume",
           {RUN: Path(DEFAULT_OUT), TUNE: Path(DEFAULT_TUNE_OUT)}, plan=True),
    Option("gpus", str, "run setups concurrently, one per GPU of this pool (all, the first N, "
           "or these CUDA indices); each setup's process sees only its GPU(s)", {RUN: None},
           plan=True, metavar="all|N|I,J,..."),
    # A cluster: Ray (execute/raycluster.py) or Slurm (execute/slurmcluster.py).
    Option("ray", str, "run each setup as a Ray job on this cluster: its Jobs API address "
           "(http://HEAD:8265), auto (RAY_ADDRESS), or local (a Ray started for this run and "
           "stopped after it)", {RUN: None, TUNE: None}, metavar="ADDRESS|auto|local"),
    # "" (the flag without a value): the cluster's default partition.
    Option("slurm", str, "run each setup as a Slurm job of this cluster, in PARTITION (default: "
           "the cluster's default partition); the results folder and this Python must be on a "
           "filesystem its nodes share", {RUN: None, TUNE: None}, metavar="PARTITION"),
    Option("gpu_type", str, "with --ray or --slurm: run on this GPU type, as the cluster names "
           "it (Ray's accelerator_type, e.g. H100; Slurm's gres type, e.g. h100)",
           {RUN: None, TUNE: None}, metavar="NAME"),
    Option("node_rank", int, "this host's rank among --nnodes hosts (torchrun --node-rank)",
           {RUN: None}, least=0),
    Option("rdzv_endpoint", str, "node 0's address and a free port there, where the hosts of a "
           "job meet (torchrun --rdzv-endpoint; default: a free port on this host)", {RUN: None},
           metavar="HOST:PORT"),
    # A user's factory (--model FILE.py:FUNCTION) and the modules beside it: the folder a remote
    # job carries (docs/workloads.md).
    Option("workload_dir", Path, "with --model FILE.py:FUNCTION on SSH hosts, Ray, Slurm or "
           "rented machines: carry this whole folder (the file's own folder holds what it "
           "imports) instead of the file alone", {RUN: None}, plan=True,
           metavar="DIR"),
    Option("no_peak", bool, "on a GPU, skip measuring the matmul rate (used for mfu_measured)",
           {RUN: False}),
    Option("profile", Path, "after the timed steps, one more step under torch.profiler: its "
           "trace (.json.gz) and key_averages table (.txt, by device time) go into this folder, "
           "one pair per process (each rank of a job)", {RUN: None}, metavar="DIR"),
    Option("rerun", bool, "measure every setup again even if the results file has it; the new "
           "record is appended and replaces the old one in resume and report", {RUN: False}),
    Option("dry_run", bool, "print the setups the flags (and plan) expand to, run nothing",
           {RUN: False}),
    # The largest batch that fits (search/max_batch.py).
    Option("max_batch", bool, "for each setup, find the largest batch that fits at its "
           "sequence length, then measure that batch", {RUN: False}, plan=True),
    Option("max_batch_limit", int, "the largest batch a search tries", {RUN: 4096}, plan=True,
           least=1, metavar="N"),
    Option("probe_steps", int, "timed steps of a probe, after 1 warm-up step", {RUN: 2},
           plan=True, least=1, metavar="N"),
    Option("memory_margin", float, "on a GPU, the share of its memory (or of "
           "--memory-limit-gb) that a chosen batch's peak reserved memory must leave free",
           {RUN: 5.0}, plan=True, metavar="PERCENT"),
]
MAX_BATCH_KEYS = ("max_batch_limit", "probe_steps", "memory_margin")
CLUSTER_KEYS = ("ray", "slurm", "gpu_type")


def option(key: str, command: str = RUN) -> Option:
    return next(o for o in OPTIONS if o.key == key and command in o.defaults)


# ---------------------------------------------------------------- where a value came from

@dataclass(frozen=True)
class Origin:
    """Where each setting given came from, so that an error names it as the user wrote it: a
    flag (`--compile-scope layer needs torch.compile`), or a plan file's key as the plan spells
    it, after the plan's name (`plan study.toml: compile_scope layer needs torch.compile`).
    Keys are settings keys (axes.Axis.key, Option.key); a key's flag is `--` and its dashed
    form, as cli/flags.py makes them."""

    plan: Path | None = None
    # The keys the plan gave and no flag overrode -> the plan's spelling ("compile-scope",
    # "compile_scope", or an alias: "mode").
    spelled: Mapping[str, str] = field(default_factory=dict)
    flagged: frozenset = frozenset()    # the keys the flags gave

    def where(self, key: str) -> str | None:
        """The plan's spelling of `key`, when the plan gave it; None for a flag or a default."""
        return self.spelled.get(key)

    def name(self, key: str, about: str | None = None) -> str:
        """How an error names `key`: as it was given (its flag, or the plan's spelling, with
        the plan's name where the error is `about` a flag); a key not given at all in the style
        of the key the error is `about` (the plan's own way where the plan gave that one: the
        fix goes in the plan)."""
        flag = "--" + key.replace("_", "-")
        if key in self.flagged:
            return flag
        if key in self.spelled:
            return self.spelled[key] + ("" if about is None or about in self.spelled
                                        else f" in plan {self.plan}")
        return key.replace("_", "-") if about in self.spelled else flag

    def error(self, about: str, message: str) -> UserError:
        """A UserError about the value of `about`, headed by the plan's name when the plan
        gave that value."""
        return UserError(f"plan {self.plan}: {message}" if about in self.spelled else message)

    @contextmanager
    def checking(self, key: str):
        """A UserError raised within about `key`'s value is headed by the plan's name when the
        plan gave it (the message names the key by `where(key)`)."""
        try:
            yield
        except UserError as exc:
            if key not in self.spelled:
                raise
            raise UserError(f"plan {self.plan}: {exc}") from None


# ---------------------------------------------------------------- the parts of a run's settings

@dataclass(frozen=True)
class MaxBatchOptions:
    """How `run --max-batch` probes (search/max_batch.py)."""

    probe_steps: int = 2        # timed steps of a probe (after one warm-up step)
    limit: int = 4096           # the largest batch a search tries
    margin: float = 0.05        # GPU: share of the capacity a chosen batch's peak must leave free


@dataclass(frozen=True)
class Remote:
    """SSH hosts (`run --host`, execute/ssh.py) and how to use them."""

    hosts: tuple[str, ...] = ()         # as named on the command line and in --hosts-file
    hosts_file: Path | None = None
    ssh_config: Path | None = None      # None: ~/.ssh/config, as ssh reads it
    python: str = "python3"             # the Python there that holds torch
    setup: str | None = None            # shell code run before each command there
    dir: str = ".cache/stepbench"       # relative to the home folder there


@dataclass(frozen=True)
class Rent:
    """Rented machines (`run --rent`, execute/rent.py)."""

    specs: tuple[str, ...] = ()         # PROVIDER:GPU[:COUNT], as given
    key: str | None = None              # the SSH private key to log in with
    timeout_s: float = 900.0            # to start and answer SSH
    max_minutes: int = 120              # the provider deletes the machine after this
    template: str | None = None
    prices: bool = False                # a dry run asks the providers for today's prices


def _frozen(values: Mapping) -> Mapping:
    return MappingProxyType(dict(values))


@dataclass(frozen=True)
class RunSettings:
    """Everything `stepbench run` was asked for, checked. `values` holds every axis: a tuple for
    a matrix axis, one value for the rest; None where the device decides (model, seq) until
    `resolved`."""

    values: Mapping[str, Any]
    device: str = "auto"                # auto, cuda or cpu; resolved: cuda or cpu
    repeats: int | None = None          # None: 2 per setup, and a third where they disagree
    timeout_s: float | None = None      # None: the device's default (TIMEOUT_S)
    compile_cache: Path | None = None
    out: Path = Path(DEFAULT_OUT)
    rerun: bool = False
    measure_peak: bool = True
    profile: Path | None = None         # --profile: where each process writes its step's trace
    gpus: str | None = None             # --gpus as given: all, N or I,J,...
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    max_batch: MaxBatchOptions | None = None
    remote: Remote = field(default_factory=Remote)
    rent: Rent = field(default_factory=Rent)
    dry_run: bool = False
    format: str = "table"
    start: str = "server"               # server or fresh: how each setup's process starts
    ray: str | None = None              # --ray: the cluster's Jobs API address, auto or local
    slurm: str | None = None            # --slurm: the partition ("": the default one)
    gpu_type: str | None = None         # --gpu-type: Ray's accelerator type, Slurm's gres type
    workload_dir: Path | None = None    # --workload-dir: the folder a remote job carries
    origin: Origin = field(default_factory=Origin, compare=False, repr=False)

    @property
    def remote_run(self) -> bool:
        """On SSH hosts or rented machines, not here."""
        return bool(self.remote.hosts or self.rent.specs)

    @property
    def cluster(self) -> str | None:
        """The flag of the cluster engine that places the setups (--ray, --slurm), or None."""
        return cluster_flag(self.ray, self.slurm)

    @property
    def nnodes(self) -> int:
        return self.values["nnodes"]

    @property
    def nproc(self) -> int:
        return self.values["nproc"]

    def resolved(self, device: str) -> "RunSettings":
        """These settings on `device` (cuda or cpu): its model, sequence and timeout where none
        were given; the checks that depend on the device."""
        values = dict(self.values, device=device)
        for a in AXES:
            if values.get(a.name) is None and not a.optional:
                values[a.name] = a.default_for(device)
        if self.gpus is not None and device != "cuda" and self.cluster is None:
            gpus = self.origin.name("gpus")
            raise self.origin.error("gpus", f"{gpus} needs CUDA GPUs, and this run is on the "
                                            f"CPU; drop {gpus} (or pass --device cuda on a GPU "
                                            "machine)")
        timeout = self.timeout_s if self.timeout_s is not None else TIMEOUT_S[device]
        return dataclasses.replace(self, values=_frozen(values), device=device, timeout_s=timeout)

    def plan(self) -> list:
        """The setups, checked, in the matrix's order (settings must be `resolved`)."""
        if self.device not in ("cuda", "cpu"):
            raise ValueError("plan() needs resolved settings")
        return matrix(self.values)

    @classmethod
    def build(cls, flags: Mapping[str, Any], plan=None) -> "RunSettings":
        """Defaults, then the plan file's values (plan.read_plan: a Plan), then the flags (by
        key; None for a flag not given): parsed and checked. An error names a value as it was
        given: by its flag, or by the plan's key (Origin)."""
        flags = {k: v for k, v in flags.items() if v is not None}
        origin = Origin()
        if plan is not None:
            origin = Origin(plan.path, {k: spelled for k, spelled in plan.spelled.items()
                                        if k not in flags}, frozenset(flags))
        given = {**(plan.values if plan is not None else {}), **flags}
        # The device is an option here ("auto" too), a field of the setups once resolved.
        values = {a.name: _axis_value(a, given.get(a.key), RUN, origin) for a in AXES
                  if a.name != "device"}
        values["device"] = None
        opts = _options(given, RUN, origin)
        settings = cls(
            values=_frozen(values), device=opts["device"], repeats=opts["repeats"],
            timeout_s=opts["timeout"], compile_cache=_path(opts["compile_cache"]),
            out=Path(opts["out"]), rerun=opts["rerun"], measure_peak=not opts["no_peak"],
            profile=_path(opts["profile"]),
            gpus=opts["gpus"], node_rank=opts["node_rank"], rdzv_endpoint=opts["rdzv_endpoint"],
            max_batch=_max_batch(opts, given, origin), remote=_remote(given), rent=_rent(given),
            dry_run=opts["dry_run"], format=given.get("format") or "table",
            start=opts["start"], ray=opts["ray"], slurm=opts["slurm"], gpu_type=opts["gpu_type"],
            workload_dir=_workload_dir(opts["workload_dir"], given.get("model")), origin=origin)
        settings.check()
        return settings

    def check(self) -> None:
        """What can be judged before the device is known; an error names each setting as it
        was given (self.origin)."""
        v, o = self.values, self.origin
        if "compile" not in v["mode"] and set(v["compile_scope"]) != {"model"}:
            scope = o.name("compile_scope")
            raise o.error("compile_scope", f"{scope} {','.join(v['compile_scope'])} needs "
                                           "torch.compile; eager mode compiles nothing: add "
                                           f"compile to {o.name('modes', 'compile_scope')} or "
                                           f"drop {scope}")
        if v["parallel"] == ("none",) and (v["nproc"] != 1 or v["nnodes"] != 1):
            about = "nproc" if v["nproc"] != 1 else "nnodes"
            parallel = o.name("parallel", about)
            raise o.error(about, f"{o.name('nproc', about)} {v['nproc']} "
                                 f"{o.name('nnodes', about)} {v['nnodes']} needs a way to "
                                 f"spread the step: add {parallel} ddp or {parallel} fsdp2")
        self._check_fsdp2()
        nnodes, rank = v["nnodes"], self.node_rank
        check_clusters(self.ray, self.slurm, self.gpu_type, others=self.remote_run)
        if self.cluster is not None and (rank is not None or self.rdzv_endpoint):
            raise UserError(f"{self.cluster} places a job's nodes itself; drop --node-rank and "
                            "--rdzv-endpoint")
        if nnodes > 1 and self.cluster is None and (rank is None or not self.rdzv_endpoint):
            raise o.error("nnodes", f"{o.name('nnodes')} {nnodes} needs --node-rank (0 on the "
                                    "host given as the endpoint) and --rdzv-endpoint HOST:PORT "
                                    "of node 0, on every host")
        if nnodes > 1 and self.cluster is None and not 0 <= rank < nnodes:
            raise UserError(f"--node-rank must be from 0 to {nnodes - 1}, got {rank}")
        if nnodes == 1 and rank not in (None, 0):
            spelled = o.where("nnodes")
            raise UserError("--node-rank needs " + (f"{spelled} = 2 or more in plan {o.plan}"
                                                    if spelled else "--nnodes 2 or more"))
        if self.remote_run and (self.gpus is not None or v["nproc"] != 1 or nnodes != 1
                                or v["parallel"] != ("none",)):
            raise UserError("--host and --rent run one setup at a time on each machine's first "
                            "GPU; drop --gpus, --nproc, --nnodes and --parallel, or run "
                            "stepbench on the machine itself")
        if self.rent.prices and not (self.rent.specs and self.dry_run):
            raise UserError("--rent-prices goes with --rent and --dry-run: it asks the providers "
                            "for today's prices without renting (a run looks them up itself "
                            "before it creates anything)")
        if self.compile_cache is not None and not self.remote_run and self.ray is None:
            # Here (or on the filesystem this shares with a Slurm cluster's nodes), not a host's
            # or a Ray cluster's folder (made there): checked, not yet made.
            with self.origin.checking("compile_cache"):
                writable_folder(self.compile_cache, self.origin.name("compile_cache"))
        if self.profile is not None and (self.remote_run or self.cluster is not None):
            raise UserError("--profile writes its traces on this machine; drop it, or run "
                            "stepbench on the machine that runs the setups")
        if self.profile is not None:
            with self.origin.checking("profile"):
                writable_folder(self.profile, self.origin.name("profile"))
        if self.max_batch is not None and self.remote_run:
            raise UserError("--max-batch runs its probes on this machine; drop --host, "
                            "--hosts-file and --rent, or run `stepbench run --max-batch` on the "
                            "host itself")


    def _check_fsdp2(self) -> None:
        """FSDP2's wrapping choices need fsdp2 setups; its mixed precision needs them alone."""
        v, o = self.values, self.origin
        parallel = o.name("parallel", "precision")
        if "mixed-bf16" in v["dtype"] and set(v["parallel"]) != {"fsdp2"}:
            raise o.error("precision", f"{o.name('precision')} mixed-bf16 is FSDP2's mixed "
                                       f"precision: it needs {parallel} fsdp2 alone (measure the "
                                       "one-GPU baseline, bf16, in a run of its own)")
        if "fsdp2" in v["parallel"]:
            return
        for key in ("fsdp_reshard", "fsdp_unit", "fsdp_prefetch", "fsdp_optimizer"):
            if tuple(v[key]) != by_key(key).default:
                raise o.error(key, f"{o.name(key)} is a choice of FSDP2's wrapping: add "
                                   f"{o.name('parallel', key)} fsdp2 or drop {o.name(key)}")


def cluster_flag(ray: str | None, slurm: str | None) -> str | None:
    return "--ray" if ray is not None else "--slurm" if slurm is not None else None


def check_clusters(ray: str | None, slurm: str | None, gpu_type: str | None,
                   others: bool = False) -> None:
    """--ray, --slurm and --gpu-type, before any cluster is asked; `others`: SSH hosts or
    rentals were given too."""
    if ray is not None and slurm is not None:
        raise UserError("--ray and --slurm each name the cluster that runs the setups; pass one "
                        "of them")
    flag = cluster_flag(ray, slurm)
    if flag is None:
        if gpu_type is not None:
            raise UserError("--gpu-type chooses a GPU type of a cluster; add --ray ADDRESS or "
                            "--slurm [PARTITION] (or drop --gpu-type)")
        return
    if ray is not None and (not ray.strip() or any(c.isspace() for c in ray)):
        raise UserError(f"--ray takes the Jobs API address (http://HEAD:8265), auto or local, "
                        f"got {ray!r}")
    if slurm and (slurm.startswith("-") or any(c.isspace() or c == "," for c in slurm)):
        raise UserError(f"--slurm takes one partition's name (or none, for the default one), "
                        f"got {slurm!r}")
    if others:
        engine = "Ray" if ray is not None else "Slurm"
        raise UserError(f"{flag} runs the setups on a {engine} cluster; drop --host, --hosts-file "
                        f"and --rent (or {flag})")


def _axis_value(a: Axis, raw, command: str, origin: Origin = Origin()):
    """An axis's value from a flag's or plan's raw value (None: its default); a matrix axis of
    `run` is a tuple, the rest one value."""
    if raw is None:
        if a.default is None or isinstance(a.default, dict):
            return None             # the device decides (model, seq), or none (memory limit)
        value = a.default_for("cuda")
        return value if command == RUN or not isinstance(value, tuple) else value[0]
    where = origin.where(a.key)
    with origin.checking(a.key):
        if a.many and command == RUN:
            return a.parse(raw, where)
        if isinstance(raw, str) and a.kind is not str:
            return a.parse(raw, where)[0]
        return a.check(float(raw) if a.kind is float and isinstance(raw, int) else raw,
                       where=where)


def _options(given: dict, command: str, origin: Origin = Origin()) -> dict:
    opts = {}
    for o in OPTIONS:
        if command in o.defaults:
            value = given.get(o.key)
            with origin.checking(o.key):
                opts[o.key] = o.check(o.defaults[command] if value is None else value,
                                      origin.where(o.key))
    if opts.get("device") not in DEVICE_CHOICES:
        raise UserError(f"unknown device {opts.get('device')!r}; choose one of: "
                        + ", ".join(DEVICE_CHOICES))
    return opts


def _workload_dir(folder, model) -> Path | None:
    """--workload-dir, checked: a folder that holds the factory's file."""
    if folder is None:
        return None
    from stepbench.workload.spec import is_factory, split

    folder = Path(folder)
    if not is_factory(model) or not split(model)[0].endswith(".py"):
        raise UserError("--workload-dir goes with --model FILE.py:FUNCTION (the folder that "
                        "file imports from); drop it")
    if not folder.is_dir():
        raise UserError(f"--workload-dir {folder} is not a folder; pass the folder that holds "
                        f"{split(model)[0]}")
    file = Path(split(model)[0]).resolve()
    if folder.resolve() not in file.parents:
        raise UserError(f"--workload-dir {folder} does not hold {split(model)[0]}; pass a folder "
                        "above the file")
    return folder


def _path(value) -> Path | None:
    return None if value is None else Path(value)


def writable_folder(path: Path, flag: str, make: bool = False) -> Path:
    """`path` as a folder stepbench can write into: there, or makeable under a folder there;
    else a UserError naming `flag`. With `make`, the folder is made (a dry run only checks)."""
    path = Path(path).expanduser()
    fix = f"pass {flag} a folder you can write to"
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file; {fix}")
    there = next(p for p in (path, *path.parents) if p.exists())
    if not there.is_dir():
        raise UserError(f"{flag} {path} cannot be made: {there} is a file; {fix}")
    if make:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{flag} {path} cannot be made ({exc.strerror}); {fix}") from None
        there = path
    if not os.access(there, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path} is not writable ({there}: permission denied); {fix}")
    return path


def _max_batch(opts: dict, given: dict, origin: Origin = Origin()) -> MaxBatchOptions | None:
    named = [k for k in MAX_BATCH_KEYS if given.get(k) is not None]
    if not opts["max_batch"]:
        if named:
            key = named[0]
            switch = origin.name("max_batch", key)
            switch += "" if switch.startswith("--") else " = true"
            raise origin.error(key, f"{origin.name(key)} sets up the batch search; add {switch} "
                                    "(or drop it)")
        return None
    margin = opts["memory_margin"]
    if not 0 <= margin < 100:
        raise origin.error("memory_margin", f"{origin.name('memory_margin')} is a percentage "
                                            f"from 0 to 99, got {margin:g}")
    return MaxBatchOptions(probe_steps=opts["probe_steps"], limit=opts["max_batch_limit"],
                           margin=margin / 100)


def _remote(given: dict) -> Remote:
    hosts = list(given.get("host") or [])
    if given.get("hosts_file"):
        hosts += read_hosts_file(Path(given["hosts_file"]))
    seen = set()
    for name in hosts:
        if name in seen:
            raise UserError(f"host {name!r} is given twice; name each host once")
        seen.add(name)
    config = given.get("ssh_config")
    if config is not None and not Path(config).is_file():
        raise UserError(f"SSH config {config} not found; pass the file that defines your host "
                        "aliases (default ~/.ssh/config)")
    return Remote(hosts=tuple(hosts), hosts_file=_path(given.get("hosts_file")),
                  ssh_config=_path(config),
                  python=given.get("remote_python") or "python3",
                  setup=given.get("remote_setup"),
                  dir=given.get("remote_dir") or ".cache/stepbench")


def read_hosts_file(path: Path) -> list[str]:
    """One host a line (alias or user@host[:port]); blank lines and # comments are skipped."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read hosts file {path} ({getattr(exc, 'strerror', None) or exc}); "
                        "pass a text file with one host a line") from None
    hosts = [h for h in (line.split("#", 1)[0].strip() for line in lines) if h]
    if not hosts:
        raise UserError(f"hosts file {path} names no host; write one alias or user@host[:port] "
                        "a line")
    return hosts


def _rent(given: dict) -> Rent:
    rent = Rent(specs=tuple(given.get("rent") or ()), key=given.get("rent_key"),
                timeout_s=given.get("rent_timeout") or Rent.timeout_s,
                max_minutes=given.get("rent_max_minutes") or Rent.max_minutes,
                template=given.get("rent_template"), prices=bool(given.get("rent_prices")))
    if not 5 <= rent.max_minutes <= 10080:
        raise UserError(f"--rent-max-minutes must be from 5 to 10080, got {rent.max_minutes}")
    if rent.timeout_s <= 0:
        raise UserError(f"--rent-timeout must be > 0 seconds, got {rent.timeout_s:g}")
    return rent


# ---------------------------------------------------------------- tune

@dataclass(frozen=True)
class TuneSettings:
    """Everything `stepbench tune` was asked for, checked. `values`: the axes it does not
    search, one value each (None where the device decides); `space`: the searched axes the
    flags narrowed, axis name -> values (the others: every value this machine runs)."""

    values: Mapping[str, Any]
    space: Mapping[str, tuple]
    budget_s: float
    objective: str = "tokens"
    device: str = "auto"
    repeats: int = 3
    timeout_s: float | None = None
    compile_cache: Path | None = None
    out: Path = Path(DEFAULT_TUNE_OUT)
    format: str = "table"
    start: str = "server"
    ray: str | None = None
    slurm: str | None = None
    gpu_type: str | None = None

    @property
    def cluster(self) -> str | None:
        return cluster_flag(self.ray, self.slurm)

    @classmethod
    def build(cls, flags: Mapping[str, Any]) -> "TuneSettings":
        given = {k: v for k, v in flags.items() if v is not None}
        values, space = {}, {}
        for a in AXES:
            if a.tune in SEARCHED:
                if given.get(a.key) is not None:
                    space[a.name] = a.parse(given[a.key])
            elif a.name != "device":
                values[a.name] = _axis_value(a, given.get(a.key), TUNE)
        values["device"] = None
        opts = _options(given, TUNE)
        check_clusters(opts["ray"], opts["slurm"], opts["gpu_type"])
        if opts["compile_cache"] is not None and opts["ray"] is None:
            writable_folder(_path(opts["compile_cache"]), option("compile_cache", TUNE).flag)
        objective = given.get("objective") or "tokens"
        if objective == "fit" and values.get("memory_limit_gb") is None:
            raise UserError("--objective fit needs --memory-limit-gb N, the memory the step must "
                            "fit in")
        return cls(values=_frozen(values), space=_frozen(space),
                   budget_s=parse_budget(given.get("budget")), objective=objective,
                   device=opts["device"], repeats=opts["repeats"], timeout_s=opts["timeout"],
                   compile_cache=_path(opts["compile_cache"]), out=Path(opts["out"]),
                   format=given.get("format") or "table", start=opts["start"],
                   ray=opts["ray"], slurm=opts["slurm"], gpu_type=opts["gpu_type"])

    def resolved(self, device: str) -> "TuneSettings":
        values = dict(self.values, device=device)
        for a in AXES:
            if a.name in values and values[a.name] is None and not a.optional:
                default = a.default_for(device)
                values[a.name] = default[0] if isinstance(default, tuple) else default
        timeout = self.timeout_s if self.timeout_s is not None else TIMEOUT_S[device]
        return dataclasses.replace(self, values=_frozen(values), device=device, timeout_s=timeout)


SEARCHED = ("screen", "option", "memory")     # Axis.tune values of the axes tune searches


def parse_budget(text) -> float:
    """Seconds in "20m", "90s", "1h30m" or a plain number of seconds."""
    match = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*",
                         str(text))
    if text is None or not match or not any(match.groups()):
        raise UserError(f"--budget takes a duration like 20m, 90s or 1h30m, got {text!r}")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise UserError(f"--budget must be more than 0 seconds, got {text!r}")
    return total
