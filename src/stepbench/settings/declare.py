"""How a setting is declared: once, as a field of a command's settings dataclass whose metadata
says everything else needs (as torchtitan's JobConfig declares its options as dataclass fields).
From the declarations come `run`'s and `tune`'s flags (cli/flags.py), the plan file's keys
(plan.py), the checks and conversions of `build` (`read` below), which settings choose a backend
(`chosen_backends`, `check_backends`) and docs/cli.md's flag table (cli/doc.py).

    timeout_s: float | None = setting(None, key="timeout", least=0, unit="seconds", plan=True,
                                      help="seconds per setup before its process group is killed")

The type comes from the field's annotation (Optional unwrapped): bool is a switch, tuple[str,
...] a repeatable flag, an Enum (choices.py) takes its values, int, float, str and Path a value.
A group of settings of its own (SSH hosts, rentals, the batch search) is a `part`: a dataclass
whose fields are declared the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping

from stepbench.errors import UserError, check_number

RUN, TUNE = "run", "tune"
SETTING, PART = "stepbench.setting", "stepbench.part"


@dataclass(frozen=True)
class Backend:
    """Where the setups run, as a setting chooses it (execute/ maps the name to its executor)."""

    name: str                   # ray, slurm, hosts, rent
    title: str = ""             # how a message names it: "Ray"
    usage: str = ""             # how a message says to add it: "--ray ADDRESS"
    cluster: bool = False       # a cluster engine: it places the setups; one, and on its own


@dataclass(frozen=True)
class Group:
    """An argparse group of flags: its title, and its description (per command, or one)."""

    title: str
    description: str | Mapping[str, str] = ""

    def describe(self, command: str) -> str:
        d = self.description
        return d.get(command, "") if isinstance(d, Mapping) else d


@dataclass(frozen=True)
class Setting:
    """One setting: its flag, plan key, check, conversion and help. `default` is the flag's
    value when none is given; `convert` turns a checked value into the field's."""

    help: str
    default: Any = None
    key: str = ""               # settings key: flag dest, plan key; default: the field's name
    flag: str = ""              # default: "--" and the key with dashes
    plan: bool = False          # a plan file may hold it
    least: float | None = None  # numbers: the smallest value (floats: above it)
    unit: str = ""              # how the error about `least` names the unit: "seconds"
    metavar: str | None = None
    choices: tuple = ()         # default: an Enum's values
    check: Callable[[Any, str], None] | None = None     # (value, its name) -> raises UserError
    convert: Callable[[Any], Any] | None = None         # the checked value -> the field's
    empty_is_default: bool = False  # an empty or zero value means the default
    required: bool = False      # the flag must be given (convert sees None otherwise)
    backend: Backend | None = None  # given, this setting chooses where the setups run
    needs: tuple[str, ...] = ()     # backends (by name) one of which it needs
    needs_why: str = ""             # what it does, for that error: "chooses a GPU type of a cluster"
    group: str | None = None        # the argparse group (GROUPS) it is shown in
    argparse: Mapping = field(default_factory=dict)     # more add_argument keywords (nargs)
    doc: str = ""               # docs/cli.md's meaning, Markdown; "": the help
    doc_default: str | None = None  # docs/cli.md's default; None: the default, formatted
    per: Mapping[str, Mapping] = field(default_factory=dict)   # command -> fields it changes
    kind: type | None = None    # default: the annotation's type
    # Filled in by `declared`:
    name: str = ""              # the field
    path: tuple[str, ...] = ()  # attributes from the command's settings to the value
    many: bool = False          # a repeatable flag: a tuple of its values

    @property
    def dest(self) -> str:
        return self.key or self.name

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.dest.replace("_", "-")

    @property
    def switch(self) -> bool:
        return self.kind is bool

    def checked(self, value, where: str | None = None):
        """`value` (a flag's, a plan's or the default) checked and converted to the field's
        value; `where`: how an error names it (a plan's key), else its flag."""
        name = where or self.flag_name
        if value is None and not self.required:
            return None
        if value is not None and self.choices and value not in self.choices:
            raise UserError(f"{name} takes one of {', '.join(self.choices)}, got {value!r}",
                            kind="unknown_value")
        if value is not None and self.kind in (int, float) and not self.many:
            check_number(value, name, self.kind, self.least, self.unit)
        if self.check is not None and value is not None:
            self.check(value, name)
        value = _coerce(self, value)
        return self.convert(value) if self.convert is not None else value


def _coerce(s: Setting, value):
    if value is None:
        return None
    if s.many:
        return tuple(value)
    if isinstance(s.kind, type) and issubclass(s.kind, Enum):
        return s.kind(value)
    if s.kind is Path:
        return Path(value)
    if s.kind is bool:
        return bool(value)
    return value


@dataclass(frozen=True)
class Part:
    """A field holding a group of settings, a dataclass declared the same way (Remote, Rent,
    MaxBatchOptions). With a `switch`, the part is None unless the switch is given, and its
    settings are refused without it ("--probe-steps sets up the batch search; add ...")."""

    switch: Setting | None = None
    purpose: str = ""           # what its settings do, for that error
    group: str | None = None    # the argparse group of its settings (and switch)


def setting(default=None, help: str = "", **meta) -> Any:
    """A dataclass field declaring a setting (Setting's fields as keywords). The field's own
    default is `default` converted, so a settings value made without `build` holds it too."""
    s = Setting(help=help, default=default, **meta)
    value = s.convert(default) if s.convert is not None and default is not None else default
    return field(default=value, metadata={SETTING: s})


def part(cls: type, switch=None, purpose: str = "", group: str | None = None) -> Any:
    """A dataclass field holding the settings of `cls` (None while a `switch` is off)."""
    if isinstance(switch, dataclasses.Field):
        switch = switch.metadata[SETTING]
    meta = {PART: Part(switch=switch, purpose=purpose, group=group)}
    if switch is not None:
        return field(default=None, metadata=meta)
    return field(default_factory=cls, metadata=meta)


def _kind(hint) -> tuple[type, bool]:
    """(the type a setting takes, whether it is repeatable) from a field's annotation."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        [hint] = [a for a in typing.get_args(hint) if a is not type(None)]
        origin = typing.get_origin(hint)
    if origin is tuple:
        return typing.get_args(hint)[0], True
    return hint, False


def _part_class(hint) -> type:
    return _kind(hint)[0]


@functools.lru_cache(maxsize=None)
def declared(cls: type, command: str | None = None) -> tuple[Setting, ...]:
    """Every setting of `cls` (parts' settings included, a part's switch before them), in
    declaration order, as `command` (default: cls.command) takes it."""
    command = command or getattr(cls, "command", None)
    return tuple(_walk(cls, command, (), None))


def _walk(cls: type, command, prefix: tuple, group):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if SETTING in f.metadata:
            yield _resolve(f.metadata[SETTING], f.name, hints[f.name], prefix, command, group)
        elif PART in f.metadata:
            p = f.metadata[PART]
            if p.switch is not None:
                yield _resolve(p.switch, f.name, bool, prefix + (f.name,), command,
                               p.group or group, switch=True)
            yield from _walk(_part_class(hints[f.name]), command, prefix + (f.name,),
                             p.group or group)


def _resolve(s: Setting, name: str, hint, prefix, command, group, switch=False) -> Setting:
    kind, many = (bool, False) if switch else _kind(hint)
    s = dataclasses.replace(s, **s.per.get(command, {}))
    kind = s.kind or kind
    choices = s.choices or (tuple(m.value for m in kind)
                            if isinstance(kind, type) and issubclass(kind, Enum) else ())
    return dataclasses.replace(s, name=name, path=prefix if switch else prefix + (name,),
                               kind=kind, many=many, choices=choices,
                               group=s.group or group)


def read(cls: type, given: Mapping[str, Any], origin, command: str | None = None) -> dict:
    """The fields of `cls` declared as settings (and parts), from `given` (settings key ->
    value; None or absent: the default), each checked; an error names a value as it was given
    (`origin`: settings.origin.Origin)."""
    command = command or getattr(cls, "command", None)
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if SETTING in f.metadata:
            s = _resolve(f.metadata[SETTING], f.name, hints[f.name], (), command, None)
            values[f.name] = value_of(s, given, origin)
        elif PART in f.metadata:
            values[f.name] = _read_part(_part_class(hints[f.name]), f.metadata[PART], f.name,
                                        given, origin, command)
    return values


def value_of(s: Setting, given: Mapping[str, Any], origin):
    raw = given.get(s.dest)
    if raw is None or (s.empty_is_default and not raw):
        raw = s.default
    with origin.checking(s.dest):
        return s.checked(raw, origin.where(s.dest))


def _read_part(cls: type, p: Part, name: str, given, origin, command):
    values = read(cls, given, origin, command)
    if p.switch is None:
        made = cls(**values)
    else:
        switch = _resolve(p.switch, name, bool, (), command, None, switch=True)
        if not value_of(switch, given, origin):
            named = [s.dest for s in declared(cls, command) if given.get(s.dest) is not None]
            if named:
                key = named[0]
                flag = origin.name(switch.dest, key)
                flag += "" if flag.startswith("--") else " = true"
                raise origin.error(key, f"{origin.name(key)} {p.purpose}; add {flag} (or drop "
                                        "it)")
            return None
        made = cls(**values)
    return made.checked() if hasattr(made, "checked") else made


def value_at(settings, s: Setting):
    value = settings
    for name in s.path:
        value = getattr(value, name, None)
    return value


def chosen_backends(settings) -> list[tuple[Setting, Backend]]:
    """The backends `settings` choose, with the first setting that chose each, in declaration
    order."""
    found, seen = [], set()
    for s in declared(type(settings)):
        if s.backend is not None and s.backend.name not in seen \
                and value_at(settings, s) not in (None, ()):
            found.append((s, s.backend))
            seen.add(s.backend.name)
    return found


def check_backends(settings) -> None:
    """The backends chosen go together: at most one cluster engine, and on its own; a setting
    that needs one of some backends has one."""
    everything = declared(type(settings))
    chosen = chosen_backends(settings)
    clusters = [s for s, b in chosen if b.cluster]
    if len(clusters) > 1:
        raise UserError(f"{_and([s.flag_name for s in clusters])} each name the cluster that "
                        "runs the setups; pass one of them", kind="conflict")
    names = {b.name for _, b in chosen}
    for s in everything:
        if s.needs and _set(settings, s) and not names & set(s.needs):
            usages = [b.usage for b in dict.fromkeys(
                x.backend for x in everything if x.backend and x.backend.name in s.needs)]
            raise UserError(f"{s.flag_name} {s.needs_why}; add {' or '.join(usages)} (or drop "
                            f"{s.flag_name})", kind="conflict")
    if clusters and len(chosen) > 1:
        flag, engine = clusters[0].flag_name, next(b for _, b in chosen if b.cluster)
        others = [s.flag_name for s in everything if s.backend and not s.backend.cluster]
        raise UserError(f"{flag} runs the setups on a {engine.title} cluster; drop "
                        f"{_and(others)} (or {flag})", kind="conflict")


def _set(settings, s: Setting) -> bool:
    """Whether setting `s` holds a value of its own: given, not its default (a default means
    nothing without the backend it is for)."""
    value = value_at(settings, s)
    return value not in (None, ()) and value != s.checked(s.default)


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def between(least: int, most: int) -> Callable[[Any, str], None]:
    """A check: an integer from `least` to `most`."""
    def check(value, name: str) -> None:
        if not least <= value <= most:
            raise UserError(f"{name} must be from {least} to {most}, got {value}", kind="bad_value")
    return check


__all__ = ["RUN", "TUNE", "Backend", "Group", "Setting", "Part", "setting", "part", "declared",
           "read", "value_of", "value_at", "chosen_backends", "check_backends", "between"]
