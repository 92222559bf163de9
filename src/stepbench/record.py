"""The one typed result of a setup (Record) and the JSON Lines file that stores records.

Field meanings are in docs/results-schema.md (a test checks the document against this type).
A record is written once, by the runner, from what the setup's process sent; it is read back by
resume and by the report. Records are appended, flushed and fsynced as each setup ends, so a crash
of the parent never loses a finished setup. An append never damages the file: it starts on a
fresh line (after a cut-off last line too), holds an exclusive flock that every stepbench process
appending to the file takes, and when a write fails part-way (full disk, quota, file size limit,
I/O error) it cuts the file back to its size before and raises ResultsFileError. Reading takes a
shared flock, so it never sees half of another process's line, and is forgiving: a truncated or
garbled line, or a record with a value of the wrong type or an impossible one (a time that is
not a number, NaN or negative), is reported with its file and line number and skipped; a field
that an older stepbench did not write reads as its default.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import functools
import io
import json
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from stepbench.claims import Claims
from stepbench.errors import UserError
from stepbench.record_checks import missing_fields, out_problem, overlap, wrong_value
from stepbench.record_formats import (FORMAT_V1, FORMATS, LATER_FIELDS, LAYER_GRAPHS,  # noqa: F401
                                      RecordFormat)
from stepbench.setup import Setup

SCHEMA = 1




class _FromDict:
    @classmethod
    def from_dict(cls, data: dict | None):
        """Known fields of `data`; missing ones take their defaults."""
        names = field_names(cls)
        return cls(**{k: v for k, v in (data or {}).items() if k in names})


@dataclass
class Machine(_FromDict):
    """Where a setup ran, as its own process saw it (measure/machine.py)."""

    gpu: str = "cpu"                    # name as the driver reports it, or "cpu"
    gpu_count: int = 0                  # GPUs the process could see
    gpu_memory_gb: float | None = None  # total memory of the GPU it ran on, 1e9 bytes
    driver: str | None = None
    hostname: str | None = None
    cpu: str | None = None              # CPU model name
    cpu_count: int | None = None

    def named(self, *extra: str) -> str:
        """The machine a report names ("cpu" alone would not tell two apart), `extra` parts (a
        host, a label) added: "CPU (AMD EPYC, 2 cores, gpu-a)", "NVIDIA H100 PCIe (gpu-a)"."""
        if self.gpu != "cpu":
            return f"{self.gpu} ({', '.join(extra)})" if extra else self.gpu
        cores = [f"{self.cpu_count} cores"] if self.cpu_count else []
        return f"CPU ({', '.join([self.cpu or 'unknown model', *cores, *extra])})"

    name = property(named)              # the GPU's name, or "CPU (its model, N cores)"


@dataclass
class Software(_FromDict):
    """Versions the setup's process imported."""

    python: str | None = None
    torch: str | None = None
    transformers: str | None = None
    stepbench: str | None = None
    cuda: str | None = None


@dataclass
class Record:
    """One setup (one repeat) as measured; units are in the names, null = not measured."""

    run_id: str
    repeat: int
    setup: Setup
    status: str                  # ok, oom, timeout, crashed, error, unsupported
    error: str | None = None
    # Measured in the setup's process (measure/step.py); the last phase it reached.
    phase: str = "starting"
    params: int | None = None
    first_step_s: float | None = None
    step_ms: float | None = None
    step_ms_median: float | None = None
    step_ms_min: float | None = None
    step_ms_max: float | None = None
    step_ms_std: float | None = None
    step_times_ms: list[float] = field(default_factory=list)
    timed_wall_s: float | None = None
    # On a GPU (stepbench.hostlead): how far behind the host's clock the GPU finished each timed
    # step, its median, and the uncertainty of the two clocks' offset (null on a CPU).
    host_lead_ms: float | None = None
    host_lead_steps_ms: list[float] = field(default_factory=list)
    host_lead_offset_ms: float | None = None
    tokens_per_s: float | None = None
    peak_memory_gb: float | None = None
    peak_reserved_gb: float | None = None
    # Under CUDA graphs peak_memory_gb is the peak reserved memory (measure/step.CudaMemory):
    # peak_memory_source says so, and peak_allocated_gb keeps what max_memory_allocated read.
    peak_allocated_gb: float | None = None
    peak_memory_source: str | None = None
    oom_memory_gb: float | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    losses: list[float] = field(default_factory=list)
    # Relative tolerance within which this setup's losses must agree with its peers' (the loss
    # guard, stepbench.guard); set by the parent from the precision.
    loss_tolerance: float | None = None
    # The first step drew random numbers (dropout: the default generators' states moved); set
    # only then. Eager and compiled steps draw them differently: the loss guard does not
    # compare their losses.
    draws_random: bool | None = None
    flops_per_token: float | None = None
    flops_per_token_causal: float | None = None
    flops_convention: str | None = None
    flop_counter_per_step: float | None = None
    achieved_tflops: float | None = None
    peak_tflops_datasheet: float | None = None
    peak_tflops_measured: float | None = None
    peak_measured_at: str | None = None   # when that rate was measured (earlier: from the cache)
    mfu_datasheet: float | None = None
    mfu_measured: float | None = None
    compile: dict | None = None
    telemetry: dict | None = None
    energy: dict | None = None
    noise_flags: list[str] = field(default_factory=list)
    phases: dict | None = None   # wall seconds per phase of the process (measure/phases.py)
    threads: dict | None = None  # torch's intra-op and inter-op threads in the setup's process
    # --pin-cpus auto (measure/pinning.py): the cores the process was bound to, or why not.
    cpu_pinning: dict | None = None
    # How --memory-limit-gb was applied (measure/worker.limit_memory): mechanism, limit, baseline.
    memory_cap: dict | None = None
    # A distributed job (setup.parallel ddp or fsdp2): every rank's own numbers, and the job's
    # scaling figures (measure/distributed.combine; efficiency from the runner).
    ranks: list[dict] = field(default_factory=list)
    scaling: dict | None = None
    # `run --profile`: one step after the timed ones, under torch.profiler (measure/step.py).
    profile: dict | None = None
    # A user's workload (--model FILE.py:FUNCTION, workload/factory.py): what tokens_per_s
    # counts ("samples", "tokens", the user's unit) and how many one process trains per step;
    # FLOPs per step and where they came from ("workload": the user's number, "flop_counter":
    # torch.utils.flop_counter over one step). None for a transformers model: tokens.
    units: str | None = None
    units_per_step: int | None = None
    flops_per_step: float | None = None
    flops_source: str | None = None
    # A user's workload: its repeated blocks, found once after the build (workload/factory.py
    # find_blocks), {"count": 12, "class": "Block"} or {"count": 0}: what per-layer compile and
    # checkpointing act on; tune tries neither on a model without one. None for a transformers
    # model.
    blocks: dict | None = None
    # A user's workload: its own parameters that no --param gave, at the defaults its source
    # declares ({"width": 256}): the setup's params name only those given.
    param_defaults: dict | None = None
    # What could not be had without failing the measurement (FLOPs, MFU), one sentence each.
    notes: list[str] = field(default_factory=list)
    # A user's workload that failed in its process: the traceback (the error is its last line).
    traceback: str | None = None
    # Seen by the parent.
    started_at: str | None = None
    finished_at: str | None = None
    wall_s: float | None = None
    # The SSH host the setup ran on, as named on the command line (`run --host`); None for a run
    # on this machine, and then left out of the JSON, so local records read and write as before.
    host: str | None = None
    # A rented machine (`run --rent`): the provider, its GPU label and count, and the instance's
    # price per hour as the provider charged it (all its GPUs); None for a machine not rented.
    rental: dict | None = None
    machine: Machine = field(default_factory=Machine)
    software: Software = field(default_factory=Software)
    # Where the executor placed the job: GPUs, inductor's compile threads, jobs run alongside.
    placement: dict | None = None
    # Why a search (stepbench.search: `run --max-batch`, `tune`) asked for this measurement:
    # {"kind": "max_batch" | "tune", "role": ..., ...}; None for a setup of a plain run.
    search: dict | None = None
    schema: int = SCHEMA

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.step_ms is not None

    @property
    def format(self) -> RecordFormat:
        """The newest record format (FORMATS) this record's fields show: LAYER_GRAPHS where its
        compile counters hold `recompile_limit_hits`; else FORMAT_V1, which a record without
        compile counters (eager, failed) reads as too: nothing it holds changed since."""
        if "recompile_limit_hits" in (self.compile or {}):
            return LAYER_GRAPHS
        return FORMAT_V1

    @property
    def compiled_too_few_layers(self) -> bool:
        """A record of per-layer compile that ran in full, in a format older than LAYER_GRAPHS:
        its layers past dynamo's recompile limit ran eagerly; a run measures it again instead
        of resuming it."""
        s = self.setup
        per_layer = s.compile_scope == "layer" or s.parallel == "fsdp2"
        return s.mode == "compile" and per_layer and self.ok and self.format < LAYER_GRAPHS

    def resume_parts(self) -> tuple:
        """What makes two records the same measurement: the setup, the repeat and where it ran
        (a results file shared between machines resumes each machine's own setups; two SSH
        hosts with the same GPU never stand in for each other)."""
        return resume_parts(self.setup, self.repeat, self.machine.gpu, self.host)

    def resume_key(self) -> str:     # resume_parts as text
        return resume_key(self.setup, self.repeat, self.machine.gpu, self.host)

    def to_dict(self) -> dict:
        data = {"schema": self.schema}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in LATER_FIELDS and value in (None, [], {}):
                continue        # as FORMAT_V1 wrote it: old files read back unchanged
            if f.name == "setup":
                value = value.to_dict()
            elif dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            data[f.name] = value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Record":
        """A Record from its JSON object; missing fields take their defaults, unknown ones
        (written by a newer stepbench) are left out. Without a field that has no default it
        raises ValueError naming the field(s), e.g. "missing field 'repeat'"."""
        problem = missing_fields(data, Record, Setup)
        if problem:
            raise ValueError(problem)
        known = field_names(cls)
        values = {k: v for k, v in data.items() if k in known}
        values["setup"] = Setup.from_dict(data["setup"])
        values["machine"] = Machine.from_dict(data.get("machine"))
        values["software"] = Software.from_dict(data.get("software"))
        return cls(**values)


MEASURED_FIELDS = tuple(f.name for f in dataclasses.fields(Record)
                        if f.name not in ("run_id", "repeat", "setup", "status", "error",
                                          "started_at", "finished_at", "wall_s", "host", "rental",
                                          "machine", "software", "placement", "search",
                                          "schema"))


@functools.cache
def field_names(cls) -> frozenset[str]:
    """The field names of dataclass `cls` (read once: a report reads thousands of records)."""
    return frozenset(f.name for f in dataclasses.fields(cls))


def resume_parts(setup: Setup, repeat: int, gpu: str | None, host: str | None = None) -> tuple:
    """A measurement's identity (Record.resume_parts): (setup key, repeat, GPU, host)."""
    return (setup.key(), repeat, gpu, host)


def resume_key(setup: Setup, repeat: int, gpu: str | None, host: str | None = None) -> str:
    """resume_parts as JSON text, what resume and claim files match records by; without a
    host, what it always was (old files resume)."""
    *kept, host = resume_parts(setup, repeat, gpu, host)
    return json.dumps(kept + ([host] if host is not None else []))


# One lock for every ResultsFile of this process: setups of several hosts finish in their own
# threads, and a record must be appended whole, never interleaved with another or read half-way.
# (flock, taken as well, excludes other processes; this lock keeps the threads of one process in
# order without relying on flock's per-open-file semantics.)
_FILE_LOCK = threading.Lock()

# What to do about a failed append, by errno; the message says the file is as it was before.
_FIXES = {
    errno.ENOSPC: "free space on its disk",
    errno.EDQUOT: "free space or raise your disk quota",
    errno.EFBIG: "raise the file size limit (ulimit -f) or pass another --out",
    errno.EROFS: "pass an --out on a writable filesystem",
    errno.EIO: "check its disk",
}


class ResultsFileError(UserError):
    """The results file could not be appended to. Exit code 1, not a user error's 2: the
    command was fine, its results could not be kept."""

    exit_code = 1
    kind = "results_file"


# ---------------------------------------------------------------- the JSON Lines store


class ResultsFile:
    """One results file: append-only writes that never damage it, forgiving reads."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.claims = Claims(self)   # the measurements runs are making into it (claims.py)

    def check_writable(self) -> "ResultsFile":
        """Fail before anything runs, with the fix, when the file cannot be appended to (opened
        and locked as append does), or holds something other than records (notes, a CSV):
        appending JSON to it would spoil both."""
        problem = out_problem(self.path)
        if problem:
            raise UserError(f"{problem}; pass a new file or a results file to --out",
                            kind="results_file")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            finally:
                os.close(fd)    # closing releases the lock
        except OSError as exc:
            raise UserError(f"cannot write results to {self.path} ({exc.strerror}); pass a "
                            "writable --out path") from None
        return self

    def _open(self) -> int:
        # Read as well as append: append looks at the last byte before it writes.
        return os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)

    def append(self, record: Record) -> None:
        """Append `record` as one line, fsynced. On any OSError the file is cut back to what it
        held before and ResultsFileError says why.

        A write past RLIMIT_FSIZE raises EFBIG here rather than killing the process with
        SIGXFSZ: CPython ignores SIGXFSZ from start-up (as it does SIGPIPE; subprocess restores
        the default in children), so nothing here touches signal handlers, which slot threads
        could not do anyway."""
        line = (json.dumps(record.to_dict()) + "\n").encode("utf-8")
        with _FILE_LOCK:
            try:
                fd = self._open()
            except OSError as exc:
                raise self._error(exc, "") from None
            try:
                self._append_locked(fd, line)
            finally:
                os.close(fd)

    def _append_locked(self, fd: int, line: bytes) -> None:
        try:
            # Every stepbench process appending to this file takes this lock: no interleaving,
            # and the size and last byte below stay true until the line is written.
            fcntl.flock(fd, fcntl.LOCK_EX)
            size_bytes = os.fstat(fd).st_size
        except OSError as exc:
            raise self._error(exc, "") from None
        try:
            # A cut-off last line (a crash or a full disk under an older stepbench) keeps its
            # place; the new record starts on a line of its own instead of finishing that one.
            if size_bytes and os.pread(fd, 1, size_bytes - 1) != b"\n":
                line = b"\n" + line
            _write_all(fd, line)
            os.fsync(fd)
        except OSError as exc:
            raise self._error(exc, self._roll_back(fd, size_bytes)) from None

    @staticmethod
    def _roll_back(fd: int, size_bytes: int) -> str:
        """Cut off what a failed append wrote; '' when done, else why it could not be."""
        try:
            os.ftruncate(fd, size_bytes)
            return ""
        except OSError as exc:
            return exc.strerror or str(exc)

    def _error(self, exc: OSError, roll_back_failed: str) -> ResultsFileError:
        cause = exc.strerror or str(exc)
        fix = _FIXES.get(exc.errno, "fix that")
        if roll_back_failed:
            return ResultsFileError(
                f"cannot append to {self.path}: {cause}, and cutting off the half-written record "
                f"failed too ({roll_back_failed}); its last line is broken and reading skips it; "
                f"{fix} and run the same command again to resume")
        return ResultsFileError(
            f"cannot append to {self.path}: {cause} (the file is as it was before this record; "
            f"{fix} and run the same command again to resume)")

    def end(self) -> int:
        """Where the file ends now, in bytes (0 before it exists), between appends: a record
        appended later lies past it (`read(since=...)`; claims.py)."""
        try:
            with _FILE_LOCK, open(self.path, "rb") as f:
                _shared_lock(f.fileno())
                return os.fstat(f.fileno()).st_size
        except OSError:
            return 0            # not there yet (or not a file: reading it says so)

    def read(self, warn: Callable[[str], None] | None = None, since: int = 0) -> list[Record]:
        """Every record, in file order (those after byte `since`, an `end()`); bad lines and
        unknown schema versions are warned about (with file and line) and skipped."""
        return [record for _, record in self._numbered(warn, since)]

    def _numbered(self, warn, since: int = 0) -> list[tuple[int, Record]]:   # with line numbers
        warn = warn or (lambda message: warnings.warn(message, stacklevel=3))
        if not self.path.exists():
            return []
        records = []
        try:
            raw = open(self.path, "rb")
            raw.seek(since)   # line numbers count from there (claims.py's read, which is silent)
            # errors="replace": one garbled byte spoils its line (skipped below), not the file.
            with _FILE_LOCK, io.TextIOWrapper(raw, encoding="utf-8", errors="replace") as f:
                _shared_lock(f.fileno())
                for number, line in enumerate(f, 1):
                    if line.strip():
                        record = _parse(line, f"{self.path}:{number}", warn)
                        if record is not None:
                            records.append((number, record))
        except OSError as exc:  # a folder, no permission, a failing disk, /proc/self/mem
            raise UserError(f"cannot read results file {self.path} ({exc.strerror}); pass a "
                            "results file that can be read") from None
        return records

    def latest(self, warn: Callable[[str], None] | None = None) -> list[Record]:
        """The records that count: where a setup was measured again (`run --rerun`), the later
        record replaces the earlier one, in the earlier one's place. Where the two were
        measured at the same time (two runs on one file), the later counts as well, with a
        warning naming both lines: no record is dropped unsaid."""
        shown = warn or (lambda message: warnings.warn(message, stacklevel=2))
        by_key: dict[tuple, tuple[int, Record]] = {}
        for number, record in self._numbered(warn):
            key = record.resume_parts()        # no JSON made for every record
            if key in by_key and overlap(by_key[key][1], record):
                s = record.setup
                shown(f"{self.path}:{number}: a second record of {s.name} (batch {s.batch} x "
                      f"{s.seq}, repeat {record.repeat}) on {record.machine.gpu}, measured while "
                      f"line {by_key[key][0]}'s was (two runs at once on one file); the later "
                      "one counts")
            by_key[key] = (number, record)
        return [record for _, record in by_key.values()]


def _write_all(fd: int, data: bytes) -> None:
    # os.write may write part of it (a signal, a disk filling up); the next call raises the error.
    while data:
        data = data[os.write(fd, data):]


def _shared_lock(fd: int) -> None:
    """Wait out an append of another process, so that no half line is read. A filesystem
    without flock is read unlocked: a half line would be skipped with a warning."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:
        pass


def _parse(line: str, where: str, warn) -> Record | None:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        warn(f"{where}: skipped a line that is not valid JSON ({exc.msg}); it may be truncated")
        return None
    if not isinstance(data, dict) or not isinstance(data.get("setup"), dict):
        warn(f"{where}: skipped a line that is not a stepbench record")
        return None
    schema = data.get("schema")
    if schema != SCHEMA:
        # A newer stepbench's record, or a line of something else that has a `setup` object.
        warn(f"{where}: skipped a record of schema {schema}; this stepbench reads schema "
             f"{SCHEMA} (upgrade stepbench to read it)" if type(schema) is int and schema > SCHEMA
             else f"{where}: skipped a line that is not a stepbench record (schema {schema!r}, "
                  f"not {SCHEMA})")
        return None
    problem = _problem(data)
    if problem:
        warn(f"{where}: skipped a record ({problem})")
        return None
    try:
        return Record.from_dict(data)
    except (TypeError, ValueError) as exc:
        warn(f"{where}: skipped a record that does not fit the schema ({exc})")
        return None


def _problem(data: dict) -> str | None:
    return missing_fields(data, Record, Setup) or wrong_value(data, Record, Machine, Software)
