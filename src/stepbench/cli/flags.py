"""The flags made from the declarations: the setups' axes (axes.AXES) and the commands' settings
(stepbench.settings: each a dataclass field with its metadata). `run` and `tune` take the same
flag for the same thing, declared once."""

from __future__ import annotations

from stepbench.axes import AXES, Axis
from stepbench.settings import GROUPS, RUN, SEARCHED, Setting, declared


def add_axis_flags(parser, command: str) -> None:
    """One flag per axis: `run` takes a comma list for a matrix axis and one value for the rest;
    `tune` a comma list for each axis it searches (narrowing the search) and one value for the
    axes it holds fixed."""
    for a in AXES:
        if a.name == "device" or (command != RUN and a.tune is None):
            continue
        many = a.many if command == RUN else a.tune in SEARCHED
        kwargs = {"dest": a.key, "default": None, "help": _help(a, command, many)}
        if not many and a.kind in (int, float):
            kwargs["type"] = a.kind
        if not many and a.choices:
            kwargs["choices"] = a.choices
        if not a.split:
            kwargs["action"] = "append"     # --param a=1,2 --param b=3 (run and tune alike)
        parser.add_argument(*a.flags, **kwargs)


def _help(a: Axis, command: str, many: bool) -> str:
    if command != RUN and many:
        return f"{a.help}: the values to search (default: every value this machine runs)"
    if a.default is None:
        return a.help
    if isinstance(a.default, dict):
        cuda, cpu = (_text(a, a.default_for(d), many) for d in ("cuda", "cpu"))
        return f"{a.help} (default {cuda} on a GPU, {cpu} on the CPU)"
    return f"{a.help} (default {_text(a, a.default_for('cuda'), many)})"


def _text(a: Axis, value, many: bool) -> str:
    values = value if isinstance(value, tuple) else (value,)
    if not many:
        values = values[:1]
    return ",".join(("on" if v else "off") if a.kind is bool else str(v) for v in values)


def add_settings(parser, settings: type) -> None:
    """One flag per setting `settings` (a settings class: RunSettings, TuneSettings) declares:
    those of no group first (`settings.flags_first` before the rest), then each group's
    (GROUPS) in an argparse group of its own."""
    command = settings.command
    first = getattr(settings, "flags_first", ())
    every = sorted(declared(settings), key=lambda s: s.dest not in first)
    for s in every:
        if s.group is None:
            add_setting(parser, s)
    for name, group in GROUPS.items():
        members = [s for s in every if s.group == name]
        if members:
            target = parser.add_argument_group(group.title, group.describe(command) or None)
            for s in members:
                add_setting(target, s)


def add_setting(parser, s: Setting) -> None:
    """The flag of one declared setting (every flag's default is None: not given)."""
    kwargs = {"dest": s.dest, "default": None, "help": s.help}
    if s.switch:
        kwargs["action"] = "store_true"
    else:
        if s.many:
            kwargs["action"] = "append"
        elif not s.choices:     # choices are checked as given (an Enum's values are strings)
            kwargs["type"] = s.kind
        if s.default not in (None, ()) and "(default" not in s.help:
            kwargs["help"] = f"{s.help} (default {s.default})"
    if s.metavar:
        kwargs["metavar"] = s.metavar
    if s.choices:
        kwargs["choices"] = s.choices
    if s.required:
        kwargs["required"] = True
    parser.add_argument(s.flag_name, **{**kwargs, **s.argparse})


__all__ = ["add_axis_flags", "add_settings", "add_setting"]
