"""The closed sets a setting takes: where a run goes (device), how a setup's process starts,
what a tune optimises. Each is a `StrEnum`: a member is its value wherever a string is expected
(`==`, dict keys, f-strings, `json.dumps`), so records and printed lines hold the plain value."""

from __future__ import annotations

from enum import StrEnum


class Device(StrEnum):
    """`--device`: where the setups run; `auto` resolves to cuda or cpu."""

    AUTO = "auto"
    CUDA = "cuda"
    CPU = "cpu"


class Start(StrEnum):
    """`--start`: how each setup's process starts (execute/server.py)."""

    SERVER = "server"       # forked by the run's process server, which imported torch once
    FRESH = "fresh"         # a new Python that imports everything itself


class PinCpus(StrEnum):
    """`--pin-cpus`: whether a setup's process is bound to its GPU's local cores
    (measure/pinning.py)."""

    OFF = "off"             # the cores the run was given, as the operating system schedules
    AUTO = "auto"           # its GPU's NUMA-local cores (sysfs, else NVML)


class Objective(StrEnum):
    """`tune --objective`: what the search maximises."""

    TOKENS = "tokens"       # the most tokens/s, the batch grown from --batch
    FIT = "fit"             # the fastest setup whose step at --batch fits --memory-limit-gb


__all__ = ["Device", "Start", "PinCpus", "Objective"]
