"""A tune's budget and the value of its candidates: the time it may spend and has spent, what
a candidate may add per second it costs.

The budget counts the wall time of every measurement the tune used (stored ones included; an
interrupted invocation of this tune by its span, `spent_by`) plus this invocation's own time;
what a measurement costs comes from its parts (search/prices.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

from stepbench.execute.protocol import now_iso
from stepbench.record import Record
from stepbench.search.gains import Gain
from stepbench.search.prices import Price
from stepbench.search.tune.results import label
from stepbench.setup import Setup

LADDER_SHARE = 0.25    # of the budget, at most, for the ladder
# A candidate beats the best so far when it is faster by more than this: about the smallest
# difference the final test has told apart (docs/architecture.md, "Measured reasons").
BEAT = 0.01


@dataclass
class Budget:
    """The time a tune may spend (`total_s`), by `clock`, from `began`; `stored_s`: what the
    stored measurements it counts took (`counted`: their setup keys and repeats)."""

    total_s: float
    clock: Callable[[], float]
    began: float
    stored_s: float = 0.0
    counted: set = field(default_factory=set)
    ran_process: bool = False     # this invocation started a process (the server)
    # When it began, by the wall clock: in each record's `search`, where spent_by counts from.
    began_at: str = field(default_factory=now_iso)
    finalizing: bool = False      # in the final stage: nothing kept back

    def spent_s(self) -> float:
        return self.stored_s + (self.clock() - self.began)

    def left_s(self) -> float:
        return self.total_s - self.spent_s()

    def reserve(self, prices: list[float]) -> float:
        """What to keep back for the finals' processes of `prices`: those the budget left can
        pay for, at most half the budget. One it cannot pay for would keep back what it never
        buys: under a loaded CPU a reference priced from a slow first process (200 s at a batch
        the ladder did not reach) kept half a 3-minute budget from exploring, and the finals
        could not buy it either."""
        left = self.left_s()
        return min(sum(p for p in prices if p <= left), self.total_s / 2)

    def count(self, record: Record, run_id: str | None) -> None:
        """A stored measurement the tune uses costs what it took, once."""
        key = (record.setup.key(), record.repeat)
        if record.run_id != run_id and key not in self.counted:
            self.stored_s += record.wall_s or 0.0
            self.counted.add(key)


def spent_by(records: list[Record]) -> float:
    """What earlier invocations of a tune spent, from their records: each invocation (run_id)
    from its budget's start (`search.began_at`; else its first measurement's start) to its last
    measurement's end, where the records say when, and never less than their wall times. Their
    wall times alone leave out the invocation's own time between measurements (the process
    server's start, the search itself): a tune run to its end and started again found seconds
    it had already spent, and measured more (a 60 s tune on a loaded CPU: 47.6 s of wall times
    in a 53.0 s span); the span alone, its time before the first measurement (0.5 s beside busy
    loops)."""
    spent = 0.0
    for run in dict.fromkeys(r.run_id for r in records):
        mine = [r for r in records if r.run_id == run]
        walls = sum(r.wall_s or 0.0 for r in mine)
        try:
            began = [_moment(r.started_at) for r in mine] + \
                [_moment(b) for r in mine if (b := (r.search or {}).get("began_at"))]
            span = max(_moment(r.finished_at) for r in mine) - min(began)
        except (AttributeError, TypeError, ValueError):  # without its times: its walls alone
            span = 0.0
        spent += max(walls, span)
    return spent


def _moment(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Candidate:
    """A setup not measured yet, and what the tune thinks of it: the measured setup it is
    closest to, the gain of the changes from there, its price; `reason` when it is not worth
    measuring now (pruned, too dear, would not fit)."""

    setup: Setup
    parent: Setup | None = None
    parent_rate: float = 0.0
    gain: Gain | None = None
    price: Price | None = None
    value: float = 0.0
    reason: str | None = None
    why: str | None = None      # pruned, budget, memory, failed or blocks

    @property
    def per_second(self) -> float:
        return self.value / max(self.price.total, 1.0) if self.price else 0.0


def expected_gain(parent: float, lo: float, hi: float, best: float) -> float:
    """The tokens/s a candidate is expected to add over `best`, its rate taken to land
    anywhere (uniformly) between parent x lo and parent x hi."""
    a, b = parent * lo, parent * hi
    if b <= best:
        return 0.0
    if b - a < 1e-9:
        return b - best
    if a >= best:
        return (a + b) / 2 - best
    return (b - best) ** 2 / (2 * (b - a))


def why_ended(candidates: list[Candidate], left_s: float, kept_s: float) -> str:
    """Why the search stopped exploring with `candidates` left, in one line: the budget left
    (`kept_s` of it kept back for the finals) and what the cheapest candidate it could not pay
    for takes, or that none was worth a process."""
    dear = [c for c in candidates if c.why == "budget"]
    if not dear:
        return ("it stopped exploring as no candidate left could gain: each was measured, "
                "could not beat the best so far, would not fit, or changes to what failed")
    cheapest = min(dear, key=lambda c: c.price.total)
    return (f"it stopped exploring with {left_s:.0f} s of the budget left"
            + (f", {max(left_s - kept_s, 0):.0f} s beside the {kept_s:.0f} s kept for the "
               "finals" if kept_s else "")
            + f": the cheapest candidate left, {label(cheapest.setup)}, takes about "
            f"{cheapest.price.total:.0f} s")
