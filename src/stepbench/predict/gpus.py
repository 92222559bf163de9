"""The GPU table (gpus.toml, shipped with the package): vendor figures, each with its source.

A name is looked up as the driver reports it ("NVIDIA H100 PCIe"), or by an alias ("H100
PCIe"), ignoring case, "NVIDIA " and "GeForce "; an unknown name is a UserError that lists the
closest known names.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from stepbench.errors import UserError

# The numeric fields of an entry (gpus.toml's header says what each one means).
FIELDS = ("bf16_tflops", "fp16_tflops", "fp8_tflops", "tf32_tflops", "memory_bandwidth_gbs",
          "memory_gib", "l2_mb", "sms", "power_w", "pcie_gen", "pcie_gbs", "nvlink_gbs",
          "compute_capability")
# Published measurements of a card (not vendor figures), each with its URL in the entry's
# `measured_sources`: what a GPU reaches, where its datasheet peak is known to be off.
MEASURED_FIELDS = ("bf16_matmul_tflops",)


@dataclass(frozen=True)
class Gpu:
    name: str
    specs: dict = field(default_factory=dict)      # field -> number (absent: not given)
    sources: dict = field(default_factory=dict)    # field -> where the number comes from
    aliases: tuple = ()
    notes: str | None = None                       # said with every prediction for it
    measured: dict = field(default_factory=dict)   # MEASURED_FIELDS -> published number
    measured_sources: dict = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        return self.specs.get(name)

    def tensor_tflops(self, dtype: str) -> float | None:
        """Dense tensor peak for a matmul dtype (bf16, fp16, fp8, tf32)."""
        return self.specs.get(f"{dtype}_tflops")

    @property
    def memory_bytes(self) -> float | None:
        gib = self.specs.get("memory_gib")
        return None if gib is None else gib * 2**30


def _norm(name: str) -> str:
    words = name.lower().replace("-", " ").split()
    return " ".join(w for w in words if w not in ("nvidia", "geforce"))


@cache
def table() -> dict[str, Gpu]:
    """Every GPU of gpus.toml by its driver name."""
    text = resources.files("stepbench.predict").joinpath("gpus.toml").read_text(encoding="utf-8")
    gpus = {}
    for name, entry in tomllib.loads(text)["gpus"].items():
        specs = {k: entry[k] for k in FIELDS if k in entry}
        measured = entry.get("measured", {})
        gpus[name] = Gpu(name, specs, dict(entry.get("sources", {})),
                         tuple(entry.get("aliases", ())), entry.get("notes"),
                         {k: measured[k] for k in MEASURED_FIELDS if k in measured},
                         dict(entry.get("measured_sources", {})))
    return gpus


@cache
def _index() -> dict[str, str]:
    index = {}
    for gpu in table().values():
        for spelling in (gpu.name, *gpu.aliases):
            index.setdefault(_norm(spelling), gpu.name)
    return index


def find(name: str) -> Gpu | None:
    """The entry for `name` (driver name or alias), or None."""
    if name in table():
        return table()[name]
    hit = _index().get(_norm(name))
    return table()[hit] if hit else None


def lookup(name: str) -> Gpu:
    """The entry for `name`; an unknown name is a UserError naming the closest ones."""
    gpu = find(name)
    if gpu is not None:
        return gpu
    spellings = {_norm(s): s for g in table().values() for s in (g.name, *g.aliases)}
    close = difflib.get_close_matches(_norm(name), list(spellings), n=3, cutoff=0.4)
    names = list(dict.fromkeys(find(spellings[c]).name for c in close))
    hint = f"closest: {', '.join(names)}" if names else \
        f"known: {', '.join(sorted(table()))}"
    raise UserError(f"unknown GPU '{name}'; {hint} (the table: stepbench/predict/gpus.toml)")
