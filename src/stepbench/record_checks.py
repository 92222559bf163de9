"""Whether a results file's record holds values its fields can take (record.py reads every
line through `wrong_value`): a value of the wrong type or an impossible one (a time that is not
a number, NaN, negative) makes the line one that is skipped with a warning, never a traceback
further on. What fits comes from the dataclasses' field types and the axis registry."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import operator
import types
import typing
from pathlib import Path
from typing import Callable

from stepbench.axes import AXES
from stepbench.errors import INT_MOST


def wrong_value(data: dict, record, machine, software) -> str | None:
    """What is wrong with a value of a record's fields (a wrong type, a number that is not
    finite, a negative time, memory or rate), naming the first such field; None when every
    value fits. `record`, `machine`, `software`: the dataclasses of record.py, whose field
    types say what fits. Fields the record lacks take their defaults and are not checked."""
    setup, machine_data = data["setup"], data.get("machine")
    if not all(isinstance(setup.get(k), str) and setup.get(k) for k in ("model", "mode", "attn")):
        return "no setup model, mode and attn"
    if not isinstance(machine_data, dict) or not machine_data.get("gpu"):
        return "no machine.gpu"
    if not isinstance(data.get("status"), str):
        return "no status"
    if data["status"] not in STATUSES:
        return _why("status", data["status"], "one of " + ", ".join(STATUSES))
    parts = ((data, _checks(record), ""), (data["setup"], _setup_checks(), "setup."),
             (data.get("machine"), _checks(machine), "machine."),
             (data.get("software") or {}, _checks(software), "software."))
    for values, checks, prefix in parts:
        # The fields the record has (a set, quicker than asking of each field it may have);
        # where some are wrong, the first in the fields' order is named.
        wrong = {name for name in checks.keys() & values.keys()
                 if not checks[name][0](values[name])}
        if wrong:
            name = next(n for n in checks if n in wrong)
            return _why(f"{prefix}{name}", values[name], checks[name][1])
    for name, fits in _object_checks().items():
        if data.get(name) is not None and not fits(data[name]):
            return _misfit(_OBJECTS[name], data[name], name)
    return None


def _why(name: str, value, wanted: str) -> str:
    if type(value) in (int, float) and math.isfinite(value) and (
            abs(value) >= _LARGEST or (type(value) is int and abs(value) > INT_MOST)):
        return f"{name} is {_shown(value)}, larger than any measurement"
    return f"{name} is {_shown(value)}, not {wanted}"


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# No measurement holds a number this large (a step's FLOPs are 1e13 to 1e19): one that does is
# damage, and would overflow the report's arithmetic (seconds to milliseconds, ceilings).
_LARGEST = 1e30

# What a setup's process can have ended as (docs/cli.md, "Statuses").
STATUSES = ("ok", "oom", "timeout", "crashed", "error", "unsupported")

# A step takes time: what a step's time is divided into (tokens per second) is above 0.
_POSITIVE = ("step_ms", "step_ms_median")
# A number that counts time, memory or a rate is never negative.
_NON_NEGATIVE = ("_ms", "_s", "_gb", "_per_s")
# ... except a difference of two clocks: the host's lead (hostlead.py) of a host-bound step is
# zero within the clocks' offset, and measured a hair below it as often as above (-0.03 ms on
# the H200's eager+sdpa).
_SIGNED = frozenset(("host_lead_ms", "host_lead_steps_ms"))


@functools.cache
def _checks(cls) -> dict[str, tuple[Callable[[object], bool], str]]:
    """{field: (does a JSON value fit it, what it wants)} of dataclass `cls`, from its types
    (made once: a report reads thousands of records)."""
    out = {}
    for name, kind in typing.get_type_hints(cls).items():
        if name == "setup":
            continue
        # A diverged run's loss is NaN or infinite: a measurement, not damage.
        fits, wanted = _check_of(kind, finite=not name.startswith("loss"))
        if name in _POSITIVE:
            fits = _positive(fits)
            wanted = wanted.replace("a number", "a number > 0")
        elif name == "repeat" or (name not in _SIGNED and name.endswith(_NON_NEGATIVE)):
            fits, wanted = _non_negative_check(fits, wanted)
        out[name] = (fits, wanted)
    out.update({name: check for name, check in _SHAPES.items() if name in out})
    return out


def _blocks_fit(value) -> bool:
    return value is None or (isinstance(value, dict) and type(value.get("count")) is int
                             and value["count"] >= 0 and isinstance(value.get("class", ""), str))


# Objects whose contents a reader goes by (tune reads `blocks.count`): their shape checked too.
_SHAPES = {"blocks": (_blocks_fit, 'an object {"count": an integer >= 0, "class": a string} '
                                   "or null")}


# The objects a record holds, by what their readers (report/, predict/, tune) go by: {key: a
# type, a nested shape, [a shape] for a list of them, or (shapes...) for a list of that many}.
# A value that does not fit makes the record a skipped line, as a top-level field's does; a key
# not named here, or null, is not checked (readers take a measurement as absent).
_CLOCKS = {"sm_clock_mhz": int, "mem_clock_mhz": int, "temperature_c": int, "power_w": float,
           "energy_mj": int, "load_1m": float, "throttle_reasons": list[str]}
_RANK = {"rank": int, "local_rank": int, "node": int, "hostname": str, "gpu": str,
         "step_ms": float, "step_ms_median": float, "step_times_ms": list[float],
         "timed_wall_s": float, "host_lead_ms": float, "peak_memory_gb": float,
         "peak_reserved_gb": float, "first_step_s": float, "joules_per_step": float,
         "avg_watts": float, "noise_flags": list[str]}
_OBJECTS = {
    "compile": {"graphs": int, "graph_breaks": int, "recompiles": int,
                "recompiles_in_timed": int, "recompile_limit_hits": int, "cache_hits": int,
                "cache_misses": int, "dynamo_s": float, "inductor_s": float, "cache": str,
                "break_reasons": list[str]},
    "telemetry": {"start": _CLOCKS, "end": _CLOCKS, "other_processes": int, "cpus": int,
                  "threads": int, "contention": float, "other_cpu_s": float,
                  "other_cpu_share": float},
    "energy": {"joules_per_step": float, "avg_watts": float, "tokens_per_kwh": float},
    "phases": dict[str, float],
    "threads": {"intra_op": int, "inter_op": int},
    "memory_cap": {"baseline_gb": float, "limit_gb": float, "mechanism": str,
                   "malloc_thresholds_kb": int, "timed_steps_capped": bool},
    "ranks": [_RANK],
    "scaling": {"backend": str, "parallel": str, "wrapping": str, "nnodes": int, "nproc_per_node": int,
                "world_size": int, "efficiency": float, "tokens_per_s_per_gpu": float,
                "peak_memory_gb_max": float, "rank_step_ms_spread": float, "slowest_rank": int,
                "baseline": {"repeat": int, "run_id": str, "started_at": str, "step_ms": float,
                             "tokens_per_s": float}},
    "profile": {"step_s": float, "device_s": float, "busy_s": float, "idle_s": float,
                "span_s": float, "shortest_kernel_ms": float, "kernels": int,
                "class_kernels": dict[str, int], "classes_ms": dict[str, float],
                "matmul_flops": float, "table": str, "trace": str,
                "matmuls": [{"kernel": str, "op": str, "ms": float, "calls": int}]},
    "placement": {"start": str, "concurrent": int, "compile_threads": int,
                  "cuda_visible_devices": str, "gpus": list[int], "server_start_s": float,
                  "slurm": dict},
    "search": {"kind": str, "role": str, "stage": str, "limit_s": float, "began_at": str,
               "start_batch": int, "largest_fit": int, "smallest_oom": int, "chosen": int,
               "margin": float, "capacity_gb": float, "stepped_down_from": list[int],
               "probes": [(int, str, float)]},
    "recipe": {"source": str, "torchtitan": str, "why": str},
}


def _misfit(shape, value, name: str) -> str | None:
    """What in `value` does not fit `shape` (_OBJECTS), naming it by its path
    ("compile.graph_breaks is "x", not an integer"); None when it fits. Null fits anything."""
    if value is None:
        return None
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return _why(name, value, "an object")
        return next(filter(None, (_misfit(shape[k], value[k], f"{name}.{k}") for k in shape
                                  if k in value)), None)
    if isinstance(shape, (list, tuple)):
        if not isinstance(value, list) or (isinstance(shape, tuple) and len(value) != len(shape)):
            return _why(name, value, f"a list of {len(shape)}" if isinstance(shape, tuple)
                        else "a list")
        shapes = shape if isinstance(shape, tuple) else itertools.repeat(shape[0])
        return next(filter(None, (_misfit(s, v, f"{name}[{i}]")
                                  for i, (s, v) in enumerate(zip(shapes, value)))), None)
    if typing.get_origin(shape) is dict:
        if not isinstance(value, dict):
            return _why(name, value, "an object")
        return next(filter(None, (_misfit(typing.get_args(shape)[1], v, f"{name}.{k}")
                                  for k, v in value.items())), None)
    fits, wanted = _leaf_check(shape, name.rpartition(".")[2])
    return None if fits(value) else _why(name, value, wanted)


@functools.cache
def _object_checks() -> dict[str, Callable[[object], bool]]:
    """{object field: whether a value fits its shape}, made once from _OBJECTS: the quick
    test every record takes; `_misfit` says what does not fit, for the few that fail."""
    return {name: _fits_of(shape, name) for name, shape in _OBJECTS.items()}


def _fits_of(shape, key: str) -> Callable[[object], bool]:
    """Whether a value (not null: the caller skips those, as `_misfit` does) fits `shape`."""
    if isinstance(shape, dict):
        by_key = {k: _fits_of(sub, k) for k, sub in shape.items()}
        return lambda v: isinstance(v, dict) and all(
            by_key[k](x) for k in by_key.keys() & v.keys() if (x := v[k]) is not None)
    if isinstance(shape, tuple):
        each = [_fits_of(sub, key) for sub in shape]
        return lambda v: isinstance(v, list) and len(v) == len(each) and all(
            x is None or fits(x) for fits, x in zip(each, v))
    if isinstance(shape, list):
        item = _fits_of(shape[0], key)
        return lambda v: isinstance(v, list) and all(x is None or item(x) for x in v)
    if typing.get_origin(shape) is dict:
        value = _fits_of(typing.get_args(shape)[1], key)
        return lambda v: isinstance(v, dict) and all(x is None or value(x) for x in v.values())
    return _leaf_check(shape, key)[0]


def _non_negative_check(fits, wanted: str) -> tuple[Callable[[object], bool], str]:
    """(fits, wanted) of a time, memory or rate: the same, and never below 0."""
    return _non_negative(fits), wanted.replace("a number", "a number >= 0").replace(
        "an integer", "an integer >= 0").replace(
        "of numbers", "of numbers >= 0")


@functools.cache
def _leaf_check(kind, key: str) -> tuple[Callable[[object], bool], str]:
    fits, wanted = _check_of(kind)
    if key not in _SIGNED and key.endswith(_NON_NEGATIVE):
        if kind is float:       # the common case, without _non_negative's lists
            return (lambda v: _number(v) and v >= 0), "a number >= 0"
        return _non_negative_check(fits, wanted)
    return fits, wanted


@functools.cache
def _setup_checks() -> dict[str, tuple[Callable[[object], bool], str]]:
    out = {}
    for axis in AXES:
        fits, wanted = _check_of(axis.kind | None if axis.optional else axis.kind)
        if axis.kind in (int, float) and axis.least is not None:
            fits = _at_least(fits, axis.least)
            wanted += f" >= {axis.least:g}"
        out[axis.name] = (fits, wanted)
    return out


def _check_of(kind, finite: bool = True) -> tuple[Callable[[object], bool], str]:
    """(fits, wanted) for a type annotation: str, int, float (a finite number unless not
    `finite`), bool, dict, a dataclass (an object), list[X] and unions with None."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        options = [_check_of(k, finite) for k in typing.get_args(kind)]
        wanted = " or ".join(w for _, w in options)
        if len(options) == 2 and type(None) in typing.get_args(kind):
            (fits, _), = [o for k, o in zip(typing.get_args(kind), options)
                          if k is not type(None)]
            return (lambda v: v is None or fits(v)), wanted       # the common case, quickly
        return (lambda v: any(fits(v) for fits, _ in options)), wanted
    if typing.get_origin(kind) is list:
        item, wanted = _check_of(typing.get_args(kind)[0], finite)
        if typing.get_args(kind)[0] is float:     # step times, losses: tens a record
            item = functools.partial(_numbers, finite=finite)
            return item, f"a list of {wanted.removeprefix('a ').removeprefix('an ')}s"
        return (lambda v: isinstance(v, list) and all(item(x) for x in v),
                f"a list of {wanted.removeprefix('a ').removeprefix('an ')}s")
    if kind is type(None):
        return (lambda v: v is None), "null"
    if kind is float:
        if not finite:
            return (lambda v: type(v) in (float, int)), "a number"
        return _number, "a number"
    if kind is int:
        return (lambda v: type(v) is int and -INT_MOST <= v <= INT_MOST), "an integer"
    if kind is bool:
        return (lambda v: isinstance(v, bool)), "true or false"
    if kind is str:
        return (lambda v: isinstance(v, str)), "a string"
    return (lambda v: isinstance(v, dict)), "an object"


def _number(v) -> bool:
    """A finite number below _LARGEST in size; an integer within int64 (what numpy and
    matplotlib take: a larger one is no measurement either)."""
    if type(v) is int:
        return -INT_MOST <= v <= INT_MOST
    return type(v) is float and -_LARGEST < v < _LARGEST


def _numbers(v, finite: bool) -> bool:
    """Whether `v` is a list of numbers (with `finite`: finite, below _LARGEST in size), as C
    loops over the list rather than a call per value (NaN is below nothing)."""
    if not isinstance(v, list) or not all(map(_NUMBER_TYPES.__contains__, map(type, v))):
        return False
    return not finite or (all(map(operator.lt, map(abs, v), itertools.repeat(_LARGEST)))
                          and all(-INT_MOST <= x <= INT_MOST for x in v if type(x) is int))


_NUMBER_TYPES = frozenset((int, float))


def _positive(fits):
    return lambda v: fits(v) and (v is None or v > 0)


def _non_negative(fits):
    def check(v) -> bool:
        if not fits(v):
            return False
        values = v if isinstance(v, list) else [v]
        # x >= 0 of each number (a C loop): NaN fails it.
        return all(map(operator.ge, (x for x in values if isinstance(x, (int, float)))
                       if not all(map(_NUMBER_TYPES.__contains__, map(type, values)))
                       else values, itertools.repeat(0)))
    return check


def _at_least(fits, least: float):
    return lambda v: fits(v) and (v is None or v >= least)


# How much of an existing --out file is read to tell whether it holds records.
_HEAD_BYTES = 256 * 1024


def not_results(path: Path) -> str | None:
    """Why the file at `path` is not a results file to append to: it has content and none of
    its first lines is a stepbench record (a line cut off while a record was written counts as
    one); None for a results file, an empty file (or one of blank lines) or none."""
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            # The first 20 lines that are not blank.
            head = list(itertools.islice(filter(None, map(str.strip,
                                                          f.read(_HEAD_BYTES).splitlines())), 20))
    except OSError:
        return None                 # check_writable says why it cannot be used
    if not head:
        return None                 # blank lines only: as an empty file (the reader skips them)
    for line in head:
        if line.startswith('{"schema":'):
            return None
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and isinstance(data.get("setup"), dict):
            return None
    return "none of its first lines is a record"


def out_problem(path: Path) -> str | None:
    """Why `path` cannot take a run's records, as far as can be told without making it: a
    folder, a path under a file, or a file of something else than records (appending JSON to
    it would spoil both); None otherwise (the run opens it before anything runs)."""
    path = Path(path).expanduser()
    if path.is_dir():
        return f"{path} is a folder"
    if path.exists() and not path.is_file():
        return f"{path} is not a regular file (a pipe or a device)"
    there = next((p for p in path.parents if p.exists()), None)
    if there is not None and not there.is_dir():
        return f"{path} cannot be made: {there} is a file"
    problem = not_results(path)
    return f"{path} is not a stepbench results file ({problem})" if problem else None


def written_over(path: Path) -> str | None:
    """Why a report's, comparison's, prediction's or price file's --out may not be `path` (a
    results file: writing over it would lose its records), or None."""
    if holds_records(path):
        return f"{path} holds stepbench results, which writing there would lose; pass --out a " \
               "new file"
    return None


def holds_records(path: Path) -> bool:
    """Whether `path` is a results file with content: what a report's, comparison's or price
    file's --out never writes over."""
    try:
        return path.is_file() and path.stat().st_size > 0 and not_results(path) is None
    except OSError:
        return False


def overlap(earlier, later) -> bool:
    """Whether record `later` started before `earlier` finished (ISO times in UTC, as run
    writes them): two runs measured the same setup at once. A rerun starts after."""
    return (isinstance(earlier.finished_at, str) and isinstance(later.started_at, str)
            and bool(earlier.finished_at and later.started_at)
            and later.run_id != earlier.run_id and later.started_at < earlier.finished_at)


def missing_fields(data: dict, record_cls, setup_cls) -> str | None:
    """"missing field 'repeat'" (or "missing fields 'repeat', 'setup.model'") for the fields a
    record object lacks that have no default; None when it has them all."""
    missing = _required(record_cls, data, "")
    if isinstance(data.get("setup"), dict):
        missing += _required(setup_cls, data["setup"], "setup.")
    if not missing:
        return None
    return f"missing field{'s' if len(missing) > 1 else ''} " + ", ".join(map(repr, missing))


def _required(cls, data: dict, prefix: str) -> list[str]:
    return [prefix + name for name in _without_default(cls) if name not in data]


@functools.cache
def _without_default(cls) -> tuple[str, ...]:
    """The fields of dataclass `cls` that have no default (read once: a report reads
    thousands of records)."""
    return tuple(f.name for f in dataclasses.fields(cls)
                 if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
