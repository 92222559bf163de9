"""Plan files: a matrix of setups written down, `stepbench run --plan study.toml`.

```toml
model = "llama-tiny"
device = "cpu"
steps = 2
warmup = 1
[axes]
modes = ["eager"]
attn = ["sdpa", "eager"]
batch = [1, 2]
```

A plan holds what the flags of `run` hold, under the same names (`compile-mode` or
`compile_mode`): settings at the top, axes (lists, or one value) under [axes] or at the top. It
expands to exactly the setups the same flags give, because it is turned into the flags' own
values and goes through the same checks; a flag given beside the plan overrides it. An error
about a value the plan gave names the plan and the key as the plan spells it (settings.Origin).
Read with the standard library's tomllib.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from stepbench.axes import AXES as REGISTRY
from stepbench.errors import UserError
from stepbench.settings import RunSettings, declared, read_file


def _axes() -> dict[str, object]:
    """Plan key (and alias) -> the Axis of a matrix axis: a list, or one value."""
    return {key: a for a in REGISTRY if a.many for key in (a.key, *a.aliases)}


def _settings(settings: type = RunSettings) -> dict[str, type]:
    """Plan key -> the type of a setting: the setups' one-value fields, and the settings a plan
    may hold (declared with plan=True; a path or a choice is written as a string)."""
    types = {key: a.kind for a in REGISTRY if not a.many for key in (a.key, *a.aliases)}
    types.update({s.dest: s.kind if s.kind in (int, float, bool) else str
                  for s in declared(settings) if s.plan})
    return types


@dataclass(frozen=True)
class Plan:
    """A plan file read: its values as `run`'s settings (axes as comma lists, as the flags give
    them), and how the file spells each key, for the errors about its values."""

    path: Path
    values: dict = field(default_factory=dict)      # settings key -> value
    spelled: dict = field(default_factory=dict)     # settings key -> the key as written


def read_plan(path: Path, command: type = RunSettings) -> Plan:
    """The plan file at `path`, its keys and value types checked (its values are checked with
    the flags', by `command`.build: settings.RunSettings)."""
    path = Path(path)
    try:
        data = tomllib.loads(read_file(path, "plan", "pass an existing TOML file to --plan"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"plan {path} is not valid TOML ({exc}); fix the file") from None
    AXES, SETTINGS = _axes(), _settings(command)
    axes = data.pop("axes", {})
    if not isinstance(axes, dict):
        raise UserError(f"plan {path}: 'axes' must be a table ([axes]); fix the file")
    settings, spelled = {}, {}
    for where, table in (("top", data), ("axes", axes)):
        for raw_key, value in table.items():
            key = raw_key.replace("-", "_")
            key = AXES[key].key if key in AXES else key
            if key in settings:
                raise UserError(f"plan {path}: {raw_key!r} is given twice; keep one")
            spelled[key] = raw_key
            if key in AXES:
                settings[key] = _axis(path, raw_key, value, AXES[key].split)
            elif key in SETTINGS and where == "top":
                settings[key] = _setting(path, raw_key, value, SETTINGS[key])
            elif key in SETTINGS:
                raise UserError(f"plan {path}: {raw_key!r} is a setting, not an axis; move it "
                                "above [axes]")
            else:
                valid = ", ".join(dict.fromkeys(k for k in [*AXES, *SETTINGS]
                                                if k == getattr(AXES.get(k), "key", k)))
                raise UserError(f"plan {path}: unknown key {raw_key!r}; choose one of: {valid}",
                                kind="unknown_value")
    if "model" in settings and not Path(settings["model"]).is_absolute():
        beside = path.parent / settings["model"]
        if beside.exists():     # a config path is read relative to the plan that names it
            settings["model"] = str(beside)
    return Plan(path, settings, spelled)


def _axis(path: Path, key: str, value, split: bool = True) -> str | list[str]:
    """A plan's axis as its flag takes it: a comma list, or (an axis whose flag is repeated,
    `split` False: param = ["width=8,16", "depth=2"]) one string per item, as the flags give."""
    values = value if isinstance(value, list) else [value]
    if not split:
        if not values or not all(isinstance(v, str) for v in values):
            raise UserError(f"plan {path}: {key} must be a non-empty list of \"NAME=V1,V2\" "
                            f"strings, got {value!r}", kind="bad_value")
        return [str(v) for v in values]
    if not values or not all(isinstance(v, (str, int, bool)) and not isinstance(v, float)
                             for v in values):
        raise UserError(f"plan {path}: {key} must be a non-empty list of names or integers, "
                        f"got {value!r}", kind="bad_value")
    return ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)


def _setting(path: Path, key: str, value, kind):
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        what = {str: "a string", int: "an integer", float: "a number",
                bool: "true or false"}[kind]
        raise UserError(f"plan {path}: {key} must be {what}, got {value!r}", kind="bad_value")
    return value
