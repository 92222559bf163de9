"""What a prediction scales from: each measured setup's step on its GPU, split into kernel
classes (the record's `profile`, or its stored trace read again by measure/kernels.py).

Repeats of a setup on one GPU are combined: the median step time and class times over the
processes, the largest peak memory.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from stepbench.errors import UserError
from stepbench.measure import kernels
from stepbench.record import Record
from stepbench.record_files import load

def profile_hint(where: str = "") -> str:
    """How to get what predict scales from (`where`: " on a GPU", where the records say
    that is what was missing)."""
    return (f"measure a step's kernels with `stepbench run --profile DIR`{where} (one more "
            "profiled step per setup), then predict from that results file")


@dataclass(frozen=True)
class Measured:
    """One setup on its source GPU (repeats combined)."""

    setup: str                  # the setup's name ("compile+sdpa")
    model: str
    batch: int
    seq: int
    dtype: str
    gpu: str                    # the source GPU, as the driver names it
    torch: str | None
    status: str                 # ok, or the first repeat's failure (oom, ...)
    step_ms: float | None       # median over the processes of their mean step time
    tokens_per_step: float | None
    peak_memory_gb: float | None     # max_memory_allocated (the report's peak)
    peak_reserved_gb: float | None   # what the allocator held: what the card must have
    classes_ms: dict | None          # kernel class -> ms (measure/kernels.py)
    busy_ms: float | None            # the profiled step's kernel busy time
    kernel_floor_ms: float | None    # the shortest kernel of the profiled step
    class_kernels: dict | None       # kernel class -> how many kernels
    repeats: int
    memory_kernels: list | None = None   # memory-bound kernels by duration (measure/kernels.py)
    gemms: list | None = None            # the GEMMs by shape, where recorded
    # The source GPU's matmul rate in the setup's dtype as measured in its run (the record's
    # peak_tflops_measured, median over the processes), TFLOP/s; None without one.
    matmul_tflops_measured: float | None = None
    mode: str | None = None              # eager or compile (the setup's mode axis)

    @property
    def idle_ms(self) -> float | None:
        """How long a timed step's GPU waited: the step time minus the kernels' busy time."""
        if self.step_ms is None or self.busy_ms is None:
            return None
        return max(self.step_ms - self.busy_ms, 0.0)


def trace_path(record: Record, results: Path, traces: list[Path]) -> Path | None:
    """The record's stored trace: where it says, else by its file name in `traces`, in the
    folder beside the results file (`STEM-traces`, `STEM-profiles`), or beside it."""
    stored = (record.profile or {}).get("trace")
    if not stored:
        return None
    if Path(stored).is_file():
        return Path(stored)
    name = Path(stored).name
    folders = [*traces, results.with_name(results.stem + "-traces"),
               results.with_name(results.stem + "-profiles"), results.parent]
    for folder in folders:
        if (folder / name).is_file():
            return folder / name
    return None


def split_of(record: Record, results: Path, traces: list[Path]) -> dict | None:
    """The record's kernel classes: from the record, else from its stored trace."""
    profile = record.profile or {}
    if profile.get("classes_ms"):
        return profile
    path = trace_path(record, results, traces)
    return kernels.split_trace(path) or None if path else None


def measured(paths: list[str], traces: list[str] | None = None, warn=lambda text: None,
             keep=None) -> list[Measured]:
    """Every setup x GPU of the results files, combined over repeats, in file order; `keep`:
    a function of a file's records that returns those to use (the report's filters)."""
    trace_dirs = [Path(t) for t in traces or []]
    groups: dict[tuple, list[tuple[Record, dict | None]]] = {}
    for arg in paths:
        records = load([arg], warn)
        for record in keep(records) if keep else records:
            results = _results_of(record, arg)
            split = split_of(record, results, trace_dirs) if record.ok else None
            key = (record.setup.key(), record.machine.gpu or "cpu")
            groups.setdefault(key, []).append((record, split))
    return [_combine(items) for items in groups.values()]


def _results_of(record: Record, arg: str) -> Path:
    path = Path(arg)
    if path.is_dir():
        # A folder of results files: the trace folders sit beside each file; any one works
        # for the lookup by name.
        files = sorted(path.glob("*.jsonl"))
        return files[0] if files else path / "results.jsonl"
    return path


def _combine(items) -> Measured:
    records = [r for r, _ in items]
    ok = [(r, s) for r, s in items if r.ok]
    first = records[0]
    setup = first.setup
    splits = [s for _, s in ok if s and s.get("classes_ms")]
    classes = counts = busy = floor = None
    # Bins and shapes: the first profiled process's (they describe the kernels, not their sum).
    memory_bins = next((s["memory_kernels"] for s in splits if s.get("memory_kernels")), None)
    gemms = next((s["gemms"] for s in splits if s.get("gemms")), None)
    if splits:
        classes = _median_of([s["classes_ms"] for s in splits])
        counts = _median_of([s.get("class_kernels") or {} for s in splits])
        busy_ms = [s["busy_s"] * 1000 for s in splits if s.get("busy_s") is not None]
        busy = statistics.median(busy_ms) if busy_ms else None
        floors = [s["shortest_kernel_ms"] for s in splits if s.get("shortest_kernel_ms")]
        floor = min(floors) if floors else None
    step = statistics.median(r.step_ms for r, _ in ok) if ok else None
    per_step = [r.tokens_per_s * r.step_ms / 1000 for r, _ in ok if r.tokens_per_s]
    tokens = statistics.median(per_step) if per_step else None
    peaks = [r.peak_memory_gb for r in records if r.peak_memory_gb is not None]
    reserved = [r.peak_reserved_gb for r in records if r.peak_reserved_gb is not None]
    rates = [r.peak_tflops_measured for r in records if r.peak_tflops_measured]
    return Measured(
        setup=setup.name, model=setup.model, batch=setup.batch, seq=setup.seq,
        dtype=setup.dtype, gpu=first.machine.gpu or "cpu", torch=first.software.torch,
        status="ok" if ok else first.status, step_ms=step, tokens_per_step=tokens,
        peak_memory_gb=max(peaks) if peaks else None,
        peak_reserved_gb=max(reserved) if reserved else None,
        classes_ms=classes, busy_ms=busy, kernel_floor_ms=floor, class_kernels=counts,
        repeats=len(records), memory_kernels=memory_bins, gemms=gemms,
        matmul_tflops_measured=statistics.median(rates) if rates else None, mode=setup.mode)


def _median_of(dicts: list[dict]) -> dict:
    """Each key's median over `dicts` (0 where one lacks it); a null value is not measured."""
    names = sorted({k for d in dicts for k in d if d[k] is not None})
    return {k: statistics.median(v for d in dicts if (v := d.get(k, 0)) is not None)
            for k in names}


def require_profiles(steps: list[Measured], paths: list[str]) -> list[Measured]:
    """The steps a prediction can scale from; none is a UserError saying how to get one."""
    usable = [m for m in steps if m.classes_ms]
    if not usable:
        where = ", ".join(paths)
        ok = [m for m in steps if m.status == "ok"]
        what, hint = ("no setup ran ok" if not ok else "no record holds a profile of its "
                      "kernels"), profile_hint()
        if ok and all(m.gpu == "cpu" for m in ok):
            # `run --profile` on a CPU profiles a step too, but one without GPU kernels to scale.
            what = "its records ran on the CPU, whose profiled step has no GPU kernels to scale"
            hint = profile_hint(" on a GPU")
        raise UserError(f"{where}: {what}; {hint}")
    return usable
