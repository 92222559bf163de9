"""Fewer launches first: where a setup measured on this machine is host-bound (its record's
`host_bound` noise flag, hostlead.py: the GPU finished each step right after the host launched
its last kernel), its step is the host's launch rate, not the GPU's work, and gains measured on
another host (the committed results) do not say what a change is worth here. What helps such a
step is fewer launches: CUDA graphs (compile mode reduce-overhead: one replay instead of a
launch per kernel; CUDA only) and a larger batch (the same launches, more work each). The
search measures those candidates before the order the gains give; it never skips one for it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from stepbench.record import Record
from stepbench.setup import Setup, planned

CUDA_GRAPHS = "reduce-overhead"


@dataclass(frozen=True)
class HostBound:
    """A setup this machine measured host-bound, its median host lead and step (ms), and the
    candidates that cut its launches."""

    setup: Setup
    lead_ms: float
    step_ms: float
    cutters: tuple[Setup, ...]

    def reason(self, label) -> str:
        """The line the tune says once, and the JSON keeps: why these candidates came first."""
        what = [f"CUDA graphs ({label(s)})" for s in self.cutters
                if s.compile_mode == CUDA_GRAPHS] + \
            [f"a larger batch ({label(s)})" for s in self.cutters if s.batch > self.setup.batch]
        lead = round(self.lead_ms, 1) + 0.0      # a lead of -0.03 ms reads 0.0, not -0.0
        return (f"{label(self.setup)} is host-bound here (host lead {lead:.1f} ms of "
                f"{self.step_ms:.0f} ms): trying {' and '.join(what)} first")

    def to_dict(self, label) -> dict:
        return {"setup": label(self.setup), "host_lead_ms": round(self.lead_ms, 3),
                "step_ms": round(self.step_ms, 3),
                "candidates": [label(s) for s in self.cutters], "reason": self.reason(label)}


def is_host_bound(records: list[Record]) -> bool:
    """Most of a setup's processes that ran carry the `host_bound` flag."""
    ran = [r for r in records if r.ok]
    return bool(ran) and 2 * sum("host_bound" in r.noise_flags for r in ran) >= len(ran)


def cutters(setup: Setup, space: dict, changes: list[dict]) -> tuple[Setup, ...]:
    """The candidates one step from `setup` that launch fewer kernels per token: its CUDA-graph
    variant (compiled, where the space compiles and holds reduce-overhead, on CUDA only) and
    its doubled batch, where the tune's own `changes` of it hold one (the tokens objective)."""
    out = []
    if setup.device == "cuda" and CUDA_GRAPHS in space.get("compile_mode", ()) and \
            setup.compile_mode != CUDA_GRAPHS and "compile" in space.get("mode", ()):
        out.append(planned(setup.replace(mode="compile", compile_mode=CUDA_GRAPHS)))
    out += [planned(setup.replace(**c)) for c in changes if set(c) == {"batch"}]
    return tuple(out)


def host_bound_setups(seen, space: dict, changes) -> list[HostBound]:
    """Every explorable setup `seen` (the tune's Measurements) holds host-bound, with the
    candidates that cut its launches (`changes`: the tune's changes of a setup), in the order
    measured."""
    out = []
    for s in seen.measured():
        runs = seen.ran(s)
        if not seen.explorable(s) or not is_host_bound(runs):
            continue
        bound = [r for r in runs if "host_bound" in r.noise_flags]
        leads = [r.host_lead_ms for r in bound if r.host_lead_ms is not None]
        steps = [r.step_ms_median or r.step_ms for r in bound]
        found = cutters(s, space, changes(s))
        if found:
            out.append(HostBound(s, statistics.median(leads) if leads else 0.0,
                                 statistics.median(steps), found))
    return out
