"""Whether a results file's record holds values its fields can take (record.py reads every
line through `wrong_value`): a value of the wrong type or an impossible one (a time that is not
a number, NaN, negative) makes the line one that is skipped with a warning, never a traceback
further on. What fits comes from the dataclasses' field types and the axis registry."""

from __future__ import annotations

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
            return f"{prefix}{name} is {_shown(values[name])}, not {checks[name][1]}"
    return None


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# A number that counts time, memory or a rate is never negative.
_NON_NEGATIVE = ("_ms", "_s", "_gb", "_per_s")


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
        if name.endswith(_NON_NEGATIVE) or name == "step_times_ms":
            fits = _non_negative(fits)
            wanted = wanted.replace("a number", "a number >= 0").replace("of numbers",
                                                                     "of numbers >= 0")
        out[name] = (fits, wanted)
    out.update({name: check for name, check in _SHAPES.items() if name in out})
    return out


def _blocks_fit(value) -> bool:
    return value is None or (isinstance(value, dict) and type(value.get("count")) is int
                             and value["count"] >= 0 and isinstance(value.get("class", ""), str))


# Objects whose contents a reader goes by (tune reads `blocks.count`): their shape checked too.
_SHAPES = {"blocks": (_blocks_fit, 'an object {"count": an integer >= 0, "class": a string} '
                                   "or null")}


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
            item = functools.partial(_numbers, finite=finite, each=item)
            return item, f"a list of {wanted.removeprefix('a ').removeprefix('an ')}s"
        return (lambda v: isinstance(v, list) and all(item(x) for x in v),
                f"a list of {wanted.removeprefix('a ').removeprefix('an ')}s")
    if kind is type(None):
        return (lambda v: v is None), "null"
    if kind is float:
        if not finite:
            return (lambda v: type(v) in (float, int)), "a number"
        return (lambda v: type(v) is int or (type(v) is float and math.isfinite(v))), "a number"
    if kind is int:
        return (lambda v: type(v) is int), "an integer"
    if kind is bool:
        return (lambda v: isinstance(v, bool)), "true or false"
    if kind is str:
        return (lambda v: isinstance(v, str)), "a string"
    return (lambda v: isinstance(v, dict)), "an object"


def _numbers(v, finite: bool, each) -> bool:
    """Whether `v` is a list of numbers (finite ones with `finite`): `each` number's check, as
    C loops over the list rather than a call per value."""
    if not isinstance(v, list) or not all(map(_NUMBER_TYPES.__contains__, map(type, v))):
        return False
    try:
        return not finite or all(map(math.isfinite, v))
    except OverflowError:           # an integer too large for a float is still an integer
        return all(map(each, v))


_NUMBER_TYPES = frozenset((int, float))


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
    one); None for a results file, an empty file or none."""
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            head = [line.strip() for line in f.read(_HEAD_BYTES).splitlines()[:20]]
    except OSError:
        return None                 # check_writable says why it cannot be used
    for line in filter(None, head):
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
    there = next((p for p in path.parents if p.exists()), None)
    if there is not None and not there.is_dir():
        return f"{path} cannot be made: {there} is a file"
    problem = not_results(path)
    return f"{path} is not a stepbench results file ({problem})" if problem else None


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
