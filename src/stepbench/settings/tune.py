"""`stepbench tune`'s settings: the shared ones (common.py) and its own (the budget, the
objective), declared once each; the axes it searches and those it holds fixed."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from stepbench.axes import AXES
from stepbench.errors import UserError
from stepbench.settings.choices import Device, Objective
from stepbench.settings.common import Common, frozen
from stepbench.settings.declare import TUNE, check_backends, read, setting
from stepbench.settings.origin import Origin, writable_folder
from stepbench.settings.run import axis_value, check_device
from stepbench.setup import TIMEOUT_S

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


@dataclass(frozen=True, kw_only=True)
class TuneSettings(Common):
    """Everything `stepbench tune` was asked for, checked. `values`: the axes it does not
    search, one value each (None where the device decides); `space`: the searched axes the
    flags narrowed, axis name -> values (the others: every value this machine runs)."""

    command: ClassVar[str] = TUNE
    flags_first: ClassVar[tuple[str, ...]] = ("budget", "objective")     # in --help

    values: Mapping[str, Any]
    space: Mapping[str, tuple]
    budget_s: float = setting(None, "time for the whole search: 20m, 90s, 1h30m", key="budget",
                              kind=str, required=True, convert=parse_budget)
    objective: Objective = setting(
        Objective.TOKENS, "tokens: the most tokens/s, the batch grown from --batch; fit: the "
        "fastest setup whose step at --batch fits --memory-limit-gb (default tokens)")

    @classmethod
    def build(cls, flags: Mapping[str, Any]) -> "TuneSettings":
        given = {k: v for k, v in flags.items() if v is not None}
        values, space = {}, {}
        for a in AXES:
            if a.tune in SEARCHED:
                if given.get(a.key) is not None:
                    space[a.name] = a.parse(given[a.key])
            elif a.name != "device":
                values[a.name] = axis_value(a, given.get(a.key), TUNE)
        values["device"] = None
        settings = cls(values=frozen(values), space=frozen(space), **read(cls, given, Origin()))
        settings.check()
        return settings

    def check(self) -> None:
        check_backends(self)
        if self.compile_cache is not None and self.ray is None:
            writable_folder(self.compile_cache, "--compile-cache")
        if self.objective == Objective.FIT and self.values.get("memory_limit_gb") is None:
            raise UserError("--objective fit needs --memory-limit-gb N, the memory the step must "
                            "fit in")

    def resolved(self, device: str) -> "TuneSettings":
        values = dict(self.values, device=str(device))
        for a in AXES:
            if a.name in values and values[a.name] is None and not a.optional:
                default = a.default_for(device)
                values[a.name] = default[0] if isinstance(default, tuple) else default
        check_device({**values, **self.space}, device)
        timeout = self.timeout_s if self.timeout_s is not None else TIMEOUT_S[device]
        return dataclasses.replace(self, values=frozen(values), device=Device(device),
                                   timeout_s=timeout)


__all__ = ["TuneSettings", "SEARCHED", "parse_budget"]
