"""The flags that come from tables: the setups' axes (axes.AXES) and the commands' options
(settings.OPTIONS). `run` and `tune` take the same flag for the same thing, declared here once."""

from __future__ import annotations

from pathlib import Path

from stepbench.axes import AXES, Axis
from stepbench.settings import CLUSTER_KEYS, OPTIONS, RUN, SEARCHED, option


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
        if many and not a.split:
            kwargs["action"] = "append"     # --param a=1,2 --param b=3
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


def add_option(parser, key: str, command: str = RUN, **extra) -> None:
    """The flag of settings.OPTIONS' `key` for `command`."""
    o = option(key, command)
    default = o.defaults[command]
    kwargs = {"dest": o.key, "default": None, "help": o.help}
    if o.kind is bool:
        kwargs["action"] = "store_true"
    else:
        kwargs["type"] = o.kind
        if default is not None and "(default" not in o.help:
            kwargs["help"] = f"{o.help} (default {default})"
    if o.metavar:
        kwargs["metavar"] = o.metavar
    if o.choices:
        kwargs["choices"] = o.choices
    parser.add_argument(o.flag, **{**kwargs, **extra})


def add_options(parser, command: str, keys: tuple[str, ...]) -> None:
    for key in keys:
        add_option(parser, key, command)


def add_cluster_options(parser, command: str) -> None:
    """--ray, --slurm and --gpu-type, in a group of their own."""
    group = parser.add_argument_group(
        "a cluster: Ray (needs the ray extra: pip install 'stepbench[ray]'; docs/ray.md) or Slurm "
        "(the slurm extra; docs/slurm.md)",
        "Each setup runs as a job of the cluster, which chooses its node and GPUs; records carry "
        "the job and node. " + ("--gpus N: at most N of the cluster's GPUs at once (default: all "
                                "of them)." if command == RUN else
                                "Probes run one at a time, on one GPU."))
    for key in CLUSTER_KEYS:
        # --slurm alone: the cluster's default partition.
        add_option(group, key, command, **({"nargs": "?", "const": ""} if key == "slurm" else {}))


def option_keys(command: str, group: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The keys of `command`'s options outside `group` (declared in a group of their own)."""
    return tuple(o.key for o in OPTIONS if command in o.defaults and o.key not in group)


__all__ = ["add_axis_flags", "add_option", "add_options", "add_cluster_options", "option_keys",
           "Path"]
