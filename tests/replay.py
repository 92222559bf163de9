"""A fake machine for tune's tests: it answers each measurement from a grid of real records and
advances a simulated clock by what the process would have taken on a host of a given cost
profile.

The grid is ordinary stepbench records (one or more processes per setup, with their phases) of
SmolLM2-135M's shape at sequence 2048 on H200s, tests/data/h200-2026-12-01-grid-135m.jsonl: the
committed llama-135m tune's records (benchmarks/results/h200-2026-12-01-tune-135m.jsonl) and the
grid measured for this replay through the process server (h200-2026-12-01-grid-135m.jsonl there),
one after the other. A setup's n-th process is the grid's n-th process of it (cycling, among
those that ran at least as many steps where there are any); its steps (cycled where it ran
fewer), losses and memory are the grid's, its first step and wall time the profile's: a process
server's start once, then per process what is outside the steps (by mode), the compile (cold the
first time a setup compiles, warm after, by attention kernel) and the grid's own step times. A setup the grid lacks runs out of memory where a smaller batch of it was the grid's
largest, and ends in an error otherwise.

The machine has the Runner's interface (run, run_id, store), which is all `Tuner` asks of one.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

from stepbench.execute.runner import RETRIED
from stepbench.record import Record, ResultsFile, resume_key
from stepbench.setup import Setup

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "tests" / "data" / "h200-2026-12-01-grid-135m.jsonl"
COMMITTED_TUNE = ROOT / "benchmarks" / "results" / "h200-2026-12-01-tune-135m.jsonl"


@dataclass(frozen=True)
class Profile:
    """What a host's processes spend outside their steps (seconds)."""

    name: str
    imports_s: float        # torch and transformers: the process server's start
    cold_s: dict            # attention -> a cold compile's first step beyond one step
    warm_s: dict            # attention -> a warm one's
    other_s: dict           # mode -> the rest of a process outside its first step and steps


def profile_of(name: str, records: list[Record]) -> Profile:
    """A host's profile from its records' phases: the median of each part."""
    def median(values, default=0.0):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else default

    def extra(r):
        return r.first_step_s - r.step_ms / 1e3

    def compiled(attn, warm):
        return median(extra(r) for r in records if r.ok and r.setup.mode == "compile"
                      and r.setup.attn == attn and r.setup.compile_mode == "default"
                      and ((r.compile or {}).get("cache_misses") == 0) == warm)

    attns = {r.setup.attn for r in records if r.setup.mode == "compile"}
    other = {mode: median(r.wall_s - r.phases["imports"] - r.first_step_s - r.phases["warmup"]
                          - r.phases["timed"] for r in records
                          if r.ok and r.phases and r.setup.mode == mode)
             for mode in ("eager", "compile")}
    return Profile(name, median(r.phases.get("imports") for r in records if r.phases),
                   {a: compiled(a, False) for a in attns}, {a: compiled(a, True) for a in attns},
                   other)


def fast_host() -> Profile:
    """The host of the committed llama-135m tune (benchmarks/results/
    h200-2026-12-01-tune-135m.jsonl)."""
    return profile_of("fast host", ResultsFile(COMMITTED_TUNE).read())


def slow_host() -> Profile:
    """The host of issue 22's eight-minute tune: imports 13 s, a cold compile 69 s with sdpa and
    100 s with flex_attention, a warm one 8 s; the rest as on the fast host."""
    fast = fast_host()
    return Profile("slow host", 13.0, {"sdpa": 69.0, "flex_attention": 100.0},
                   {"sdpa": 8.0, "flex_attention": 8.0}, fast.other_s)


def grid_records() -> list[Record]:
    """The grid's records that ran or ran out of memory."""
    return [r for r in ResultsFile(GRID).read() if r.status in ("ok", "oom")]


def family(setup: Setup) -> str:
    return setup.replace(warmup=0, steps=1).key()


class Grid:
    """The grid's processes by setup (step counts aside)."""

    def __init__(self, records: list[Record]):
        self.records = records
        self.by_setup: dict[str, list[Record]] = {}
        for r in records:
            self.by_setup.setdefault(family(r.setup), []).append(r)

    def rate(self, setup: Setup) -> float | None:
        """The setup's tokens/s in the grid: the mean over its processes that ran."""
        runs = [r.tokens_per_s for r in self.by_setup.get(family(setup), []) if r.ok]
        return statistics.fmean(runs) if runs else None

    def best(self) -> tuple[Setup, float]:
        rates = [(self.rate(runs[0].setup), runs[0].setup) for runs in self.by_setup.values()
                 if self.rate(runs[0].setup)]
        value, setup = max(rates, key=lambda item: item[0])
        return setup, value

    def base(self) -> Setup:
        """The grid's eager reference at its smallest batch: where a tune of it starts."""
        eager = [r.setup for r in self.records if r.setup.mode == "eager"]
        return min(eager, key=lambda s: s.batch)

    def largest_batch(self, setup: Setup) -> int | None:
        same = [r.setup.batch for r in self.records
                if family(r.setup.replace(batch=1)) == family(setup.replace(batch=1)) and r.ok]
        return max(same, default=None)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ReplayMachine:
    """The Runner's interface, answering from `grid` at `profile`'s costs on `clock`."""

    def __init__(self, grid: Grid, profile: Profile, store: ResultsFile, clock: Clock,
                 run_id: str = "replay"):
        self.grid, self.profile, self.store, self.clock = grid, profile, store, clock
        self.run_id = run_id
        self.compiled: set[str] = set()       # setups in the shared inductor cache
        self.server_started = False
        self.asked: list[Setup] = []

    def run(self, plan, *, repeats=1, timeout_s, tag=None, display=None, retry=True):
        done = {r.resume_key(): r for r in self.store.latest()
                if not (retry and r.status in RETRIED)}
        out = []
        for repeat in range(repeats):
            for setup in plan:
                gpu = self.grid.records[0].machine.gpu
                key = resume_key(setup, repeat, gpu)
                if key in done:
                    out.append(done[key])
                    continue
                record = self.answer(setup, repeat, timeout_s, tag)
                self.store.append(record)
                out.append(record)
        return out

    def answer(self, setup: Setup, repeat: int, timeout_s: float, tag) -> Record:
        self.asked.append(setup)
        p = self.profile
        placement = {"start": "server"}
        if not self.server_started:
            self.server_started = True
            placement["server_start_s"] = p.imports_s
            self.clock.now += p.imports_s
        runs = [r for r in self.grid.by_setup.get(family(setup), []) if r.ok]
        oom = [r for r in self.grid.by_setup.get(family(setup), []) if r.status == "oom"]
        machine = self.grid.records[0].machine
        other = p.other_s[setup.mode]
        if not runs:
            largest = self.grid.largest_batch(setup)
            status = "oom" if oom or (largest is not None and setup.batch > largest) else "error"
            wall = other + (5.0 if setup.mode == "compile" else 1.0)
            self.clock.now += wall
            return Record(run_id=self.run_id, repeat=repeat, setup=setup, status=status,
                          error="the replayed grid holds no record of it" if status == "error"
                          else "CUDA out of memory", wall_s=wall, machine=machine,
                          placement=placement, search=tag, phase="first_step")
        # The grid's processes that ran at least the steps asked for (their losses cover the
        # loss guard's comparison), else any.
        full = [r for r in runs if r.setup.warmup + r.setup.steps >= setup.warmup + setup.steps]
        source = (full or runs)[repeat % len(full or runs)]
        n = setup.steps
        steps = [source.step_times_ms[i % len(source.step_times_ms)] for i in range(n)]
        step_s = statistics.fmean(steps) / 1e3
        warmup_s = setup.warmup * step_s
        if setup.mode == "compile":
            warm = family(setup) in self.compiled
            self.compiled.add(family(setup))
            compile_s = (p.warm_s if warm else p.cold_s).get(setup.attn, 0.0)
            info = {"cache": "shared", "cache_hits": 7 if warm else 0,
                    "cache_misses": 0 if warm else 7}
        else:
            compile_s = max(source.first_step_s - source.step_ms / 1e3, 0.0)
            info = None
        first = compile_s + step_s
        wall = other + first + warmup_s + sum(steps) / 1e3
        phases = {"build": other, "first_step": first, "warmup": warmup_s,
                  "timed": sum(steps) / 1e3}
        if wall > timeout_s:
            self.clock.now += timeout_s
            return Record(run_id=self.run_id, repeat=repeat, setup=setup, status="timeout",
                          wall_s=timeout_s, machine=machine, placement=placement, search=tag)
        self.clock.now += wall
        mean = statistics.fmean(steps)
        losses = list(source.losses[:1 + setup.warmup + setup.steps])
        return Record(run_id=self.run_id, repeat=repeat, setup=setup, status="ok",
                      phase="done", first_step_s=first, step_ms=mean,
                      step_ms_median=statistics.median(steps), step_times_ms=steps,
                      tokens_per_s=setup.tokens_per_step / mean * 1e3,
                      peak_memory_gb=source.peak_memory_gb,
                      peak_reserved_gb=source.peak_reserved_gb, losses=losses,
                      loss_first=losses[0] if losses else None, compile=info,
                      noise_flags=list(source.noise_flags), phases=phases, wall_s=wall,
                      machine=machine, placement=placement, search=tag)


def replay(profile: Profile, tmp_path: Path, budget_s: float = 480.0, space: dict | None = None,
           grid: Grid | None = None, name: str = "replay.jsonl"):
    """A tune of the grid's model on the replayed machine: (result, grid, machine)."""
    from stepbench.search.tune import Tuner

    grid = grid or Grid(grid_records())
    clock = Clock()
    machine = ReplayMachine(grid, profile, ResultsFile(tmp_path / name), clock)
    base = dataclasses.replace(grid.base(), warmup=4, steps=20)
    space = space or {"mode": ["eager", "compile"], "attn": ["sdpa", "flex_attention"],
                      "compile_mode": ["default", "reduce-overhead"],
                      "compile_scope": ["model"], "dtype": ["bf16"], "kernels": ["none"],
                      "optimizer": ["fused"], "checkpointing": [False, True]}
    tuner = Tuner(machine, base, space, budget_s=budget_s, objective="tokens", timeout_s=1800,
                  repeats=3, start="server", clock=clock)
    return tuner.run(), grid, machine
