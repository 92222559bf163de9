"""What a measurement will cost: a setup's process priced from its parts, as measured here.

A process's wall time (`Record.phases`, docs/results-schema.md) falls into parts that depend on
different things, so that one record prices many candidates:

server start  once per tune: the process server imports torch and transformers before the first
              process (`placement.server_start_s`); with `--start fresh` every process imports
              them itself, inside its overhead;
overhead      everything outside the first step and the steps (start, imports, device init,
              build, after, FLOP count, exit): by mode (a compiled process imports inductor and
              wraps the model) and by how the process started (server or fresh);
first step    the step plus what the first one does once: torch.compile's compilation, cold
              (the setup is new to the shared inductor cache: `compile.cache_misses`) or warm,
              by mode and attention kernel (flex_attention compiles its kernel in eager mode
              too), scaled for options that compile longer (autotuning, float8);
steps         the warm-up and timed steps at the step time the candidate is expected to run at.

Each part is the median of this machine's records where they hold one, else a prior from the
committed H200 results (GPU) or from this project's CPU machines (`PRIORS`); `Price.sources`
says which.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from stepbench.execute.local import FRESH, uses_server
from stepbench.record import Record
from stepbench.setup import Setup

THIS_MACHINE = "this machine"
# The steps' source where nothing measured says how long a step of the setup takes (a tune's
# first reference): the price leaves them out, a floor rather than an estimate.
UNKNOWN_STEPS = "unknown: no step of this model measured yet"


@dataclass(frozen=True)
class Prior:
    """A device's parts before any record of this machine holds them (seconds)."""

    server_start_s: float
    overhead_s: dict          # (start, mode) -> seconds
    first_step_s: dict        # (mode, attn) -> a cold first step's seconds beyond one step
    warm_share: float         # a warm compile's first step as a share of its cold one
    source: str


# A first step's compile time relative to the same setup's without the option (cold).
COMPILE_FACTORS = {("compile_mode", "max-autotune"): 7.4,
                   ("compile_mode", "max-autotune-no-cudagraphs"): 7.3,
                   ("compile_mode", "reduce-overhead"): 1.3, ("dtype", "float8"): 2.6,
                   ("compile_scope", "layer"): 0.4, ("kernels", "liger"): 0.57,
                   ("kernels", "liger-no-flce"): 0.51}
COMPILE_FACTORS_SOURCE = ("H200, llama-468m: benchmarks/results/h200-2026-11-30-axes.jsonl and "
                          "h200-2026-12-01-tune-468m.jsonl (first steps with and without each "
                          "option)")

PRIORS = {
    "cuda": Prior(
        server_start_s=12.0,
        overhead_s={("server", "eager"): 1.3, ("server", "compile"): 4.9,
                    ("fresh", "eager"): 13.3, ("fresh", "compile"): 15.8},
        first_step_s={("compile", "sdpa"): 48.0, ("compile", "flex_attention"): 70.0,
                      ("compile", "eager"): 63.0, ("eager", "flex_attention"): 19.0,
                      ("eager", "sdpa"): 0.6, ("eager", "eager"): 0.5},
        warm_share=0.14,
        source="committed H200 results (benchmarks/results/h200-2026-12-01-start-*.jsonl, "
               "h200-2026-12-01-tune-*.jsonl)"),
    "cpu": Prior(
        server_start_s=7.0,
        overhead_s={("server", "eager"): 0.5, ("server", "compile"): 3.0,
                    ("fresh", "eager"): 6.0, ("fresh", "compile"): 9.0},
        first_step_s={("compile", "sdpa"): 25.0, ("compile", "eager"): 25.0,
                      ("eager", "sdpa"): 0.3, ("eager", "eager"): 0.3},
        warm_share=0.15,
        source="a tiny Llama on a 2-core CPU machine (docs/tune.md)"),
}


@dataclass(frozen=True)
class Price:
    """A measurement's expected seconds, by part, and where each part's figure came from."""

    parts: dict = field(default_factory=dict)       # part -> seconds
    sources: dict = field(default_factory=dict)     # part -> THIS_MACHINE or a prior's source

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def knows_steps(self) -> bool:
        """Whether the steps are priced (else `total` is a floor: what the process takes
        besides its steps)."""
        return self.sources.get("steps") != UNKNOWN_STEPS

    def describe(self) -> str:
        text = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.parts.items()
                         if round(seconds) >= 1)
        return text if self.knows_steps else f"{text}, steps not known yet"

    def over_budget(self, left_s: float) -> str:
        """Why a measurement is not made: "the budget has 3 s left for it and it takes about
        9 s (first step 9 s)"; under 10 s in tenths, so that neither reads "0 s", and in
        tenths too where whole seconds would read the same ("13.2 s left", "about 13.4 s");
        the parts only where one is a second or more (never "()")."""
        left_s = max(left_s, 0)
        close = f"{left_s:.0f}" == f"{self.total:.0f}"

        def secs(x: float) -> str:
            return f"{x:.1f}" if x < 9.95 or close else f"{x:.0f}"

        parts = self.describe()
        return (f"the budget has {secs(left_s)} s left for it and it takes about "
                f"{secs(self.total)} s" + (f" ({parts})" if parts else ""))


def start_of(record: Record) -> str:
    return (record.placement or {}).get("start") or FRESH


def is_warm(record: Record) -> bool:
    """Whether the record's compile found its graphs in the inductor cache."""
    info = record.compile or {}
    return info.get("cache_misses") == 0 and (info.get("cache_hits") or 0) > 0


def first_step_extra(record: Record) -> float | None:
    """What the first step took beyond one step (its compilation), seconds."""
    if record.first_step_s is None:
        return None
    return max(record.first_step_s - (record.step_ms or 0.0) / 1e3, 0.0)


def overhead(record: Record) -> float | None:
    """The process's seconds outside its first step and steps."""
    phases = record.phases or {}
    if record.wall_s is None or record.first_step_s is None:
        return None
    return max(record.wall_s - record.first_step_s - phases.get("warmup", 0.0)
               - phases.get("timed", 0.0), 0.0)


def compile_factor(setup: Setup) -> float:
    factor = 1.0
    for (axis, value), f in COMPILE_FACTORS.items():
        if getattr(setup, axis) == value and setup.mode == "compile":
            factor *= f
    return factor


class Prices:
    """Prices setups on one device from this machine's records (`records`, the tune's own),
    else from its prior."""

    def __init__(self, device: str, start: str):
        self.prior = PRIORS[device]
        self.start = start
        self.records: list[Record] = []

    def server_start(self) -> tuple[float, str]:
        seen = [r.placement["server_start_s"] for r in self.records
                if (r.placement or {}).get("server_start_s")]
        return (max(seen), THIS_MACHINE) if seen else (self.prior.server_start_s,
                                                       self.prior.source)

    def overhead(self, setup: Setup) -> tuple[float, str]:
        seen = [overhead(r) for r in self.records if r.setup.mode == setup.mode
                and start_of(r) == self.start and overhead(r) is not None]
        if seen:
            return statistics.median(seen), THIS_MACHINE
        return self.prior.overhead_s[(self.start, setup.mode)], self.prior.source

    def first_step(self, setup: Setup, warm: bool) -> tuple[float, str]:
        """The first step's seconds beyond one step, cold or warm (`warm`: the tune compiled
        this setup before, in the shared cache)."""
        def seen(records):
            return [first_step_extra(r) / compile_factor(r.setup) for r in records
                    if first_step_extra(r) is not None and r.setup.mode == setup.mode
                    and (setup.mode == "eager" or is_warm(r) == warm)]

        factor = compile_factor(setup)
        family = setup.replace(batch=1, warmup=0, steps=1)
        same = seen([r for r in self.records
                     if r.setup.replace(batch=1, warmup=0, steps=1) == family])
        if same:
            return statistics.median(same) * factor, THIS_MACHINE
        kernel = seen([r for r in self.records if r.setup.attn == setup.attn])
        if kernel:
            return statistics.median(kernel) * factor, THIS_MACHINE
        prior = self.prior.first_step_s
        own = prior.get((setup.mode, setup.attn), prior.get((setup.mode, "sdpa"), 0.0))
        if setup.mode == "compile":
            # Another kernel's compile measured here, scaled by the kernels' prior ratio.
            others = [(r, x) for r in self.records
                      if (x := first_step_extra(r)) is not None and r.setup.mode == "compile"
                      and is_warm(r) == warm]
            if others:
                scaled = [x / compile_factor(r.setup) * own /
                          prior.get(("compile", r.setup.attn), own) for r, x in others]
                return statistics.median(scaled) * factor, THIS_MACHINE
            if warm:
                cold, source = self.first_step(setup, warm=False)
                return cold * self.prior.warm_share, source
        return own * factor, self.prior.source

    def price(self, setup: Setup, step_s: float | None, *, warm: bool, server: bool) -> Price:
        """`setup` measured once: `step_s` its expected step time (None: not known, the steps
        left out), `warm` whether its compile will find the cache warm, `server` whether the
        process server still has to start."""
        parts, sources = {}, {}
        if server and uses_server(self.start):
            parts["server start"], sources["server start"] = self.server_start()
        parts["process"], sources["process"] = self.overhead(setup)
        extra, sources["first step"] = self.first_step(setup, warm)
        parts["first step"] = extra + (step_s or 0.0)
        parts["steps"] = (setup.warmup + setup.steps) * (step_s or 0.0)
        sources["steps"] = "the step time expected" if step_s is not None else UNKNOWN_STEPS
        return Price(parts, sources)
