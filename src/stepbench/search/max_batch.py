"""The largest batch that fits: `stepbench run --max-batch`.

For each setup of a run (setups that differ only in batch are one search, from the smallest batch
given), short probes find the largest batch that fits at the setup's sequence length: double from
the start batch until a probe runs out of memory, then bisect between the largest batch that fit
and the smallest that did not, until the gap is at most an eighth of the former
(`hi - lo <= max(1, lo // 8)`): a batch half again as big as the chosen one is then known not to
fit. A start batch that does not fit is halved down to 1. Then the full measurement runs at the
chosen batch with the run's own warm-up, steps and repeats.

Each probe is its own process through the run's Runner and executor, as `run` measures any setup,
with 1 warm-up and `probe_steps` timed steps: the second step is the first to hold gradients,
optimizer state and activations at once, so the timed window sees the step's full memory.

Near the limit, whether a batch fits varies between processes (the caching allocator's state).
On a GPU a probe therefore counts as fitting only when its peak reserved memory leaves a margin
of the capacity (the --memory-limit-gb cap, else the GPU's memory); a batch that ran but ate into
the margin is treated as too big, and the bisection goes on below it. On the CPU the cap is
address space (RLIMIT_AS), which resident memory does not measure, so there is no margin and the
largest batch seen to fit is chosen. Either way, when the full measurement still runs out of
memory, the next smaller batch that fit is measured instead.

Every probe and every full measurement is a record tagged with `search` (docs/results-schema.md).
The decisions depend only on the probes' status and peak reserved memory, and the Runner hands
back the stored record of a setup it already measured, so rerunning the same command replays the
search from the results file and runs only what is missing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from stepbench.errors import first_line
from stepbench.execute.progress import SearchView
from stepbench.execute.runner import FIRST_ROUNDS, NullDisplay, least_processes
from stepbench.record import Record
from stepbench.settings import MaxBatchOptions, Origin
from stepbench.setup import Setup

KIND = "max_batch"
PROBE_WARMUP = 1            # steps before the timed window of a probe
# Statuses a search can decide from; any other ends that setup's search.
DECIDES = ("ok", "oom")


def check_searches(options: MaxBatchOptions, plan: list[Setup], origin: Origin = Origin()) -> None:
    """Raise a UserError naming the fix for a plan no search can run (each setting named as
    it was given: `origin`, settings.Origin)."""
    n = origin.name
    for setup in starts(plan):
        if setup.device == "cpu" and setup.memory_limit_gb is None:
            raise origin.error("max_batch", f"{n('max_batch')} on the CPU needs "
                                            f"{n('memory_limit_gb', 'max_batch')}, the cap to "
                                            "search under; without it the batch grows until "
                                            "this machine runs out of memory")
        if setup.distributed:
            raise origin.error("max_batch", f"{n('max_batch')} searches the batch of one "
                                            f"process; drop {n('parallel', 'max_batch')} "
                                            f"{setup.parallel} (or run the search with "
                                            f"{n('parallel', 'max_batch')} none)")
        if setup.batch > options.limit:
            raise origin.error("max_batch_limit", f"{n('max_batch_limit')} {options.limit} is "
                                                  f"below the start batch {setup.batch}; raise "
                                                  "the limit or lower "
                                                  f"{n('batch', 'max_batch_limit')}")
        if (setup.warmup, setup.steps) == (PROBE_WARMUP, options.probe_steps):
            raise origin.error("steps", f"{n('warmup')} {setup.warmup} {n('steps')} "
                                        f"{setup.steps} are the probes' own steps, so the full "
                                        "measurement would be a probe; raise "
                                        f"{n('steps')} or change {n('probe_steps', 'steps')}")


def starts(plan: list[Setup]) -> list[Setup]:
    """One setup per search, in plan order: setups that differ only in batch collapse into the
    one with the smallest batch, where the search starts."""
    found: dict[str, Setup] = {}
    for setup in plan:
        key = dataclasses.replace(setup, batch=1).key()
        if key not in found or setup.batch < found[key].batch:
            found[key] = setup
    return list(found.values())


@dataclass
class Probe:
    """One short run of the search: the batch, why it was asked for, and its record."""

    batch: int
    step: str                   # start, double, halve or bisect
    record: Record

    @property
    def status(self) -> str:
        return self.record.status

    def as_list(self) -> list:
        """[batch, status, peak_reserved_gb], as the final record's `search.probes` keeps it."""
        return [self.batch, self.status, self.record.peak_reserved_gb]


@dataclass
class Search:
    """One setup's search: its probes, what it chose and its full measurement."""

    setup: Setup                # the run's setup at the start batch
    options: MaxBatchOptions
    probes: list[Probe] = field(default_factory=list)
    chosen: int | None = None   # the largest batch that fit (within the margin, on a GPU)
    finals: list[Record] = field(default_factory=list)   # full measurements, every attempt
    measured: int | None = None  # the batch whose full measurement did not run out of memory
    stepped_down_from: list[int] = field(default_factory=list)
    within_margin: bool = True  # False: no batch that ran left the margin free
    stopped: str | None = None  # the status that ended the search early, else None
    reason: str | None = None   # why, in one line

    @property
    def start_batch(self) -> int:
        return self.setup.batch

    @property
    def label(self) -> str:
        return f"{self.setup.name}{self.setup.at_seq}"

    @property
    def largest_fit(self) -> int | None:
        """The largest batch seen to fit (status ok), margin or not."""
        return max((p.batch for p in self.probes if p.status == "ok"), default=None)

    @property
    def smallest_oom(self) -> int | None:
        return min((p.batch for p in self.probes if p.status == "oom"), default=None)

    @property
    def capacity_gb(self) -> float | None:
        """What the margin is taken of, on a GPU: the memory cap, else the GPU's memory; None on
        the CPU (an address-space cap is not comparable with resident memory)."""
        if self.setup.device != "cuda":
            return None
        if self.setup.memory_limit_gb is not None:
            return self.setup.memory_limit_gb
        return next((p.record.machine.gpu_memory_gb for p in self.probes
                     if p.record.machine.gpu_memory_gb), None)

    @property
    def margin(self) -> float | None:
        """The margin applied, None where it cannot be (the CPU, an unknown capacity)."""
        return self.options.margin if self.capacity_gb is not None else None

    def fits(self, probe: Probe) -> bool:
        """Ran, and (on a GPU) left the margin of the capacity free."""
        peak, capacity = probe.record.peak_reserved_gb, self.capacity_gb
        if probe.status != "ok":
            return False
        return capacity is None or peak is None or peak <= (1 - self.options.margin) * capacity

    def probe_tag(self, step: str) -> dict:
        return {"kind": KIND, "role": "probe", "start_batch": self.start_batch, "step": step}

    def final_tag(self, batch: int) -> dict:
        return {"kind": KIND, "role": "final", "start_batch": self.start_batch,
                "largest_fit": self.largest_fit, "smallest_oom": self.smallest_oom,
                "chosen": batch, "margin": self.margin, "capacity_gb": self.capacity_gb,
                "probes": [p.as_list() for p in self.probes],
                "stepped_down_from": list(self.stepped_down_from)}

    def summary(self) -> str:
        """One line: what the search found and measured, or why it stopped."""
        parts = []
        if self.largest_fit is not None:
            parts.append(f"largest batch seen to fit {self.largest_fit}")
        if self.smallest_oom is not None:
            parts.append(f"smallest out of memory {self.smallest_oom}")
        elif self.largest_fit is not None and self.largest_fit >= self.options.limit:
            parts.append(f"reached --max-batch-limit {self.options.limit}")
        if self.chosen is not None and not self.within_margin:
            parts.append(f"none left {self.options.margin:.0%} of {self.capacity_gb:g} GB free, "
                         f"chose the smallest that ran, {self.chosen}")
        elif self.chosen is not None and self.chosen != self.largest_fit:
            parts.append(f"chose {self.chosen}, the largest that left {self.options.margin:.0%} "
                         f"of {self.capacity_gb:g} GB free")
        if self.stepped_down_from:
            parts.append("the full measurement ran out of memory at "
                         + ", ".join(map(str, self.stepped_down_from)))
        if self.measured is not None:
            parts.append(f"measured at batch {self.measured}")
        if self.stopped:
            parts.append(f"stopped: {self.reason}")
        return f"max-batch {self.label}: " + "; ".join(parts)


class MaxBatch:
    """Runs the searches of a plan through one Runner (its executor and results file), showing
    progress on `display`: each process numbered within its search ("search 2/3, probe 5",
    execute/progress.py SearchView)."""

    def __init__(self, runner, options: MaxBatchOptions, *, repeats: int | None = 1,
                 timeout_s: float, display=None):
        self.runner = runner
        self.options = options
        self.repeats = repeats
        self.timeout_s = timeout_s
        self.display = SearchView(display or NullDisplay())

    def run(self, plan: list[Setup]) -> list[Search]:
        found = starts(plan)
        searches = []
        for number, setup in enumerate(found, start=1):
            self.display.scope = f"search {number}/{len(found)}, " if len(found) > 1 else ""
            searches.append(self.search(setup))
        return searches

    def search(self, setup: Setup) -> Search:
        s = Search(setup, self.options)
        self.display.note(
            f"max-batch {s.label}: from batch {setup.batch}, probes of {PROBE_WARMUP} warm-up + "
            f"{self.options.probe_steps} timed steps")
        lo, hi = self._bracket(s)
        while not s.stopped and lo is not None and hi is not None and hi - lo > max(1, lo // 8):
            batch = (lo + hi) // 2
            probe = self._probe(s, batch, "bisect")
            if not s.stopped:
                lo, hi = (batch, hi) if s.fits(probe) else (lo, batch)
        if not s.stopped:
            fitted = [p.batch for p in s.probes if p.status == "ok"]
            # Nothing left the margin: the smallest batch that ran is the least risky choice.
            s.chosen = lo if lo is not None else min(fitted, default=None)
            s.within_margin = lo is not None
            if s.chosen is None:
                s.stopped, s.reason = "oom", (f"batch 1 does not fit at seq {setup.seq}; lower "
                                              "--seq or raise --memory-limit-gb")
            else:
                self._measure(s)
        self.display.note(s.summary())
        return s

    def _bracket(self, s: Search) -> tuple[int | None, int | None]:
        """(largest batch that fit, smallest that did not) by doubling from the start batch, or
        by halving it when it does not fit; None where no such batch was seen."""
        probe = self._probe(s, s.start_batch, "start")
        if s.stopped:
            return None, None
        if s.fits(probe):
            lo = s.start_batch
            while lo < self.options.limit:
                batch = min(2 * lo, self.options.limit)
                probe = self._probe(s, batch, "double")
                if s.stopped:
                    return None, None
                if not s.fits(probe):
                    return lo, batch
                lo = batch
            return lo, None
        hi = s.start_batch
        while hi > 1:
            batch = hi // 2
            probe = self._probe(s, batch, "halve")
            if s.stopped:
                return None, None
            if s.fits(probe):
                return batch, hi
            hi = batch
        return None, hi

    def _probe(self, s: Search, batch: int, step: str) -> Probe:
        setup = dataclasses.replace(s.setup, batch=batch, warmup=PROBE_WARMUP,
                                    steps=self.options.probe_steps)
        self.display.what = "probe"
        probe = Probe(batch, step, self._one(setup, 1, s.probe_tag(step))[0])
        s.probes.append(probe)
        record = probe.record
        if record.status not in DECIDES:
            s.stopped = record.status
            s.reason = f"the probe at batch {batch} ended {record.status}: {_first_line(record)}"
        elif record.status == "oom" and record.phase == "starting":
            # Out of memory before the model was built: no batch can fit under this cap.
            s.stopped, s.reason = "oom", _first_line(record)
        return probe

    def _measure(self, s: Search) -> None:
        """The full measurement at the chosen batch; on out-of-memory, at the next smaller batch
        that fit, and so on."""
        smaller = sorted({p.batch for p in s.probes if s.fits(p) and p.batch < s.chosen},
                         reverse=True)
        self.display.what = "final"
        for batch in [s.chosen, *smaller]:
            records = self._one(dataclasses.replace(s.setup, batch=batch), self.repeats,
                                s.final_tag(batch))
            s.finals += records
            if any(r.status == "oom" for r in records):
                s.stepped_down_from.append(batch)
                continue
            failed = next((r for r in records if r.status != "ok"), None)
            if failed is not None:
                s.stopped = failed.status
                s.reason = (f"the full measurement at batch {batch} ended {failed.status}: "
                            f"{_first_line(failed)}")
            else:
                s.measured = batch
            return
        s.stopped = "oom"
        s.reason = "the full measurement ran out of memory at every batch that fit"

    def _one(self, setup: Setup, repeats: int | None, tag: dict) -> list[Record]:
        records = self.runner.run([setup], repeats=repeats, timeout_s=self.timeout_s, tag=tag,
                                  display=self.display)
        if len(records) < least_processes(repeats):     # stopped before a record was kept
            raise KeyboardInterrupt("stopped")
        return records


def _first_line(record: Record) -> str:
    return first_line(record.error) or "no message"


def describe(plan: list[Setup], options: MaxBatchOptions, repeats: int | None) -> list[dict]:
    """What `run --max-batch --dry-run` would search, one object per search (the final's
    `repeats` None: run's default, 2 processes and a third where they disagree)."""
    return [{"setup": setup.to_dict(), "start_batch": setup.batch, "limit": options.limit,
             "probe": {"warmup": PROBE_WARMUP, "steps": options.probe_steps},
             "margin": options.margin if setup.device == "cuda" else None,
             "final": {"warmup": setup.warmup, "steps": setup.steps, "repeats": repeats}}
            for setup in starts(plan)]


def describe_line(item: dict) -> str:
    s = Setup.from_dict(item["setup"])
    margin = (f", keeping {item['margin']:.0%} of the GPU's memory free" if item["margin"]
              else "")
    final = item["final"]
    processes = final["repeats"] or f"{FIRST_ROUNDS} (a third where they disagree)"
    return (f"max-batch {s.name}{s.at_seq} ({s.model_label}, {s.dtype}, {s.device}): "
            f"batch {item['start_batch']} doubled up to {item['limit']}, then bisected{margin}; "
            f"probes of {item['probe']['warmup']} warm-up + {item['probe']['steps']} timed steps, "
            f"then {final['warmup']} warm-up + {final['steps']} timed steps x {processes} at the "
            "chosen batch")
