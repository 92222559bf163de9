"""`stepbench run`'s settings: the shared ones (common.py) and its own, declared once each, built
and checked once: defaults, then the plan file, then the flags. Defaults that depend on the
device (model, sequence, timeout) are filled in by `resolved(device)`, once the device is known:
on this machine, or on each SSH host."""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

from stepbench.axes import AXES, Axis, by_key
from stepbench.errors import UserError
from stepbench.settings.choices import Device
from stepbench.settings.common import HOSTS, RENT, Common, frozen
from stepbench.settings.declare import RUN, between, check_backends, part, read, setting
from stepbench.settings.origin import Origin, read_hosts_file, writable_folder
from stepbench.setup import TIMEOUT_S, matrix


def _margin(value: float, name: str) -> None:
    if not 0 <= value < 100:
        raise UserError(f"{name} is a percentage from 0 to 99, got {value:g}")


def _endpoint(value: str, name: str) -> None:
    """HOST[:PORT] as torchrun takes it (its port defaults to 29400); [v6]:PORT too."""
    host, port = value, ""
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest.removeprefix(":")
    elif value.count(":") == 1:
        host, port = value.split(":")
    if not host or any(c.isspace() for c in value) or value.endswith(":") or \
            (port and not (port.isdigit() and 0 < int(port) < 65536)):
        raise UserError(f"{name} {value!r} is not HOST:PORT; pass node 0's address and a free "
                        "port there, e.g. 10.0.0.1:29500", kind="bad_value")


# The settings of SSH hosts and rented machines (run as hosts) mean nothing without one.
_REMOTE, _REMOTE_WHY = ("hosts", "rent"), "says how to use the SSH hosts and rented machines"
_RENT, _RENT_WHY = ("rent",), "sets up the rented machines"


@dataclass(frozen=True, kw_only=True)
class MaxBatchOptions:
    """How `run --max-batch` probes (search/max_batch.py)."""

    limit: int = setting(4096, "the largest batch a search tries", key="max_batch_limit",
                         plan=True, least=1, metavar="N")
    probe_steps: int = setting(2, "timed steps of a probe, after 1 warm-up step", plan=True,
                               least=1, metavar="N")
    # GPU: the share of the capacity a chosen batch's peak must leave free (given in percent).
    margin: float = setting(
        5.0, "on a GPU, the share of its memory (or of --memory-limit-gb) that a chosen "
        "batch's peak reserved memory must leave free", key="memory_margin", plan=True,
        metavar="PERCENT", check=_margin, convert=lambda percent: percent / 100,
        doc_default="`5`",
        doc="percent of the GPU's memory (or of `--memory-limit-gb`) that a chosen batch's "
            "peak reserved memory must leave free")


@dataclass(frozen=True, kw_only=True)
class Remote:
    """SSH hosts (`run --host`, execute/ssh.py) and how to use them."""

    # As named on the command line, then those of --hosts-file (`checked`).
    hosts: tuple[str, ...] = setting(
        (), "an SSH config alias or user@host[:port]; repeatable", key="host", metavar="NAME",
        backend=HOSTS,
        doc="run on this SSH host (repeatable), each setup in its own process there: see "
            "[remote.md](remote.md)")
    hosts_file: Path | None = setting(
        None, "a file of hosts, one alias or user@host[:port] a line (# comments)",
        metavar="FILE", backend=HOSTS)
    ssh_config: Path | None = setting(   # None: ~/.ssh/config, as ssh reads it
        None, "the OpenSSH config to read instead of ~/.ssh/config", metavar="FILE",
        needs=_REMOTE, needs_why=_REMOTE_WHY)
    python: str = setting(               # the Python there that holds torch
        "python3", "the Python on the hosts that has torch; stepbench installs itself into "
        "an environment that uses its packages (default python3)", key="remote_python",
        needs=_REMOTE, needs_why=_REMOTE_WHY,
        metavar="PATH", empty_is_default=True)
    setup: str | None = setting(         # shell code run before each command there
        None, "shell code run on each host before each stepbench command there, in the same "
        "shell, e.g. 'module load cuda' or 'source ~/torch/bin/activate'", key="remote_setup",
        needs=_REMOTE, needs_why=_REMOTE_WHY,
        metavar="SHELL")
    dir: str = setting(                  # relative to the home folder there
        ".cache/stepbench", "where stepbench keeps its environment and work files on the "
        "hosts (default ~/.cache/stepbench)", key="remote_dir",
        needs=_REMOTE, needs_why=_REMOTE_WHY, metavar="DIR",
        empty_is_default=True, doc_default="`~/.cache/stepbench`")

    def checked(self) -> "Remote":
        """With the hosts of --hosts-file, each named once; the SSH config there."""
        hosts = list(self.hosts)
        if self.hosts_file is not None:
            hosts += read_hosts_file(self.hosts_file)
        seen = set()
        for name in hosts:
            if name in seen:
                raise UserError(f"host {name!r} is given twice; name each host once")
            seen.add(name)
        if self.ssh_config is not None and not self.ssh_config.is_file():
            raise UserError(f"SSH config {self.ssh_config} not found; pass the file that defines "
                            "your host aliases (default ~/.ssh/config)")
        return dataclasses.replace(self, hosts=tuple(hosts))


@dataclass(frozen=True, kw_only=True)
class Rent:
    """Rented machines (`run --rent`, execute/rent.py)."""

    specs: tuple[str, ...] = setting(    # PROVIDER:GPU[:COUNT], as given
        (), "rent a machine with this GPU type (and count, default 1) and run there, e.g. "
        "runcrate:L40S or 'runcrate:RTX 5090'; repeatable", key="rent",
        metavar="PROVIDER:GPU[:COUNT]", backend=RENT,
        doc="rent a machine with this GPU type (and count, default 1) and run there as on an "
            "SSH host (repeatable): see [remote.md](remote.md)")
    key: str | None = setting(           # the SSH private key to log in with
        None, "the SSH private key to log in with; its public key is registered with the "
        "provider once (default ~/.ssh/id_ed25519, id_ecdsa, id_rsa)", key="rent_key",
        needs=_RENT, needs_why=_RENT_WHY,
        metavar="FILE")
    timeout_s: float = setting(          # to start and answer SSH
        900.0, "how long a machine may take to start and answer SSH before it is deleted "
        "(default 900)", key="rent_timeout",
        needs=_RENT, needs_why=_RENT_WHY, metavar="SECONDS", least=0, unit="seconds",
        empty_is_default=True)
    max_minutes: int = setting(          # the provider deletes the machine after this
        120, "the provider deletes each machine after this many minutes whatever happens "
        "here: the safety net if stepbench cannot (default 120)", key="rent_max_minutes",
        needs=_RENT, needs_why=_RENT_WHY,
        metavar="MINUTES", check=between(5, 10080), empty_is_default=True)
    template: str | None = setting(
        None, "the provider's machine image (template); it must have Python 3.11+ with torch "
        "(default: the provider's default)", key="rent_template",
        needs=_RENT, needs_why=_RENT_WHY, metavar="NAME")
    prices: bool = setting(              # a dry run asks the providers for today's prices
        False, "with --dry-run: ask the providers for each rental's machine and price now "
        "(needs the API key and the network; nothing is created). Without it a dry run "
        "contacts nothing", key="rent_prices")


@dataclass(frozen=True, kw_only=True)
class RunSettings(Common):
    """Everything `stepbench run` was asked for, checked. `values` holds every axis: a tuple for
    a matrix axis, one value for the rest; None where the device decides (model, seq) until
    `resolved`."""

    command: ClassVar[str] = RUN

    values: Mapping[str, Any]
    gpus: str | None = setting(          # as given: all, N or I,J,...
        None, "run setups concurrently, one per GPU of this pool (all, the first N, or these "
        "CUDA indices); each setup's process sees only its GPU(s)", plan=True,
        metavar="all|N|I,J,...",
        doc="`all`, `N` (the first N) or `I,J,...` (CUDA indices): run setups concurrently, "
            "one per GPU of this pool, each process seeing only its own GPU "
            "(`CUDA_VISIBLE_DEVICES`); longest-expected setups start first")
    node_rank: int | None = setting(
        None, "this host's rank among --nnodes hosts (torchrun --node-rank)", least=0,
        doc="this host's rank among `--nnodes` hosts (torchrun's `--node-rank`; see "
            "[gpus.md](gpus.md#one-job-over-two-hosts))")
    rdzv_endpoint: str | None = setting(
        None, "node 0's address and a free port there, where the hosts of a job meet (torchrun "
        "--rdzv-endpoint; default: a free port on this host)", metavar="HOST:PORT",
        check=_endpoint)
    measure_peak: bool = setting(
        False, "on a GPU, skip measuring the matmul rate (used for mfu_measured)", key="no_peak",
        convert=operator.not_,
        doc="on a GPU, skip the matmul rate used for `mfu_measured` (measured in the first "
            "setup's process, then cached: see [Caches](#caches))")
    profile: Path | None = setting(      # where each process writes its step's trace
        None, "after the timed steps, one more step under torch.profiler: its trace (.json.gz) "
        "and key_averages table (.txt, by device time) go into this folder, one pair per "
        "process (each rank of a job)", metavar="DIR",
        doc="after each setup's timed steps, one more step under `torch.profiler`: its trace "
            "(`.json.gz`) and `key_averages` table (`.txt`, top 40 by device time) in DIR, one "
            "pair per process (each rank of a job); the record's `profile` names them, and on "
            "a GPU the report's \"GPU busy\" says how much of the step the GPU ran kernels "
            "(docs/report.md). On this machine only (not with `--host`, `--rent`, `--ray`, "
            "`--slurm`)")
    # A user's factory (--model FILE.py:FUNCTION) and the modules beside it: the folder a
    # remote job carries (docs/workloads.md).
    workload_dir: Path | None = setting(
        None, "with --model FILE.py:FUNCTION on SSH hosts, Ray, Slurm or rented machines: "
        "carry this whole folder (what the file imports from) instead of the file alone",
        plan=True, metavar="DIR",
        doc="with `--model FILE.py:FUNCTION`: the folder (above the file) that a job on SSH "
            "hosts, Ray, Slurm or a rented machine carries instead of the file alone; see "
            "[workloads.md](workloads.md)")
    rerun: bool = setting(
        False, "measure every setup again even if the results file has it; the new record is "
        "appended and replaces the old one in resume and report")
    dry_run: bool = setting(
        False, "print the setups the flags (and plan) expand to, run nothing",
        doc="print the setups the flags and plan expand to, run nothing (`--format json`: "
            "their `setup` objects); with `--host`, `--hosts-file` or `--rent`, the setups of "
            "each host and rental, contacting nothing (see [remote.md](remote.md#dry-runs))")
    # The largest batch that fits (search/max_batch.py); None without --max-batch.
    max_batch: MaxBatchOptions | None = part(
        MaxBatchOptions, switch=setting(
            False, "for each setup, find the largest batch that fits at its sequence length, "
            "then measure that batch", plan=True,
            doc="for each setup, find the largest batch that fits at its sequence length with "
                "short probes (from the smallest `--batch`, doubling, then bisecting), then "
                "measure that batch with `--warmup`, `--steps` and `--repeats`; see "
                "[tune.md](tune.md#the-largest-batch-that-fits-run---max-batch). On the CPU it "
                "needs `--memory-limit-gb`"),
        purpose="sets up the batch search", group="max_batch")
    remote: Remote = part(Remote, group="remote")
    rent: Rent = part(Rent, group="rent")
    origin: Origin = field(default_factory=Origin, compare=False, repr=False)

    @property
    def remote_run(self) -> bool:
        """On SSH hosts or rented machines, not here."""
        return bool(self.remote.hosts or self.rent.specs)

    @property
    def nnodes(self) -> int:
        return self.values["nnodes"]

    @property
    def nproc(self) -> int:
        return self.values["nproc"]

    def resolved(self, device: str) -> "RunSettings":
        """These settings on `device` (cuda or cpu): its model, sequence and timeout where none
        were given; the checks that depend on the device."""
        values = dict(self.values, device=str(device))
        for a in AXES:
            if values.get(a.name) is None and not a.optional:
                values[a.name] = a.default_for(device)
        if self.gpus is not None and device != "cuda" and self.cluster is None:
            gpus = self.origin.name("gpus")
            raise self.origin.error("gpus", f"{gpus} needs CUDA GPUs, and this run is on the "
                                            f"CPU; drop {gpus} (or pass --device cuda on a GPU "
                                            "machine)")
        timeout = self.timeout_s if self.timeout_s is not None else TIMEOUT_S[device]
        there = dataclasses.replace(self, values=frozen(values), device=Device(device),
                                    timeout_s=timeout)
        if self.device != Device.AUTO or not self.remote_run:   # a host resolves auto itself
            there.check_device()                                # (hosts/fleet.py's plan)
        return there

    def check_device(self) -> None:
        """The values the resolved device gives no meaning (axes.Axis.refuses), refused."""
        check_device(self.values, self.device, self.origin)

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
        # The device is a setting here ("auto" too), a field of the setups once resolved.
        values = {a.name: axis_value(a, given.get(a.key), cls.command, origin) for a in AXES
                  if a.name != "device"}
        values["device"] = None
        settings = cls(values=frozen(values), origin=origin, **read(cls, given, origin))
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
                                           f"drop {scope}", kind="conflict")
        if v["parallel"] == ("none",) and (v["nproc"] != 1 or v["nnodes"] != 1):
            about = "nproc" if v["nproc"] != 1 else "nnodes"
            parallel = o.name("parallel", about)
            raise o.error(about, f"{o.name('nproc', about)} {v['nproc']} "
                                 f"{o.name('nnodes', about)} {v['nnodes']} needs a way to "
                                 f"spread the step: add {parallel} ddp or {parallel} fsdp2",
                          kind="conflict")
        self._check_fsdp2()
        if self.workload_dir is not None:
            from stepbench.workload.checks import check_workload_dir

            check_workload_dir(self.workload_dir, v["model"])
        nnodes, rank = v["nnodes"], self.node_rank
        check_backends(self)
        if self.cluster is not None and (rank is not None or self.rdzv_endpoint):
            raise UserError(f"{self.cluster} places a job's nodes itself; drop --node-rank and "
                            "--rdzv-endpoint", kind="conflict")
        if nnodes > 1 and self.cluster is None and (rank is None or not self.rdzv_endpoint):
            raise o.error("nnodes", f"{o.name('nnodes')} {nnodes} needs --node-rank (0 on the "
                                    "host given as the endpoint) and --rdzv-endpoint HOST:PORT "
                                    "of node 0, on every host", kind="conflict")
        if nnodes > 1 and self.cluster is None and not 0 <= rank < nnodes:
            raise UserError(f"--node-rank must be from 0 to {nnodes - 1}, got {rank}",
                            kind="bad_value")
        if nnodes == 1 and rank not in (None, 0):
            spelled = o.where("nnodes")
            raise UserError("--node-rank needs " + (f"{spelled} = 2 or more in plan {o.plan}"
                                                    if spelled else "--nnodes 2 or more"))
        if self.remote_run and (self.gpus is not None or v["nproc"] != 1 or nnodes != 1
                                or v["parallel"] != ("none",)):
            raise UserError("--host and --rent run one setup at a time on each machine's first "
                            "GPU; drop --gpus, --nproc, --nnodes and --parallel, or run "
                            "stepbench on the machine itself", kind="conflict")
        if self.rent.prices and not (self.rent.specs and self.dry_run):
            raise UserError("--rent-prices goes with --rent and --dry-run: it asks the providers "
                            "for today's prices without renting (a run looks them up itself "
                            "before it creates anything)", kind="conflict")
        if self.compile_cache is not None and not self.remote_run and self.ray is None:
            # Here (or on the filesystem this shares with a Slurm cluster's nodes), not a host's
            # or a Ray cluster's folder (made there): checked, not yet made.
            with self.origin.checking("compile_cache"):
                writable_folder(self.compile_cache, self.origin.name("compile_cache"))
        if self.profile is not None and (self.remote_run or self.cluster is not None):
            raise UserError("--profile writes its traces on this machine; drop it, or run "
                            "stepbench on the machine that runs the setups", kind="conflict")
        if self.profile is not None:
            with self.origin.checking("profile"):
                writable_folder(self.profile, self.origin.name("profile"))
        if self.max_batch is not None and self.remote_run:
            raise UserError("--max-batch runs its probes on this machine; drop --host, "
                            "--hosts-file and --rent, or run `stepbench run --max-batch` on the "
                            "host itself", kind="conflict")

    def _check_fsdp2(self) -> None:
        """FSDP2's wrapping choices need fsdp2 setups; its mixed precision needs them alone."""
        v, o = self.values, self.origin
        parallel = o.name("parallel", "precision")
        if "mixed-bf16" in v["dtype"] and set(v["parallel"]) != {"fsdp2"}:
            raise o.error("precision", f"{o.name('precision')} mixed-bf16 is FSDP2's mixed "
                                       f"precision: it needs {parallel} fsdp2 alone (measure the "
                                       "one-GPU baseline, bf16, in a run of its own)",
                          kind="conflict")
        if "fsdp2" in v["parallel"]:
            return
        for key in ("fsdp_reshard", "fsdp_unit", "fsdp_prefetch", "fsdp_optimizer"):
            if tuple(v[key]) != by_key(key).default:
                raise o.error(key, f"{o.name(key)} is a choice of FSDP2's wrapping: add "
                                   f"{o.name('parallel', key)} fsdp2 or drop {o.name(key)}",
                              kind="conflict")


def check_device(values: Mapping[str, Any], device: str, origin: Origin = Origin()) -> None:
    """A UserError (exit 2) for the first axis value `device` gives no meaning (its
    `refuses`), naming it as it was given and the fix; nothing of it would be measured."""
    for a in AXES:
        given = values.get(a.name)
        for value in (given if isinstance(given, (tuple, list)) else (given,)):
            reason = a.refuses(value, device) if a.refuses and value is not None else None
            if reason:
                raise origin.error(a.key, f"{origin.name(a.key)} {value} on {device}: {reason}",
                                   kind="conflict")


def axis_value(a: Axis, raw, command: str, origin: Origin = Origin()):
    """An axis's value from a flag's or plan's raw value (None: its default); a matrix axis of
    `run` is a tuple, the rest one value."""
    if raw is None:
        if a.default is None or isinstance(a.default, dict):
            return None             # the device decides (model, seq), or none (memory limit)
        value = a.default_for("cuda")
        return value if command == RUN or not isinstance(value, tuple) else value[0]
    where = origin.where(a.key)
    with origin.checking(a.key):
        if (a.many and command == RUN) or not a.split:
            return a.parse(raw, where)      # a repeated flag (--param): every one of them
        if isinstance(raw, str) and a.kind is not str:
            return a.parse(raw, where)[0]
        return a.check(float(raw) if a.kind is float and isinstance(raw, int) else raw,
                       where=where)


__all__ = ["RunSettings", "MaxBatchOptions", "Remote", "Rent", "axis_value", "check_device"]
